"""The ``spark`` emitter: committed transactions in micro-batches, handed to a foreachBatch
function ``fn(batch_df, batch_id)`` as Spark DataFrames (the change schema of
``plugin_framework.spark.changes.schema``).

    pgdecode stream -d "dbname=app" -S lake --publication lake_pub --emitter spark \\
        -o checkpoint=/data/ckpt/lake -o foreach-batch=mypackage.jobs:apply_batch \\
        -o max-rows=50000 -o max-delay=10

Options:

- ``checkpoint=DIR`` (required): batch ids and LSN ranges, for exactly-once delivery;
- ``foreach-batch=MODULE:FUNCTION``: the function, imported (``PYTHONPATH`` applies);
- ``changelog-path=PATH``: append the change log to Parquet, partitioned by schema, table
  and date (``ChangeLogWriter``), before ``foreach-batch`` runs;
- ``state-path=PATH``: maintain each table's current state as Parquet (``TableStateWriter``);
- ``delta-path=PATH``: maintain each table's current state as Delta Lake tables
  (``DeltaTableWriter``; needs the ``delta`` extra);
- ``history-path=PATH``: keep each table's history, one row per version, as Delta Lake
  tables (``HistoryWriter``; needs the ``delta`` extra);
- ``merge-into=TARGET``: apply each table's net changes to a table of the session's
  catalogs with Spark SQL MERGE INTO (``MergeIntoWriter``; Delta Lake or Iceberg tables,
  with their jars on the cluster), TARGET naming each as ``lake.{schema}.{table}`` (the
  names are put in quoted); ``merge-staging=DIR`` (default: ``merge-staging`` in the
  checkpoint directory) keeps a batch's net changes for a batch delivered again;
  ``merge-create=CLAUSE`` creates missing targets (``USING delta``);
- ``keys=JSON``: for those four, the primary keys of tables whose rows mark every column as
  the key (REPLICA IDENTITY FULL), as ``{"schema.table": ["column", ...]}`` (``[]``: no key;
  see ``TableSink``); ``pgdecode mirror`` reads them from the catalog;
- ``no-reread=T1,T2``: tables those four do not read again from the source after an
  ALTER TABLE whose values they cannot carry over exactly (``TableSink.reread``; for huge
  tables: the documented policy applies to them instead, with a warning);
- ``max-rows`` (10000), ``max-bytes`` (64 MB), ``max-delay`` (seconds, 5): a batch goes
  out when it reaches any of them (a transaction is never split); with ``max-delay``, use
  a ``--status-interval`` no longer than it, as the delay is checked at status updates too;
- ``master``, ``app-name``, ``spark-conf=key=value,key=value``: for the SparkSession the
  emitter creates when the process has none.

The pipeline must give the emitter the Output of ``make_output()``: the slot is
acknowledged only after ``fn`` returned for a batch and the checkpoint recorded it. See
docs/spark.md.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

from emitters.options import Option, parse_int, parse_options
from plugin_framework.spark import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DELAY,
    DEFAULT_MAX_ROWS,
    BatchFunction,
    ChangeLogWriter,
    DeltaTableWriter,
    ForeachBatchPlugin,
    HistoryWriter,
    MergeIntoWriter,
    TableStateWriter,
)

__all__ = ["OPTIONS", "SparkEmitter", "load_function"]


def _text(text: str | None) -> str:
    if not text:
        raise ValueError("a value is required")
    return text


def _positive_int(text: str | None) -> int:
    value = parse_int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _seconds(text: str | None) -> float:
    if text is None:
        raise ValueError("a number of seconds is required")
    value = float(text)
    if not value >= 0:
        raise ValueError("must not be negative")
    return value


def _conf(text: str | None) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in _text(text).split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"expected key=value, not {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def _tables(text: str | None) -> list[str]:
    return [t.strip() for t in _text(text).split(",") if t.strip()]


def _keys(text: str | None) -> dict[str, list[str]]:
    try:
        keys = json.loads(_text(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(keys, dict) or not all(
            isinstance(t, str) and isinstance(k, list) and all(isinstance(c, str) for c in k)
            for t, k in keys.items()):
        raise ValueError('expected {"schema.table": ["column", ...], ...}')
    return keys


OPTIONS = [
    Option("checkpoint", None, _text, "directory of the batch log (required)"),
    Option("foreach-batch", None, _text, "MODULE:FUNCTION called as fn(batch_df, batch_id)"),
    Option("changelog-path", None, _text, "append the change log to Parquet here"),
    Option("state-path", None, _text, "maintain the tables' current state as Parquet here"),
    Option("delta-path", None, _text, "maintain the tables' current state as Delta tables here"),
    Option("history-path", None, _text, "keep the tables' history as Delta tables here"),
    Option("merge-into", None, _text, "MERGE INTO these tables of the catalogs ({table})"),
    Option("merge-staging", None, _text, "where merge-into stages a batch's net changes"),
    Option("merge-create", None, _text, "merge-into creates missing tables with this clause"),
    Option("keys", {}, _keys, "the state sinks' keys of REPLICA IDENTITY FULL tables (JSON)"),
    Option("no-reread", [], _tables, "tables the state sinks do not read again after an ALTER "
           "TABLE (comma-separated schema.table)"),
    Option("max-rows", DEFAULT_MAX_ROWS, _positive_int, "rows that close a batch"),
    Option("max-bytes", DEFAULT_MAX_BYTES, _positive_int, "bytes (estimated) that close a batch"),
    Option("max-delay", DEFAULT_MAX_DELAY, _seconds, "seconds after which a batch goes out"),
    Option("master", None, _text, "Spark master URL for a new SparkSession"),
    Option("app-name", "pgdecode", _text, "application name for a new SparkSession"),
    Option("spark-conf", {}, _conf, "key=value,... settings for a new SparkSession"),
]


def load_function(spec: str) -> BatchFunction:
    """``package.module:function`` (or ``package.module:object.attribute``) -> the callable."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"expected MODULE:FUNCTION, not {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    fn: BatchFunction = target
    return fn


class SparkEmitter(ForeachBatchPlugin):
    """The ``spark`` emitter: ForeachBatchPlugin configured by ``-o`` options."""

    name = "spark"

    def checkpoint_path(self, ctx: Any) -> str | None:
        if self.checkpoint_dir is None and ctx is not None:
            path: str | None = parse_options(OPTIONS, ctx.output_plugin_options or {})[
                "checkpoint"]
            return path
        return self.checkpoint_dir

    def configure(self, ctx: Any) -> None:
        opts = parse_options(OPTIONS, ctx.output_plugin_options or {})
        if opts["checkpoint"] is not None:
            self.checkpoint_dir = opts["checkpoint"]
        self.max_rows = opts["max-rows"]
        self.max_bytes = opts["max-bytes"]
        self.max_delay = opts["max-delay"]
        if opts["foreach-batch"] is not None:
            try:
                self.fn = load_function(opts["foreach-batch"])
            except (ImportError, AttributeError) as exc:
                raise ValueError(f'foreach-batch "{opts["foreach-batch"]}" cannot be loaded: '
                                 f"{exc}") from None
        sinks: list[BatchFunction] = []
        if opts["changelog-path"] is not None:
            sinks.append(ChangeLogWriter(opts["changelog-path"]))
        keys, no_reread = opts["keys"], opts["no-reread"]
        if opts["state-path"] is not None:
            sinks.append(TableStateWriter(opts["state-path"], keys=keys, no_reread=no_reread))
        if opts["delta-path"] is not None:
            sinks.append(DeltaTableWriter(opts["delta-path"], keys=keys, no_reread=no_reread))
        if opts["history-path"] is not None:
            sinks.append(HistoryWriter(opts["history-path"], keys=keys, no_reread=no_reread))
        if opts["merge-into"] is not None:
            staging = opts["merge-staging"]
            if staging is None:
                if self.checkpoint_dir is None:
                    raise ValueError("merge-into needs merge-staging=DIR, or a checkpoint")
                staging = os.path.join(self.checkpoint_dir, "merge-staging")
            sinks.append(MergeIntoWriter(opts["merge-into"], staging, keys=keys,
                                         no_reread=no_reread, create=opts["merge-create"]))
        elif opts["merge-staging"] is not None or opts["merge-create"] is not None:
            raise ValueError("merge-staging and merge-create go with merge-into=TARGET")
        self.sinks = sinks + self.sinks
        if self.spark is None:
            # Spark's Python workers must run this interpreter (and find pgdecode)
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            from pyspark.sql import SparkSession  # heavy and optional: only when needed

            active = SparkSession.getActiveSession()
            if active is not None:
                self.spark = active
            else:
                # pgdecode's status line says how batches go: not Spark's progress bar
                builder = SparkSession.builder.appName(opts["app-name"]).config(
                    "spark.ui.showConsoleProgress", "false")
                if opts["master"] is not None:
                    builder = builder.master(opts["master"])
                for key, value in opts["spark-conf"].items():
                    builder = builder.config(key, value)
                self.spark = builder.getOrCreate()
