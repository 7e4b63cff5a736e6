"""The rows of a table's state after a batch: from no rows before it, in Arrow
(``state_rows``), or over a target's rows in Spark (``merge_state``, for an ALTER TABLE:
the target's rows under the batch's description, ``conform``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.columns.descriptions import SchemaChangeError, TableInfo
from plugin_framework.spark.columns.types import column
from plugin_framework.spark.mirrors.keys import counted, key_names, same_keys, staying
from plugin_framework.spark.mirrors.netchange import NetChanges
from plugin_framework.spark.mirrors.toast import fill_from
from plugin_framework.spark.mirrors.typed import net_frame

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["conform", "merge_state", "state_rows"]


_SPARK_METADATA = "SPARK::metadata::json"  # a field's metadata, as Spark's toArrow writes it


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


def merge_state(spark: Any, net: NetChanges, info: TableInfo, existing: Any | None,
                renamed: dict[str, str | None] | None = None, lossy: bool = False) -> Any:
    """The table's state after a batch: ``existing`` (or nothing) with the batch's net
    changes (netchange.py) applied: the rows of the keys it touched replaced or removed,
    unchanged TOAST values taken from the existing rows they began with, the other rows as
    they were (their ``_commit_lsn`` included). ``renamed``: the existing columns' names in
    the batch's description (columns/descriptions.py; None: the same names); ``lossy``: as
    ``conform``'s."""
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
                             [("_commit_lsn", "bigint"), ("_lsn", "bigint")], lossy
                             ).select(*out).toArrow()
            target = target.filter(staying(target, typed, info)).cast(rows.schema)
            rows = pa.concat_tables([target, rows])
        return spark.createDataFrame(rows).select(*out)
    if existing is None or net.truncated:
        return changes.filter(~F.col("_deleted")).select(*out)

    base = conform(existing, info, renamed, changes.schema,
                   [("_commit_lsn", "bigint"), ("_lsn", "bigint")], lossy)
    keys = key_names(info)
    touched = changes.select(*[column(k).alias(f"_t_{k}") for k in keys])
    kept = base.join(touched, same_keys(keys, "", "_t_"), "left_anti")
    puts = fill_from(changes, net.fills, info, base).filter(~F.col("_deleted"))
    return kept.select(*out).unionByName(puts.select(*out))


def conform(existing: Any, info: TableInfo, renamed: dict[str, str | None] | None,
            schema: Any, meta: Sequence[tuple[str, str]], lossy: bool = False) -> Any:
    """A target's rows under the batch's description (``info``): columns renamed
    (``renamed``, as for merge_state), cast to their type in ``schema`` (refused if a value
    does not cast, unless ``lossy``: the table is read again, which gives each row the
    server's value, and meanwhile such a value is NULL), added ones NULL; then the ``meta``
    columns (name, Spark type) as they were, NULL where the target has none."""
    from pyspark.sql import functions as F

    names = [name for name, _, _ in info.columns]
    was = {n: n for n in names if n in existing.columns} if renamed is None else \
        {new: old for old, new in renamed.items() if new is not None}
    return existing.select(
        *[_cast_column(existing, info.qualified_name, was[n], n, schema[n].dataType, lossy)
          if n in was else F.lit(None).cast(schema[n].dataType).alias(n) for n in names],
        *[(column(m) if m in existing.columns else F.lit(None)).cast(t).alias(m)
          for m, t in meta])


def _cast_column(existing: Any, table: str, old: str, new: str, dtype: Any,
                 lossy: bool = False) -> Any:
    """An existing column under its new name and type.

    ALTER COLUMN ... TYPE rewrites the source table without decoding a row of it, so the
    mirror converts the values it holds itself: with Spark's cast, taken only where each
    value casts back to itself. Elsewhere PostgreSQL's conversion may give another value
    (it rounds the numerics that Spark truncates, and parses text its own way), so such a
    change is refused, naming a value; so is one Spark has no cast for."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    source = existing.schema[old].dataType
    value = column(old)
    if source == dtype:
        return value.alias(new)
    if lossy:  # until the table's rows come again from the server
        try:
            existing.select(value.try_cast(dtype)).schema  # noqa: B018  (Spark checks it)
        except AnalysisException:
            return F.lit(None).cast(dtype).alias(new)
        return value.try_cast(dtype).alias(new)
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
