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
- when the table's description changed (ALTER TABLE; columns/descriptions.py: renamed
  columns keep their values, added ones are NULL in older rows, dropped ones go, retyped
  ones are cast or refused), an overwrite of data and schema, which reads the whole table
  into Spark.

Those steps are ``TableSink``'s (template.py); ``DeltaSink`` is its hooks for Delta tables
(read by key through deltatables.py, committed with the batch id as the transaction
version), and ``DeltaTableWriter``'s ``merge`` the MERGE.

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

from plugin_framework.spark.columns.descriptions import Description, TableInfo
from plugin_framework.spark.mirrors.deltatables import (
    APP,
    APP_ID,
    CONSISTENT,
    DESCRIPTION,
    QUERY,
    delta_arrow,
    keys_match,
    query_of_app,
    quote,
    stored_description,
    target_rows,
    utc_table,
)
from plugin_framework.spark.mirrors.keys import counted, first_rows, key_names, key_tuples, staying
from plugin_framework.spark.mirrors.staterows import state_rows
from plugin_framework.spark.mirrors.template import TableBatch, TableSink, state_path

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DeltaSink", "DeltaTableWriter", "DeltaTarget"]

_DELETED = "_pgdecode_deleted"


@dataclass
class DeltaTarget:
    """A table's Delta table, as the Delta mirrors' hooks see it."""

    path: str
    table: Any | None  # its DeltaTable (None: not written yet)


class DeltaSink(TableSink):
    """The hooks of the mirrors that keep Delta tables at ``path/<schema>/<table>``: each
    commit records the batch id as the table's application transaction version, and the
    description and the query in its commit info."""

    def __init__(self, path: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None,
                 no_reread: Sequence[str] = (), app_id: str = APP_ID,
                 storage_options: dict[str, str] | None = None) -> None:
        """``keys``: as ``TableSink``'s; ``app_id``: the Delta application id the batch ids
        are recorded under (one per stream writing the tables); ``storage_options``:
        deltalake's, for object stores."""
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise ImportError(f"{type(self).__name__} needs the deltalake package: "
                              "pip install 'pgdecode[delta]'") from None
        super().__init__(path, tables, on_table, keys=keys, no_reread=no_reread)
        self.app_id = app_id
        self.storage_options = storage_options

    def open(self, info: TableInfo) -> DeltaTarget:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        path = state_path(self.path, info.qualified_name)
        try:
            return DeltaTarget(path, DeltaTable(path, storage_options=self.storage_options))
        except TableNotFoundError:
            return DeltaTarget(path, None)

    def applied(self, target: DeltaTarget, batch_id: int) -> tuple[int, str | None] | None:
        if target.table is None:
            return None
        done = target.table.transaction_version(self.app_id)
        if done is not None and done >= batch_id:
            return done, query_of_app(target.table, self.app_id)
        return None

    def stored_description(self, target: DeltaTarget) -> Description | None:
        return None if target.table is None else stored_description(target.table)

    def holds_rows(self, target: DeltaTarget) -> bool:
        return target.table is not None

    def every_row(self, target: DeltaTarget) -> pa.Table:
        assert target.table is not None
        return delta_arrow(target.table)

    def rows_under(self, target: DeltaTarget, batch: TableBatch, keys: pa.ChunkedArray,
                   changes: pa.Table) -> pa.Table:
        assert target.table is not None
        return target_rows(target.table, keys, batch.info)

    def replace(self, target: DeltaTarget, batch: TableBatch, rows: pa.Table) -> None:
        """The table's data and schema replaced with ``rows``, in one commit."""
        from deltalake import write_deltalake

        write_deltalake(target.path, utc_table(rows), mode="overwrite",
                        schema_mode="overwrite", commit_properties=self.commit_properties(batch),
                        storage_options=self.storage_options)

    def commit_properties(self, batch: TableBatch) -> Any:
        """The ``CommitProperties`` of the table's commit of the batch: the batch id as the
        transaction version of ``app_id``, the description and the query."""
        from deltalake import CommitProperties, Transaction

        metadata = {DESCRIPTION: orjson.dumps(batch.description).decode(), APP: self.app_id}
        if self.query is not None:
            metadata[QUERY] = self.query
        consistent = self.consistent_lsn(batch.info)
        if consistent is not None:
            metadata[CONSISTENT] = str(consistent)
        return CommitProperties(app_transactions=[Transaction(self.app_id, batch.batch_id)],
                                custom_metadata=metadata)


class DeltaTableWriter(DeltaSink):
    """``fn(batch_df, batch_id)`` maintaining each table's current state as a Delta table."""

    def merge(self, target: DeltaTarget, batch: TableBatch, changes: pa.Table,
              base: pa.Table | None) -> None:
        """One MERGE on the key: the rows put updated or inserted, the keys taken away
        deleted."""
        info = batch.info
        table = target.table
        assert table is not None
        if counted(info):
            assert base is not None
            self._merge_counted(target, batch, changes, base)
            return
        names = [name for name, _, _ in info.columns] + ["_commit_lsn", "_lsn"]
        source = utc_table(changes.select([*names, "_deleted"])
                           .rename_columns([*names, _DELETED]))
        sets = {quote(n): f"s.{quote(n)}" for n in names}
        (table.merge(source, keys_match(info), source_alias="s", target_alias="t",
                     commit_properties=self.commit_properties(batch))
         .when_matched_delete(f"s.{_DELETED}")
         .when_matched_update(sets, predicate=f"NOT s.{_DELETED}")
         .when_not_matched_insert(sets, predicate=f"NOT s.{_DELETED}")
         .execute())

    def _merge_counted(self, target: DeltaTarget, batch: TableBatch, changes: pa.Table,
                       rows: pa.Table) -> None:
        """The MERGE of a ``counted`` table's batch (``rows``: the target's under its first
        key column's values): a MERGE cannot take one of two equal rows, so every target
        copy of a row the batch counts goes, and the copies that stay go in again, with
        those the batch adds."""
        import pyarrow as pa
        import pyarrow.compute as pc

        assert target.table is not None
        info = batch.info
        keys = key_names(info)
        names = [name for name, _, _ in info.columns] + ["_commit_lsn", "_lsn"]
        first = first_rows(changes, keys)  # a change row of each row counted
        counted_rows = pa.array([key in first for key in key_tuples(rows, keys)], pa.bool_())
        stay = rows.filter(pc.and_(counted_rows, staying(rows, changes, info)))
        parts = [(changes.take(pa.array(list(first.values()), pa.int64())), True),
                 (stay, False), (state_rows(changes, info), False)]
        typed = [utc_table(t.select(names)) for t, _ in parts]
        schema = pa.schema([f.with_nullable(True).remove_metadata() for f in typed[0].schema])
        source = pa.concat_tables(
            [t.cast(schema).append_column(_DELETED, pa.repeat(goes, t.num_rows))
             for t, (_, goes) in zip(typed, parts, strict=True)])
        (target.table.merge(source, f"s.{_DELETED} AND {keys_match(info)}", source_alias="s",
                            target_alias="t", commit_properties=self.commit_properties(batch))
         .when_matched_delete()
         .when_not_matched_insert({quote(n): f"s.{quote(n)}" for n in names},
                                  predicate=f"NOT s.{_DELETED}")
         .execute())
