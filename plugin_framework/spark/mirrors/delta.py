"""``DeltaTableWriter(path)``: each table's current state as a Delta Lake table at
``path/<schema>/<table>`` (``state_path``), written with the ``deltalake`` package (delta-rs,
no JVM jars), readable by Spark with Delta, deltalake, DuckDB and polars.

Per batch and table, one Delta commit applies the batch's net changes (netchange.py, the same
as ``TableStateWriter``'s):

- usually a MERGE on the key (the replica identity; every column for tables without one): the
  rows the batch put are updated or inserted, the keys it took away deleted, the other rows
  not rewritten beyond the files that hold touched keys; unchanged TOAST values come from the
  target's rows where their chain of key changes began (read by key before the merge);
- after a TRUNCATE in the batch, an overwrite with the rows put after it;
- when the table's description changed (ALTER TABLE; schemas.py: renamed columns keep their
  values, added ones are NULL in older rows, dropped ones go, retyped ones are cast or
  refused), an overwrite of data and schema, which reads the whole table into Spark.

The batch's rows are typed in the driver, in Python (arrowtyped.py, proven equal to
``split_tables``' Spark expressions), and merged from Arrow: no Spark job, but for a table
whose values arrowtyped declines (typed by Spark) and for an ALTER TABLE.

Each commit records the batch id as the table's application transaction version (Delta's
``txn`` action, app id ``pgdecode`` unless told otherwise): a table whose version is the batch
id or later has the batch already, so a batch delivered again after a crash applies only to
the tables it had not reached. Each commit also records the PostgreSQL description of the
columns (commit info ``pgdecode.description``), so that the next batch knows what changed.
Columns: the table's, in ``split_tables``' types, then ``_commit_lsn`` and ``_lsn`` of the
change that wrote the row. Small files accumulate, one set per batch: compact them now and
then (``DeltaTable(path).optimize.compact()``, then ``vacuum``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from plugin_framework.spark.columns.descriptions import TableInfo, describe_rows
from plugin_framework.spark.mirrors.deltatables import (
    APP,
    APP_ID,
    DESCRIPTION,
    QUERY,
    delta_arrow,
    fill_arrow,
    keys_match,
    query_of_app,
    quote,
    stored_description,
    target_rows,
    utc_table,
)
from plugin_framework.spark.mirrors.keys import counted, first_rows, key_names, key_tuples, staying
from plugin_framework.spark.mirrors.staterows import merge_state, state_rows
from plugin_framework.spark.mirrors.template import TableSink, state_path
from plugin_framework.spark.mirrors.toast import no_fills
from plugin_framework.spark.mirrors.typed import net_arrow, net_of

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DeltaSink", "DeltaTableWriter", "Pending"]

_DELETED = "_pgdecode_deleted"


@dataclass
class Pending:
    """A batch's changes of one table, ready for a Delta commit."""

    target: str  # the table's path
    table: Any | None  # its DeltaTable (None: not written yet)
    renamed: dict[str, str | None] | None  # stored column names -> the batch's (schemas.py)
    commit: Any  # CommitProperties: the batch id and the description
    redescribed: bool  # the description changed since the last commit (ALTER TABLE)


class DeltaSink(TableSink):
    """The frame of the sinks that keep Delta tables at ``path/<schema>/<table>``."""

    def __init__(self, path: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None, app_id: str = APP_ID,
                 storage_options: dict[str, str] | None = None) -> None:
        """``keys``: as ``TableSink``'s; ``app_id``: the Delta application id the batch ids
        are recorded under (one per stream writing the tables); ``storage_options``:
        deltalake's, for object stores."""
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise ImportError(f"{type(self).__name__} needs the deltalake package: "
                              "pip install 'pgdecode[delta]'") from None
        super().__init__(path, tables, on_table, keys=keys)
        self.app_id = app_id
        self.storage_options = storage_options

    def pending(self, rows: Sequence[dict[str, Any]], info: TableInfo,
                batch_id: int) -> Pending | None:
        """The table's Delta state before the batch (None: it has the batch already); the
        rows renamed to the batch's newest description."""
        from deltalake import CommitProperties, Transaction

        target = state_path(self.path, info.qualified_name)
        table = self._open(target)
        if table is not None:
            done = table.transaction_version(self.app_id)
            if done is not None and done >= batch_id:
                self.held_already(info.qualified_name, done,
                                  query_of_app(table, self.app_id), batch_id)
                return None
        stored = None if table is None else stored_description(table)
        description, renamed = describe_rows(info.qualified_name, rows, stored)
        metadata = {DESCRIPTION: orjson.dumps(description).decode(), APP: self.app_id}
        if self.query is not None:
            metadata[QUERY] = self.query
        commit = CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)],
                                  custom_metadata=metadata)
        return Pending(target, table, renamed, commit,
                       stored is not None and stored != description)

    def overwrite(self, pending: Pending, df: Any) -> None:
        """Replace the table's data and schema with Spark DataFrame ``df``, in one commit."""
        self.overwrite_arrow(pending, df.toArrow())

    def overwrite_arrow(self, pending: Pending, rows: pa.Table) -> None:
        """Replace the table's data and schema with ``rows``, in one commit."""
        from deltalake import write_deltalake

        write_deltalake(pending.target, utc_table(rows), mode="overwrite",
                        schema_mode="overwrite", commit_properties=pending.commit,
                        storage_options=self.storage_options)

    def _open(self, target: str) -> Any | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(target, storage_options=self.storage_options)
        except TableNotFoundError:
            return None


