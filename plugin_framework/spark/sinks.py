"""Ready-made foreachBatch functions, idempotent by batch id: delivering a batch again
(after a crash, with the same id and rows) leaves the same result as delivering it once.

- ``ChangeLogWriter(path)`` (changelog.py): appends every change to Parquet.
- ``TableSink``: the frame of the sinks that keep each table's current state,
  ``TableStateWriter(path)`` (statefiles.py, Parquet), ``DeltaTableWriter`` (delta.py) and
  ``HistoryWriter`` (history.py).

The helpers the state sinks share (statefiles.py, delta.py, history.py): the batch's rows by
table (``batch_rows``), their net changes typed (``net_arrow``, ``net_frame``), unchanged
TOAST values filled in (``fill_rows`` in Arrow, ``fill_from`` in Spark), a state merged in
Spark (``merge_state``, for ALTER TABLE).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.changelog import OtherQueryError, query_of
from plugin_framework.spark.changes.rows import TableRows, batch_rows
from plugin_framework.spark.columns.arrowtyped import Decline, typed_net
from plugin_framework.spark.columns.descriptions import SchemaChangeError, TableInfo, rows_info
from plugin_framework.spark.columns.tables import typed_values
from plugin_framework.spark.columns.types import column
from plugin_framework.spark.netchange import NetChanges, net_changes

__all__ = ["TableSink", "state_path"]

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

_SPARK_METADATA = "SPARK::metadata::json"  # a field's metadata, as Spark's toArrow writes it


# --- the current state of the tables ---------------------------------------------------------


def state_path(path: str, table: str) -> str:
    """Where the state sinks under ``path`` keep ``schema.table``."""
    schema, _, name = table.partition(".")
    return "/".join([path.rstrip("/"), schema, name])


class TableSink:
    """The frame of the sinks that keep each table's current state: ``fn(batch_df,
    batch_id)`` collects the batch once, then applies each table's change rows (in
    ``(commit_lsn, seq)`` order) with ``apply``."""

    def __init__(self, path: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None) -> None:
        """``tables``: only these (``schema.table``); ``on_table(table, batch_id)`` is called
        after each table's new state is in place. ``keys``: the primary key of tables
        (``schema.table`` -> its columns; empty: the table has none) whose change rows mark
        every column as the key (REPLICA IDENTITY FULL; a key of every column): they are
        keyed by it, rather than held as a multiset of rows (``counted``). Other tables are
        keyed by their replica identity, as the stream sends it."""
        self.path = path
        self.tables = None if tables is None else set(tables)
        self.on_table = on_table
        self.keys = dict(keys or {})
        self._warned: set[str] = set()
        self.query: str | None = None  # the streaming query of the batch being applied

    def __call__(self, df: Any, batch_id: int) -> None:
        spark = df.sparkSession
        self.query = query_of(df)
        for (schema, table), rows in sorted(batch_rows(df).items()):
            info = self.keyed(rows_info(schema, table, rows))
            if self.tables is not None and info.qualified_name not in self.tables:
                continue
            name = info.qualified_name
            if counted(info) and name not in self.keys and name not in self._warned \
                    and _has_snapshot_rows(rows):
                self._warned.add(name)
                log.warning("%s is keyed by every column and gets snapshot rows: its equal "
                            "rows are counted, and a snapshot taken while the stream runs "
                            "may send a row the stream delivered already, which is then "
                            "counted twice. If the table has a primary key, give it in keys "
                            "(-o keys; pgdecode mirror does); if it has none, say so with "
                            "an empty key", name)
            self.apply(spark, rows, info, batch_id)
            if self.on_table is not None:
                self.on_table(info.qualified_name, batch_id)

    def apply(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
              batch_id: int) -> None:
        raise NotImplementedError

    def held_already(self, table: str, held: int, by: str | None, batch_id: int) -> None:
        """Table ``table`` of the target holds batches up to ``held`` (>= ``batch_id``),
        written by query ``by``: the batch is skipped, if it is of that query. A batch of
        another query (a new checkpoint numbers its batches from 0 again) is refused."""
        if by is None or self.query is None or by == self.query:
            return
        raise OtherQueryError(
            f"{self.path}: {table} holds batches up to {held} of another streaming query "
            f"({by}); this query ({self.query}) numbers its batches from 0 again, so its "
            f"batch {batch_id} would be taken for one the target holds and skipped. Give "
            "this query a target path of its own (or remove the target's table to mirror it "
            "again from this query)")

    def keyed(self, info: TableInfo) -> TableInfo:
        """``info`` with the key ``keys`` gives it, where its rows mark every column. A key
        naming a column the batch's rows do not have (a key added to the table after these
        changes) is not used: the batch is counted, and a warning says so."""
        key = self.keys.get(info.qualified_name)
        if key is None or len(key_names(info)) != len(info.columns):
            return info
        names = [name for name, _, _ in info.columns]
        unknown = [k for k in key if k not in names]
        if unknown:
            log.warning("%s: the key given for it (%s) names %s, which this batch's rows do "
                        "not have (%s): its equal rows are counted instead", info.qualified_name,
                        ", ".join(key), ", ".join(unknown), ", ".join(names))
            return info
        return dataclasses.replace(info, primary=bool(key), columns=tuple(
            (name, pg, not key or name in key) for name, pg, _ in info.columns))


def _has_snapshot_rows(rows: Sequence[dict[str, Any]]) -> bool:
    import pyarrow.compute as pc

    if isinstance(rows, TableRows):
        return bool(pc.any(pc.equal(rows.arrow.column("op"), "SNAPSHOT")).as_py())
    return any(r["op"] == "SNAPSHOT" for r in rows)


def net_frame(spark: Any, net: NetChanges, info: TableInfo) -> Any:
    """The net changes as a typed DataFrame: the table's columns (the row to put, or the key
    that goes), ``_deleted``, ``_fill`` (the columns to take from the target's row under
    the key ``_o_<key>``), ``_commit_lsn``, ``_lsn`` and ``_copies``."""
    from pyspark.sql import functions as F

    return typed_puts(spark, net.table, info, F.col("deleted").alias("_deleted"),
                      F.col("commit_lsn").alias("_commit_lsn"), F.col("lsn").alias("_lsn"),
                      F.col("copies").alias("_copies"))


def net_of(rows: Sequence[dict[str, Any]], info: TableInfo) -> NetChanges:
    """``netchange.net_changes`` of a table's rows, counted where the table is keyed by
    every column (``counted``)."""
    return net_changes(rows, key_names(info), counted=counted(info))


def counted(info: TableInfo) -> bool:
    """Whether the mirrors hold the table as a multiset: its key is every column
    (REPLICA IDENTITY FULL, none, or a key of every column), so equal rows can only be
    counted (netchange.counted_net)."""
    return not info.primary and len(key_names(info)) == len(info.columns)


def net_arrow(spark: Any, net: NetChanges, info: TableInfo) -> pa.Table:
    """``net_frame``'s rows as an Arrow table, typed in Python (arrowtyped.py, no Spark job)
    unless a value is in a form only Spark's expressions are known to take as they do."""
    try:
        return typed_net(net.table, [(name, pg) for name, pg, _ in info.columns],
                         key_names(info))
    except Decline as exc:
        log.debug("%s: typed by Spark (%s)", info.qualified_name, exc)
        return net_frame(spark, net, info).toArrow()


