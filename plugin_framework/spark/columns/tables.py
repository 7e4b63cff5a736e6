"""Per-table DataFrames with real column types, from a DataFrame of change rows.

``split_tables(batch_df)`` returns one DataFrame per table of the batch: the change's
metadata (``_op``, ``_lsn``, ``_commit_lsn``, ``_seq``, ``_xid``, ``_commit_time``,
``_origin``, ``_gid``, ``_unchanged_toast``), the old key (``_old_<key column>`` from the
old row where the server sent one: a key change, a DELETE, REPLICA IDENTITY FULL; and
``_has_old``), then the table's columns in their own types. The types come from the
Relation messages (the ``columns`` of each row; the newest description of a table in the
batch wins):

=============================================  =================================
PostgreSQL                                     Spark
=============================================  =================================
smallint, integer, bigint, oid                 short, int, bigint, bigint
real, double precision                         float, double
numeric(p,s) (p <= 38)                         decimal(p,s)
numeric (no typmod, or p > 38)                 string (exact digits)
boolean                                        boolean
bytea                                          binary
date                                           date
timestamp / timestamp with time zone           timestamp_ntz / timestamp
arrays of the types above (one dimension)      array<...>
everything else (text, uuid, json, enums ...)  string, the server's text
=============================================  =================================

Values that do not fit the Spark type (``infinity`` dates and timestamps, NaN in a
``numeric(p,s)``, a multi-dimensional array) become NULL. Dates and timestamps before year 1
(BC) are kept. An INSERT or UPDATE row carries the
new values; a DELETE row carries the old key (every column under REPLICA IDENTITY FULL) and
NULL elsewhere; a TRUNCATE row only metadata. Unchanged TOAST columns are NULL and named in
``_unchanged_toast``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugin_framework.spark.columns.descriptions import TableInfo, align_names, table_infos
from plugin_framework.spark.columns.types import spark_type

__all__ = ["split_tables", "typed_changes", "typed_values"]

META_COLUMNS = ("_op", "_lsn", "_commit_lsn", "_seq", "_xid", "_commit_time", "_origin", "_gid",
                "_unchanged_toast")


def _from_text(text: Any, dtype: Any, *, hex_prefix: bool = True) -> Any:
    """A string expression (the server's text, or an array element's JSON text) as ``dtype``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return text
    if isinstance(dtype, T.BinaryType):
        if hex_prefix:
            return F.when(text.startswith("\\x"), F.unhex(F.substring(text, 3, 1 << 30)))
        return F.unhex(text)  # the json emitter's hex, in arrays
    if isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType):
        text = _astronomical(text)
    return text.try_cast(dtype)


_BC = r"^(\d+)-(.*) BC$"


def _astronomical(text: Any) -> Any:
    """PostgreSQL's text of a date or timestamp before year 1 ("0044-03-15 BC") as Spark
    reads such years: astronomical, with a sign ("-0043-03-15"; 1 BC is year 0000). Both
    count days in the proleptic Gregorian calendar."""
    from pyspark.sql import functions as F

    year = 1 - F.regexp_extract(text, _BC, 1).cast("int")
    signed = F.when(year == 0, F.lit("0000")).otherwise(
        F.concat(F.lit("-"), F.lpad((-year).cast("string"), 4, "0")))
    return F.when(text.endswith(" BC"),
                  F.concat(signed, F.lit("-"), F.regexp_extract(text, _BC, 2))).otherwise(text)


def _element_converter(dtype: Any) -> Any:
    def convert(element: Any) -> Any:  # one argument: transform passes the index to two
        return _from_text(element, dtype, hex_prefix=False)

    return convert


def typed_values(row_map: Any, row_json: Any, columns: Sequence[tuple[str, str]],
            prefix: str = "") -> list[Any]:
    """Typed column expressions: scalars from the text map, arrays from the typed JSON (each
    element's JSON text converted as a scalar's text would be)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    types = [(name, spark_type(pg)) for name, pg in columns]
    arrays = [name for name, t in types if isinstance(t, T.ArrayType)]
    raw = None
    if arrays:
        # each array column's JSON text, parsed on its own so that one bad value spoils nothing
        raw = F.from_json(row_json, T.StructType([T.StructField(n, T.StringType())
                                                  for n in arrays]))
    text_array = T.ArrayType(T.StringType())
    out = []
    for name, dtype in types:
        if isinstance(dtype, T.ArrayType):
            assert raw is not None
            text = raw.getField(name)
            converted = F.transform(F.from_json(text, text_array),
                                    _element_converter(dtype.elementType))
            # a multi-dimensional array does not fit: NULL rather than a wrong value
            expr = F.when(F.ltrim(text).startswith("[["), F.lit(None)).otherwise(converted)
        else:
            expr = _from_text(row_map.getItem(name), dtype)
        out.append(expr.alias(prefix + name))
    return out


def typed_changes(df: Any, info: TableInfo, *, old_columns: Sequence[str] = ()) -> Any:
    """The changes of one table as a typed DataFrame; ``old_columns`` adds ``_old_<name>``
    columns typed from the old row, and ``_has_old`` (the old row was sent), after the
    metadata."""
    from pyspark.sql import functions as F

    rows = align_names(df.filter((F.col("schema") == info.schema)
                                 & (F.col("table") == info.table)), info)
    is_delete = F.col("op") == "DELETE"
    row_map = F.when(is_delete, F.col("before")).otherwise(F.col("after"))
    row_json = F.when(is_delete, F.col("before_json")).otherwise(F.col("after_json"))
    columns = [(name, pg) for name, pg, _ in info.columns]
    meta = [F.col("op").alias("_op"), F.col("lsn").alias("_lsn"),
            F.col("commit_lsn").alias("_commit_lsn"), F.col("seq").alias("_seq"),
            F.col("xid").alias("_xid"), F.col("commit_time").alias("_commit_time"),
            F.col("origin").alias("_origin"), F.col("gid").alias("_gid"),
            F.col("unchanged_toast").alias("_unchanged_toast")]
    exprs = meta
    if old_columns:
        types = dict(columns)
        exprs += typed_values(F.col("before"), F.col("before_json"),
                              [(n, types[n]) for n in old_columns], prefix="_old_")
        exprs.append(F.col("before").isNotNull().alias("_has_old"))
    return rows.select(*exprs, *typed_values(row_map, row_json, columns))


def split_tables(df: Any, infos: Sequence[TableInfo] | None = None) -> dict[str, Any]:
    """``{"schema.table": typed DataFrame}`` for every table of a batch of changes."""
    if infos is None:
        infos = table_infos(df)
    return {info.qualified_name: typed_changes(df, info, old_columns=info.key_columns)
            for info in infos}