class DeltaTableWriter(DeltaSink):
    """``fn(batch_df, batch_id)`` maintaining each table's current state as a Delta table."""

    def apply(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
              batch_id: int) -> None:
        pending = self.pending(rows, info, batch_id)
        if pending is None:
            return  # applied already
        net = net_of(rows, info)
        table = pending.table
        if table is None or net.truncated:  # no rows before the batch's: its puts
            self.overwrite_arrow(pending, state_rows(no_fills(net_arrow(spark, net, info),
                                                              info), info))
            return
        if pending.redescribed:
            existing = spark.createDataFrame(delta_arrow(table))
            self.overwrite(pending, merge_state(spark, net, info, existing, pending.renamed))
            return
        changes = net_arrow(spark, net, info)
        if counted(info):
            self._merge_counted(pending, changes, info)
            return
        if net.fills:
            changes = fill_arrow(changes, net.fills, info, table)
        names = [name for name, _, _ in info.columns] + ["_commit_lsn", "_lsn"]
        source = utc_table(changes.select([*names, "_deleted"])
                           .rename_columns([*names, _DELETED]))
        sets = {quote(n): f"s.{quote(n)}" for n in names}
        (table.merge(source, keys_match(info), source_alias="s", target_alias="t",
                     commit_properties=pending.commit)
         .when_matched_delete(f"s.{_DELETED}")
         .when_matched_update(sets, predicate=f"NOT s.{_DELETED}")
         .when_not_matched_insert(sets, predicate=f"NOT s.{_DELETED}")
         .execute())

    def _merge_counted(self, pending: Pending, changes: pa.Table, info: TableInfo) -> None:
        """The MERGE of a ``counted`` table's batch: a MERGE cannot take one of two equal
        rows, so every target copy of a row the batch counts goes, and the copies that
        stay go in again, with those the batch adds."""
        import pyarrow as pa
        import pyarrow.compute as pc

        assert pending.table is not None
        keys = key_names(info)
        names = [name for name, _, _ in info.columns] + ["_commit_lsn", "_lsn"]
        target = target_rows(pending.table, changes.column(keys[0]), info)
        first = first_rows(changes, keys)  # a change row of each row counted
        counted_rows = pa.array([key in first for key in key_tuples(target, keys)], pa.bool_())
        stay = target.filter(pc.and_(counted_rows, staying(target, changes, info)))
        parts = [(changes.take(pa.array(list(first.values()), pa.int64())), True),
                 (stay, False), (state_rows(changes, info), False)]
        typed = [utc_table(t.select(names)) for t, _ in parts]
        schema = pa.schema([f.with_nullable(True).remove_metadata() for f in typed[0].schema])
        source = pa.concat_tables(
            [t.cast(schema).append_column(_DELETED, pa.repeat(goes, t.num_rows))
             for t, (_, goes) in zip(typed, parts, strict=True)])
        (pending.table.merge(source, f"s.{_DELETED} AND {keys_match(info)}", source_alias="s",
                             target_alias="t", commit_properties=pending.commit)
         .when_matched_delete()
         .when_not_matched_insert({quote(n): f"s.{quote(n)}" for n in names},
                                  predicate=f"NOT s.{_DELETED}")
         .execute())
