"""The change schema shared by the ``spark`` emitter and the ``pgoutput`` data source.

One row per change (a TRUNCATE gives one row per truncated table):

==================  ================================  =========================================
column              type                              meaning
==================  ================================  =========================================
lsn                 bigint                            the change's WAL position
commit_lsn          bigint                            its transaction's commit (COMMIT PREPARED)
                                                      record
seq                 int                               position of the change in its transaction
xid                 bigint                            transaction id (NULL for snapshot rows)
commit_time         timestamp                         commit time (a snapshot's read time)
op                  string                            INSERT, UPDATE, DELETE, TRUNCATE, or
                                                      SNAPSHOT: a row of a snapshot
                                                      (docs/snapshot.md), an upsert
schema, table       string                            the table
key                 map<string,string>                replica identity key of the row after the
                                                      change (before it, for a DELETE), as text
before, after       map<string,string>                the old and new row as the server's text
                                                      (before: key columns only unless REPLICA
                                                      IDENTITY FULL); NULL where not sent
before_json,        string                            the same rows as JSON objects of typed
after_json                                            values (the json emitter's conversions)
unchanged_toast     array<string>                     columns of ``after`` whose unchanged TOAST
                                                      value the server did not send
columns             array<struct<name, type,          the table's columns as its last Relation
                    type_oid, key>>                   message described them (type as
                                                      format_type prints it)
origin              string                            replication origin, if any
gid                 string                            the gid of a prepared transaction
==================  ================================  =========================================

LSNs are bigints so that they sort; ``lsn_text`` turns one into PostgreSQL's ``X/X`` form.
Changes are ordered by ``(commit_lsn, seq)``, the order a subscriber applies them in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql.types import StructType

__all__ = ["CHANGE_COLUMNS", "arrow_schema", "change_schema", "lsn_text"]

CHANGE_COLUMNS: Final = (
    "lsn", "commit_lsn", "seq", "xid", "commit_time", "op", "schema", "table", "key", "before",
    "after", "before_json", "after_json", "unchanged_toast", "columns", "origin", "gid",
)


def change_schema() -> StructType:
    """The Spark schema of change rows."""
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    text_map = MapType(StringType(), StringType(), valueContainsNull=True)
    column = StructType([
        StructField("name", StringType()), StructField("type", StringType()),
        StructField("type_oid", LongType()), StructField("key", BooleanType()),
    ])
    return StructType([
        StructField("lsn", LongType()),
        StructField("commit_lsn", LongType()),
        StructField("seq", IntegerType()),
        StructField("xid", LongType()),
        StructField("commit_time", TimestampType()),
        StructField("op", StringType()),
        StructField("schema", StringType()),
        StructField("table", StringType()),
        StructField("key", text_map),
        StructField("before", text_map),
        StructField("after", text_map),
        StructField("before_json", StringType()),
        StructField("after_json", StringType()),
        StructField("unchanged_toast", ArrayType(StringType())),
        StructField("columns", ArrayType(column)),
        StructField("origin", StringType()),
        StructField("gid", StringType()),
    ])


_ARROW_SCHEMA: list[Any] = []


def arrow_schema() -> pa.Schema:
    """The Arrow schema Spark expects for change rows (what Spark's own ``to_arrow_schema``
    makes of ``change_schema()``: a Python data source's batches must match it exactly)."""
    if not _ARROW_SCHEMA:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMA.append(to_arrow_schema(change_schema(), timezone="UTC"))
    schema: pa.Schema = _ARROW_SCHEMA[0]
    return schema


def lsn_text(column: str | SparkColumn) -> SparkColumn:
    """A Spark expression printing a bigint LSN column as PostgreSQL does (``16/B374D848``)."""
    from pyspark.sql import functions as F

    col = F.col(column) if isinstance(column, str) else column
    return F.format_string("%X/%X", F.shiftrightunsigned(col, 32),
                           col.bitwiseAND(F.lit(0xFFFFFFFF)))
