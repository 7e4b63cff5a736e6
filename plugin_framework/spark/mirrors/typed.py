"""A table's net changes of a batch (netchange.py), typed: in Arrow by Python's
conversions (``net_arrow``, columns/arrowtyped.py), else, for values only Spark's
expressions are known to type as they do, by Spark (``net_frame``, ``typed_puts``:
split_tables' expressions, the reference)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.columns.arrowtyped import Decline, typed_net
from plugin_framework.spark.columns.descriptions import TableInfo
from plugin_framework.spark.columns.tables import typed_values
from plugin_framework.spark.mirrors.keys import counted, key_names
from plugin_framework.spark.mirrors.netchange import NetChanges, net_changes

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["net_arrow", "net_frame", "net_of", "typed_puts"]

# The state mirrors' logger, by the name it has always had (docs/spark.md, "Limitations")
log = logging.getLogger("plugin_framework.spark.sinks")


def net_of(rows: Sequence[dict[str, Any]], info: TableInfo) -> NetChanges:
    """``netchange.net_changes`` of a table's rows, counted where the table is keyed by
    every column (``counted``)."""
    return net_changes(rows, key_names(info), counted=counted(info))


def net_arrow(spark: Any, net: NetChanges, info: TableInfo) -> pa.Table:
    """``net_frame``'s rows as an Arrow table, typed in Python (arrowtyped.py, no Spark job)
    unless a value is in a form only Spark's expressions are known to take as they do."""
    try:
        return typed_net(net.table, [(name, pg) for name, pg, _ in info.columns],
                         key_names(info))
    except Decline as exc:
        log.debug("%s: typed by Spark (%s)", info.qualified_name, exc)
        return net_frame(spark, net, info).toArrow()


def net_frame(spark: Any, net: NetChanges, info: TableInfo) -> Any:
    """The net changes as a typed DataFrame: the table's columns (the row to put, or the key
    that goes), ``_deleted``, ``_fill`` (the columns to take from the target's row under
    the key ``_o_<key>``), ``_commit_lsn``, ``_lsn`` and ``_copies``."""
    from pyspark.sql import functions as F

    return typed_puts(spark, net.table, info, F.col("deleted").alias("_deleted"),
                      F.col("commit_lsn").alias("_commit_lsn"), F.col("lsn").alias("_lsn"),
                      F.col("copies").alias("_copies"))


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
