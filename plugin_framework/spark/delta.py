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

from plugin_framework.spark.columns.descriptions import Description, TableInfo, describe_rows
from plugin_framework.spark.sinks import (
    TableSink,
    counted,
    fill_rows,
    first_rows,
    key_names,
    key_tuples,
    merge_state,
    net_arrow,
    net_of,
    no_fills,
    state_path,
    state_rows,
    staying,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["APP_ID", "DeltaSink", "DeltaTableWriter", "Pending", "delta_arrow", "delta_dataset",
           "keys_match", "quote", "read_delta", "utc_table"]

APP_ID = "pgdecode"
_DESCRIPTION = "pgdecode.description"
_QUERY = "pgdecode.query"  # the streaming query a commit's batch is of (changelog.query_of)
_APP = "pgdecode.app"  # the app_id whose transaction version the commit set
_DELETED = "_pgdecode_deleted"


def read_delta(path: str, table: str, storage_options: dict[str, str] | None = None) -> Any:
    """The state of ``schema.table`` that ``DeltaTableWriter(path)`` keeps, as a
    ``deltalake.DeltaTable``."""
    from deltalake import DeltaTable

    return DeltaTable(state_path(path, table), storage_options=storage_options)


def delta_dataset(table: Any) -> Any:
    """The rows of ``deltalake.DeltaTable`` ``table`` as a ``pyarrow.dataset.Dataset``:
    ``table.to_pyarrow_dataset()``, which skips files by their statistics. deltalake's
    Python cannot parse a statistic of a date or timestamp before year 1 (it fails on
    ``'-0001-01-01'``), which a mirror may hold; such a table is read whole, by deltalake's
    own query engine (``QueryBuilder``), into memory."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import QueryBuilder

    try:
        return table.to_pyarrow_dataset()
    except ValueError as e:
        try:
            rows = QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()
            return ds.dataset(pa.table(rows).cast(pa.schema(table.schema().to_arrow())))
        except Exception:
            raise e from None


def delta_arrow(table: Any) -> pa.Table:
    """Every row of ``deltalake.DeltaTable`` ``table``, as ``table.to_pyarrow_table()``
    gives them where it can (``delta_dataset``)."""
    return delta_dataset(table).to_table()


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
                                  _query_of_app(table, self.app_id), batch_id)
                return None
        stored = None if table is None else _stored_description(table)
        description, renamed = describe_rows(info.qualified_name, rows, stored)
        metadata = {_DESCRIPTION: orjson.dumps(description).decode(), _APP: self.app_id}
        if self.query is not None:
            metadata[_QUERY] = self.query
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


def keys_match(info: TableInfo) -> str:
    """The MERGE condition of target ``t`` and source ``s`` rows on the table's key."""
    return " AND ".join(f"(t.{quote(k)} IS NOT DISTINCT FROM s.{quote(k)})"
                        for k in key_names(info))


def quote(name: str) -> str:
    """A column name as an SQL identifier of delta-rs's expressions (DataFusion)."""
    return '"' + name.replace('"', '""') + '"'


def _stored_description(table: Any) -> Description | None:
    """The description the table's newest pgdecode commit recorded (other writers' commits,
    such as OPTIMIZE, record none)."""
    commit = _pgdecode_commit(table)
    if commit is None:
        return None
    return tuple((str(n), str(t)) for n, t in orjson.loads(commit[_DESCRIPTION]))


def _query_of_app(table: Any, app_id: str) -> str | None:
    """The streaming query of the table's newest commit by ``app_id`` (the one that set its
    transaction version); None: not recorded."""
    commit = _newest_commit(table, lambda c: c.get(_APP) == app_id)
    query = None if commit is None else commit.get(_QUERY)
    return None if query is None else str(query)


def _pgdecode_commit(table: Any) -> dict[str, Any] | None:
    """The table's newest commit by pgdecode (it records the description), with the custom
    metadata it recorded; None: there is none."""
    return _newest_commit(table, lambda c: c.get(_DESCRIPTION) is not None)


def _newest_commit(table: Any, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The newest commit of the table's history that is ``wanted`` (read from the newest
    back: most often the last commit is it)."""
    for limit in (1, 50, None):
        for commit in table.history(limit):
            if wanted(commit):
                return dict(commit)
    return None


def target_rows(table: Any, origins: pa.ChunkedArray | pa.Array, info: TableInfo, *,
                current: bool = False) -> pa.Table:
    """The rows of Delta table ``table`` whose first key column is among ``origins``:
    a superset of the rows under the keys fills take their values from."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    first = key_names(info)[0]
    dataset = delta_dataset(table)
    if isinstance(origins, pa.ChunkedArray):
        origins = origins.combine_chunks()
    wanted = _utc_array(origins)
    if pa.types.is_nested(wanted.type):  # no unique nor isin for lists: every row may
        where = ds.scalar(True)
    else:
        values = pc.unique(wanted.drop_null()).cast(dataset.schema.field(first).type)
        where = ds.field(first).isin(values)
        if pa.types.is_floating(values.type) and len(values):
            # the MERGE's IS NOT DISTINCT FROM takes NaN for NaN and -0 for 0; isin does not
            if pc.any(pc.is_nan(values)).as_py():
                where = where | pc.is_nan(ds.field(first))
            if pc.any(pc.equal(values, 0)).as_py():
                where = where | (ds.field(first) == 0)
        if wanted.null_count:
            where = where | ds.field(first).is_null()
    if current:  # a history: the current versions
        where = where & ds.field("_is_current")
    return dataset.to_table(filter=where)


def fill_arrow(changes: pa.Table, filled: Sequence[str], info: TableInfo, table: Any, *,
               current: bool = False) -> pa.Table:
    """``fill_rows`` from Delta table ``table``: the rows under the keys fills take their
    values from (``current``: of its rows ``_is_current``, a history)."""
    wanting = [i for i, fill in enumerate(changes.column("_fill").to_pylist()) if fill]
    origins = changes.column(f"_o_{key_names(info)[0]}").take(wanting)
    return fill_rows(changes, filled, info, target_rows(table, origins, info, current=current))


def _utc_type(dtype: pa.DataType) -> pa.DataType:
    """Timestamps with a time zone as UTC (Delta's), in lists too."""
    import pyarrow as pa

    if pa.types.is_timestamp(dtype) and dtype.tz is not None:
        return pa.timestamp(dtype.unit, "UTC")
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        inner = _utc_type(dtype.value_type)
        if inner != dtype.value_type:
            return pa.large_list(inner) if pa.types.is_large_list(dtype) else pa.list_(inner)
    return dtype


def _utc_array(values: pa.Array) -> pa.Array:
    target = _utc_type(values.type)
    return values if target == values.type else values.cast(target)


def utc_table(table: pa.Table) -> pa.Table:
    import pyarrow as pa

    schema = pa.schema([f.with_type(_utc_type(f.type)) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)
