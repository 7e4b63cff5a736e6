"""A batch of changes in Spark's change-feed shape (the changelog columns of Spark 4.2's
``CHANGES`` clause, Delta's change data feed and Iceberg's changelog views).

``change_feed(batch_df)`` returns ``{"schema.table": DataFrame}``: per table, one row per
inserted (or snapshot) and deleted row and two per update, with

- ``_change_type``: ``insert``, ``delete``, ``update_preimage``, ``update_postimage``, or
  ``truncate`` (a TRUNCATE: the table's rows before it are gone; Spark's changelog has no
  such kind, so handle or filter it);
- ``_commit_version``: the transaction's commit LSN (a bigint, in commit order);
- ``_commit_timestamp``: its commit time (a snapshot row's: when the copy was read);
- ``_lsn``, ``_seq``: the change's place (a preimage just before its postimage);
- ``_unchanged_toast``: columns of a postimage whose unchanged TOAST value the server did not
  send (NULL there);

then the table's columns in ``split_tables``' types. A preimage has what the server sent of
the old row: every column under REPLICA IDENTITY FULL, else the old key columns (the key of a
key change, or the unchanged key), NULL elsewhere; a delete's row likewise.

Commit timestamps are the server's commit times: transactions commit in LSN order, but the
clock times of concurrent commits need not be in that order; order by ``_commit_version``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugin_framework.spark.columns.descriptions import TableInfo, align_names, table_infos
from plugin_framework.spark.columns.tables import typed_values

__all__ = ["change_feed"]


def change_feed(df: Any, infos: Sequence[TableInfo] | None = None) -> dict[str, Any]:
    """``{"schema.table": DataFrame}`` of a batch of changes in change-feed form."""
    if infos is None:
        infos = table_infos(df)
    return {info.qualified_name: _table_feed(df, info) for info in infos}


def _table_feed(df: Any, info: TableInfo) -> Any:
    from pyspark.sql import functions as F

    rows = align_names(df.filter((F.col("schema") == info.schema)
                                 & (F.col("table") == info.table)), info)
    columns = [(name, pg) for name, pg, _ in info.columns]
    op = F.col("op")

    def image(kind: Any, row_map: Any, row_json: Any, toast: Any) -> list[Any]:
        return [kind.alias("_change_type"), F.col("commit_lsn").alias("_commit_version"),
                F.col("commit_time").alias("_commit_timestamp"), F.col("lsn").alias("_lsn"),
                F.col("seq").alias("_seq"), toast.cast("array<string>").alias("_unchanged_toast"),
                *typed_values(row_map, row_json, columns)]

    none = F.lit(None).cast("array<string>")
    post = rows.filter(op.isin("INSERT", "SNAPSHOT", "UPDATE")).select(*image(
        F.when(op == "UPDATE", F.lit("update_postimage")).otherwise(F.lit("insert")),
        F.col("after"), F.col("after_json"), F.col("unchanged_toast")), F.lit(1).alias("_sub"))
    # the old row: as sent (FULL, a key change), else the unchanged key
    old_map = F.coalesce(F.col("before"), F.col("key"))
    pre = rows.filter(op.isin("UPDATE", "DELETE")).select(*image(
        F.when(op == "UPDATE", F.lit("update_preimage")).otherwise(F.lit("delete")),
        old_map, F.col("before_json"), none), F.lit(0).alias("_sub"))
    truncate = rows.filter(op == "TRUNCATE").select(*image(
        F.lit("truncate"), F.lit(None).cast("map<string,string>"), F.lit(None).cast("string"),
        none), F.lit(0).alias("_sub"))
    return (post.unionByName(pre).unionByName(truncate)
            .orderBy("_commit_version", "_seq", "_sub").drop("_sub"))