def state_rows(changes: pa.Table, info: TableInfo) -> pa.Table:
    """``merge_state`` of a table with no rows before the batch, in Arrow: ``net_arrow``'s
    rows put, with each column's PostgreSQL type in its field metadata as Spark's toArrow
    gives it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = [name for name, _, _ in info.columns]
    types = {name: pg for name, pg, _ in info.columns}
    kept = changes.filter(pc.invert(changes.column("_deleted")))
    if kept.num_rows and pc.max(kept.column("_copies")).as_py() > 1:  # equal rows, counted
        copies = kept.column("_copies").to_pylist()
        kept = kept.take(pa.array([i for i, n in enumerate(copies) for _ in range(n)],
                                  pa.int64()))
    fields = [kept.schema.field(n).with_metadata(
        {_SPARK_METADATA: json.dumps({"pg_type": types[n]})}) for n in names]
    schema = pa.schema([*fields, kept.schema.field("_commit_lsn"), kept.schema.field("_lsn")])
    return kept.select([*names, "_commit_lsn", "_lsn"]).cast(schema)


def staying(base: pa.Table, changes: pa.Table, info: TableInfo) -> pa.Array:
    """Which rows of ``base`` (a target's, of a ``counted`` table) stay when ``changes``
    (its typed net changes) take their copies away: of equal rows, the first go. A copy the
    target does not have is not taken (as a key the target does not have)."""
    import pyarrow as pa

    names = key_names(info)
    gone: dict[tuple[Any, ...], int] = {}
    for key, deleted, copies in zip(key_tuples(changes, names),
                                    changes.column("_deleted").to_pylist(),
                                    changes.column("_copies").to_pylist(), strict=True):
        if deleted:
            gone[key] = gone.get(key, 0) + copies
    keep = []
    for key in key_tuples(base, names):
        left = gone.get(key, 0)
        if left:
            gone[key] = left - 1
        keep.append(not left)
    return pa.array(keep, pa.bool_())


def typed_puts(spark: Any, table: pa.Table, info: TableInfo, *extra: Any) -> Any:
    """Rows of netchange's ``put_columns`` (``table``) as a typed DataFrame: the table's
    columns, ``_fill`` and ``_o_<key>`` (for fill_from), then the ``extra`` columns."""
    from pyspark.sql import functions as F

    columns = [(name, pg) for name, pg, _ in info.columns]
    types = dict(columns)
    return spark.createDataFrame(table).select(
        *typed_values(F.col("row"), F.col("row_json"), columns), F.col("fill").alias("_fill"),
        *typed_values(F.col("origin"), F.col("origin_json"),
                      [(k, types[k]) for k in key_names(info)], prefix="_o_"),
        *extra)


def key_names(info: TableInfo) -> list[str]:
    """The columns a table's rows are keyed by in a mirror: the replica identity, else all."""
    return list(info.key_columns) or [name for name, _, _ in info.columns]


def same_keys(keys: Sequence[str], left: str, right: str) -> Any:
    """The join condition of two key column sets (``<prefix><key>``), NULLs equal."""
    from functools import reduce

    return reduce(lambda a, b: a & b,
                  [column(f"{left}{k}").eqNullSafe(column(f"{right}{k}")) for k in keys])


def fill_from(changes: Any, filled: Sequence[str], info: TableInfo, base: Any) -> Any:
    """``net_frame``'s rows with their unchanged TOAST values (``_fill``, among ``filled``)
    taken from ``base``'s rows (the target's state, with the batch's column names) under
    ``_o_<key>``."""
    from pyspark.sql import functions as F

    if not filled:
        return changes
    keys = key_names(info)
    source = base.select(*[column(k).alias(f"_s_{k}") for k in keys],
                         *[column(c).alias(f"_v_{c}") for c in filled])
    wanting = changes.filter(F.size("_fill") > 0)
    unknown = wanting.join(source.select(*[f"_s_{k}" for k in keys]),
                           same_keys(keys, "_o_", "_s_"), "left_anti")
    # (a job over keys, in the batches with fills)
    found = unknown.agg(F.count(F.lit(1)).alias("rows"),
                        F.array_distinct(F.flatten(F.collect_list("_fill"))).alias("columns")
                        ).first()
    if found is not None and found["rows"]:
        report_unknown_toast(info, found["rows"], found["columns"])
    out = changes.join(source, same_keys(keys, "_o_", "_s_"), "left")
    for c in filled:
        out = out.withColumn(c, F.when(F.array_contains("_fill", c), column(f"_v_{c}"))
                             .otherwise(column(c)))
    return out.select(*[column(c) for c in changes.columns])


def fill_rows(changes: pa.Table, filled: Sequence[str], info: TableInfo,
              base: pa.Table) -> pa.Table:
    """``fill_from`` in Arrow: ``net_arrow``'s rows with the columns each lists in ``_fill``
    taken from ``base``'s row (the target's, in the batch's types) under its ``_o_<key>``
    (NULL where there is none, as fill_from's outer join gives)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = key_names(info)
    fills = changes.column("_fill").to_pylist()
    where = {key: j for j, key in enumerate(key_tuples(base, keys))}
    origin_keys = key_tuples(changes, [f"_o_{k}" for k in keys])
    source: list[int | None] = [where.get(origin_keys[i]) if fill else None
                                for i, fill in enumerate(fills)]
    unknown = [fill for i, fill in enumerate(fills) if fill and source[i] is None]
    if unknown:
        report_unknown_toast(info, len(unknown), [c for fill in unknown for c in fill])
    out = changes
    for name in filled:
        mask = pa.array([name in (fill or ()) for fill in fills])
        taken = base.column(name).take(pa.array(source, pa.int64())).cast(
            changes.schema.field(name).type)
        position = out.schema.get_field_index(name)
        out = out.set_column(position, name, pc.if_else(mask, taken, out.column(name)))
    return out


def no_fills(changes: pa.Table, info: TableInfo) -> pa.Table:
    """``changes`` (net_arrow's, or a history's versions) applied to no rows of the target
    (its first batch, or one that truncates it): the values that its ``_fill`` lists are
    unknown, reported as fill_rows reports them."""
    fills = [fill for fill in changes.column("_fill").to_pylist() if fill]
    if fills:
        report_unknown_toast(info, len(fills), [c for fill in fills for c in fill])
    return changes


def report_unknown_toast(info: TableInfo, rows: int, columns: Sequence[str]) -> None:
    """The policy for unchanged TOAST values that neither the batch nor the target holds (a
    row the target never had: a mirror started without a snapshot, or a row an incremental
    snapshot has not copied yet): written as NULL, and said so, per table and batch."""
    log.warning(
        "%s: %d row(s) of this batch left TOAST values unchanged (%s) that neither the batch "
        "nor the target holds: written as NULL until a change sets them. Start the mirror "
        "with a snapshot (snapshot=\"initial\"), or set REPLICA IDENTITY FULL on the table "
        "(docs/spark.md, Limits)", info.qualified_name, rows,
        ", ".join(dict.fromkeys(columns)))


def first_rows(rows: pa.Table, names: Sequence[str]) -> dict[tuple[Any, ...], int]:
    """Each key (``key_tuples``) of ``rows`` with the index of its first row."""
    first: dict[tuple[Any, ...], int] = {}
    for i, key in enumerate(key_tuples(rows, names)):
        first.setdefault(key, i)
    return first


def key_tuples(rows: pa.Table, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """Each row's values of columns ``names``, comparable across the batch's types and a
    target's (timestamps as UTC microseconds, dates as days, lists as tuples; NULLs equal,
    as fill_from's join takes them)."""
    import pyarrow as pa

    columns = []
    for name in names:
        values = _comparable(rows.column(name)).to_pylist()
        dtype = rows.schema.field(name).type
        columns.append([_hashable(v) for v in values]
                       if pa.types.is_nested(dtype) or pa.types.is_floating(dtype) else values)
    return list(zip(*columns, strict=True)) if columns else [()] * rows.num_rows


def _hashable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"  # equal to every NaN, as PostgreSQL's float equality has it
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _comparable(values: pa.ChunkedArray) -> pa.ChunkedArray:
    import pyarrow as pa

    t = values.type
    if pa.types.is_timestamp(t):
        return values.cast(pa.timestamp(t.unit, "UTC") if t.tz else t).cast(pa.int64())
    if pa.types.is_date32(t):
        return values.cast(pa.int32())
    return values


def merge_state(spark: Any, net: NetChanges, info: TableInfo, existing: Any | None,
                renamed: dict[str, str | None] | None = None) -> Any:
    """The table's state after a batch: ``existing`` (or nothing) with the batch's net
    changes (netchange.py) applied: the rows of the keys it touched replaced or removed,
    unchanged TOAST values taken from the existing rows they began with, the other rows as
    they were (their ``_commit_lsn`` included). ``renamed``: the existing columns' names in
    the batch's description (schemas.py; None: the same names)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    names = [name for name, _, _ in info.columns]
    types = {name: pg for name, pg, _ in info.columns}
    changes = net_frame(spark, net, info)
    out = [*[column(n).alias(n, metadata={"pg_type": types[n]}) for n in names],
           F.col("_commit_lsn"), F.col("_lsn")]
    if counted(info):  # equal rows: counted in Arrow, as the sinks' batches are
        typed = changes.toArrow()
        rows = state_rows(typed, info)
        if existing is not None and not net.truncated:
            target = conform(existing, info, renamed, changes.schema,
                             [("_commit_lsn", "bigint"), ("_lsn", "bigint")]
                             ).select(*out).toArrow()
            target = target.filter(staying(target, typed, info)).cast(rows.schema)
            rows = pa.concat_tables([target, rows])
        return spark.createDataFrame(rows).select(*out)
    if existing is None or net.truncated:
        return changes.filter(~F.col("_deleted")).select(*out)

    base = conform(existing, info, renamed, changes.schema,
                   [("_commit_lsn", "bigint"), ("_lsn", "bigint")])
    keys = key_names(info)
    touched = changes.select(*[column(k).alias(f"_t_{k}") for k in keys])
    kept = base.join(touched, same_keys(keys, "", "_t_"), "left_anti")
    puts = fill_from(changes, net.fills, info, base).filter(~F.col("_deleted"))
    return kept.select(*out).unionByName(puts.select(*out))


def conform(existing: Any, info: TableInfo, renamed: dict[str, str | None] | None,
            schema: Any, meta: Sequence[tuple[str, str]]) -> Any:
    """A target's rows under the batch's description (``info``): columns renamed
    (``renamed``, as for merge_state), cast to their type in ``schema`` (refused if a value
    does not cast), added ones NULL; then the ``meta`` columns (name, Spark type) as they
    were, NULL where the target has none."""
    from pyspark.sql import functions as F

    names = [name for name, _, _ in info.columns]
    was = {n: n for n in names if n in existing.columns} if renamed is None else \
        {new: old for old, new in renamed.items() if new is not None}
    return existing.select(
        *[_cast_column(existing, info.qualified_name, was[n], n, schema[n].dataType)
          if n in was else F.lit(None).cast(schema[n].dataType).alias(n) for n in names],
        *[(column(m) if m in existing.columns else F.lit(None)).cast(t).alias(m)
          for m, t in meta])


def _cast_column(existing: Any, table: str, old: str, new: str, dtype: Any) -> Any:
    """An existing column under its new name and type.

    ALTER COLUMN ... TYPE rewrites the source table without decoding a row of it, so the
    mirror converts the values it holds itself: with Spark's cast, taken only where each
    value casts back to itself. Elsewhere PostgreSQL's conversion may give another value
    (it rounds the numerics that Spark truncates, and parses text its own way), so such a
    change is refused, naming a value; so is one Spark has no cast for."""
    from pyspark.errors import AnalysisException

    source = existing.schema[old].dataType
    value = column(old)
    if source == dtype:
        return value.alias(new)
    try:
        back = value.try_cast(dtype).try_cast(source)
        lost = existing.filter(value.isNotNull() & ~back.eqNullSafe(value))
        found = lost.select(value).limit(1).collect()
    except AnalysisException as e:
        raise SchemaChangeError(
            f"{table}: column {new} is now of Spark type {dtype.simpleString()}, which Spark "
            f"has no cast to from the mirror's {source.simpleString()} column {old}: "
            "rebuild the mirror of this table (a new snapshot)") from e
    if found:
        raise SchemaChangeError(
            f"{table}: column {new} is now of Spark type {dtype.simpleString()}, and the "
            f"mirror's {source.simpleString()} column {old} holds values that do not convert "
            f"to it and back, such as {found[0][0]!r} (PostgreSQL's conversion may differ "
            "from Spark's there): rebuild the mirror of this table (a new snapshot)")
    return value.cast(dtype).alias(new)
