"""pgdecode on Spark: two ways in, one change schema (docs/spark.md).

- foreachBatch: ``ForeachBatchStream`` (Python API) or the ``spark`` emitter (command line)
  group committed transactions into micro-batches and call ``fn(batch_df, batch_id)``, with
  exactly-once delivery through a checkpoint directory;
- Structured Streaming: ``spark.readStream.format("pgoutput")`` after
  ``spark.dataSource.register(PgoutputDataSource)``.

Helpers: ``split_tables`` (typed per-table DataFrames), ``change_feed`` (the same in
Spark's change-feed shape), ``ChangeLogWriter`` and
``TableStateWriter`` (Parquet), ``DeltaTableWriter`` and ``HistoryWriter`` (Delta Lake, with
the ``delta`` extra), ``MergeIntoWriter`` (Spark SQL MERGE INTO, into Delta or Iceberg
tables of the session's catalogs): ready-made idempotent foreachBatch functions;
``read_state``, ``read_delta``.
PySpark is imported only when something needs it.
"""

from __future__ import annotations

from typing import Any

from plugin_framework.spark.changes.schema import (
    CHANGE_COLUMNS,
    arrow_schema,
    change_schema,
    lsn_text,
)
from plugin_framework.spark.columns.changefeed import change_feed
from plugin_framework.spark.columns.descriptions import TableInfo, table_infos
from plugin_framework.spark.columns.tables import split_tables
from plugin_framework.spark.columns.types import spark_type
from plugin_framework.spark.foreachbatch.batching import BatchFunction
from plugin_framework.spark.foreachbatch.checkpoint import BatchRange, Checkpoint, CheckpointError
from plugin_framework.spark.foreachbatch.output import MicroBatchOutput
from plugin_framework.spark.foreachbatch.plugin import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DELAY,
    DEFAULT_MAX_ROWS,
    ForeachBatchPlugin,
)
from plugin_framework.spark.foreachbatch.stream import ForeachBatchStream
from plugin_framework.spark.mirrors.changelog import ChangeLogWriter
from plugin_framework.spark.mirrors.delta import DeltaTableWriter
from plugin_framework.spark.mirrors.deltatables import read_delta
from plugin_framework.spark.mirrors.history import HistoryWriter
from plugin_framework.spark.mirrors.mergeinto import MergeIntoWriter
from plugin_framework.spark.mirrors.mergesql import merge_sql
from plugin_framework.spark.mirrors.parquet import TableStateWriter, read_state
from plugin_framework.spark.mirrors.queries import OtherQueryError
from plugin_framework.spark.mirrors.template import state_path

__all__ = [
    "CHANGE_COLUMNS", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_DELAY", "DEFAULT_MAX_ROWS",
    "BatchFunction", "BatchRange", "ChangeLogWriter", "Checkpoint", "CheckpointError",
    "DeltaTableWriter", "ForeachBatchPlugin", "ForeachBatchStream", "HistoryWriter",
    "MergeIntoWriter", "MicroBatchOutput", "OtherQueryError", "PgoutputDataSource", "TableInfo",
    "TableStateWriter", "arrow_schema", "change_feed", "change_schema", "lsn_text", "merge_sql",
    "read_delta", "read_state", "spark_type", "split_tables", "state_path", "table_infos",
]


def __getattr__(name: str) -> Any:
    if name == "PgoutputDataSource":  # imports pyspark.sql.datasource
        from plugin_framework.spark.datasource.reader import PgoutputDataSource

        return PgoutputDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
