"""Micro-batches of committed transactions for a ``foreachBatch`` function.

``ForeachBatchPlugin`` is an output plugin that collects the rows of committed transactions
(``plugin_framework.spark.changes``) and, when a batch is full (rows, bytes) or old enough
(time), turns it into a Spark DataFrame through Arrow and calls ``fn(batch_df, batch_id)``,
exactly as ``DataStreamWriter.foreachBatch`` would.

Delivery is exactly-once for an idempotent ``fn``:

- a batch never splits a transaction, and holds only committed ones: prepared transactions
  wait (in memory) for COMMIT PREPARED and are dropped at ROLLBACK PREPARED;
- the checkpoint records each batch's id and LSN range before ``fn`` runs and its completion
  after (checkpoint.py);
- the plugin's Output (``make_output()``, output.py) reports as durable only what ``fn`` has
  finished and never passes the PREPARE of a prepared transaction whose rows no finished batch
  holds (undecided, or committed into the batch being filled), so the slot keeps
  everything else; after a crash, the unfinished batch is rebuilt from the re-sent stream
  with the same id and exactly the same transactions, and transactions already delivered
  are skipped.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from plugin_framework import LSN, OutputPlugin
from plugin_framework.framework import OutputError, PluginMetric
from plugin_framework.spark.changes.builder import ChangeBuilder
from plugin_framework.spark.changes.plans import PlanCache
from plugin_framework.spark.changes.schema import change_schema
from plugin_framework.spark.foreachbatch.batching import BatchFunction, Current, MicroBatcher
from plugin_framework.spark.foreachbatch.output import MicroBatchOutput

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_DELAY", "DEFAULT_MAX_ROWS", "ForeachBatchPlugin"]

log = logging.getLogger("pgdecode.spark")

DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_DELAY = 5.0


class ForeachBatchPlugin(MicroBatcher, OutputPlugin):
    """Calls ``fn(batch_df, batch_id)`` with micro-batches of committed changes.

    ``fn`` may be one function or several (``sinks`` run first, in order, then ``fn``). The
    Spark session is ``spark``, else the active one, else ``SparkSession.builder``'s.
    """

    name = "spark"

    def __init__(self, fn: BatchFunction | None = None, *, spark: Any = None,
                 checkpoint: str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_delay: float = DEFAULT_MAX_DELAY,
                 sinks: Sequence[BatchFunction] = ()) -> None:
        self.fn = fn
        self.sinks = list(sinks)
        self.spark = spark
        self.checkpoint_dir = checkpoint
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_delay = max_delay
        self.output = MicroBatchOutput(self)
        self.batches = 0  # delivered by this process
        self.rows_delivered = 0
        self.delivered = LSN(0)  # what the slot may forget (set from the checkpoint at startup)
        self.last_batch = None
        self._ready = False
        self._failed = False
        self.checkpoint = None
        self._noted_progress = None
        self._asked = False
        self._snapshot_requests = None
        self._reread = None
        self._completing_copy = False
        self._requested = set()
        self._inexact = set()
        self._rereading = set()
        self._asked_here = None
        self.consistent_lsn = None
        self.unknown_toast = Counter()

    def stream_metrics(self) -> Iterable[PluginMetric]:
        """Whether the targets equal the source, and as of which LSN; rows written without
        an unchanged TOAST value they lacked, by table."""
        if self.consistent_lsn is not None:
            yield PluginMetric("consistent_lsn", "the WAL position (bytes) as of which the "
                               "batches' targets equal the source (absent while not known)",
                               "gauge", (), self.consistent_lsn)
        for table, rows in sorted(self.unknown_toast.copy().items()):
            yield PluginMetric("unknown_toast", "rows a mirror wrote without an unchanged "
                               "TOAST value it did not have (NULL until read again)",
                               "counter", (("table", table),), rows)

    @property
    def status_note(self) -> str:
        """For the status line: the batches this process delivered, and the last one's id."""
        last = self.last_batch
        unknown = sum(self.unknown_toast.values())
        return (f"{self.batches} batches ({self.rows_delivered} rows)"
                + ("" if last is None else f", last {last.batch_id}")
                + ("" if self.consistent_lsn is None
                   else f", consistent as of {LSN(self.consistent_lsn)}")
                + (f", {unknown} rows without a TOAST value" if unknown else ""))

    def make_output(self) -> MicroBatchOutput:
        """The Output to give this plugin in ``Pipeline.add(..., output=...)``
        (output_protocol.DeliversElsewhere)."""
        return self.output

    # --- set-up -----------------------------------------------------------------------------

    def configure(self, ctx: Any) -> None:
        """Read options from ``ctx.output_plugin_options`` (the emitter does; the Python API
        passes everything to the constructor)."""
        if ctx.output_plugin_options:
            name = next(iter(ctx.output_plugin_options))
            raise ValueError(f'option "{name}" is unknown: pass settings to the constructor')

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        self.configure(ctx)
        if ctx.output is not self.output:
            raise OutputError(
                "the spark emitter needs its own output: add it to the pipeline with "
                "output=plugin.make_output() (its durable LSN follows the finished batches)"
            )
        if self.checkpoint_dir is None:
            raise ValueError("a checkpoint directory is required (option checkpoint=DIR)")
        if self.fn is None and not self.sinks:
            raise ValueError("nothing to call: give a foreachBatch function or a sink")
        if self.max_rows < 1 or self.max_bytes < 1 or self.max_delay < 0:
            raise ValueError("max-rows and max-bytes must be positive, max-delay not negative")
        self.plans = PlanCache(ctx.catalog)
        self._snapshot_requests = ctx.request_snapshot
        self.batch = ChangeBuilder(self.plans)
        checkpoint = self._checkpoint_of(ctx)
        pending = checkpoint.pending
        last = checkpoint.last_committed
        self.replay = pending
        self.consistent_lsn = None if checkpoint.consistent is None else int(checkpoint.consistent)
        self._reread = checkpoint.reread
        self._inexact = set(checkpoint.inexact)
        # how far the snapshot is whose rows the batches hold, with the batch being filled
        self._progress = checkpoint.snapshot_progress
        self._batch_stored = False  # the batch being filled has snapshot rows
        # Transactions ending at or before this were delivered by an earlier run.
        self.committed_end = pending.start if pending is not None else checkpoint.delivered
        # What the slot may forget: never more than was safe when the last batch finished.
        self.delivered = LSN(checkpoint.acked if last is not None else 0)
        self.marked = self.delivered
        self.pending = {}
        self._cur = None
        self._batch_txns = 0
        self._batch_end = LSN(0)
        self._batch_since = None
        if pending is not None:
            log.info("batch %d (%s to %s) was not finished: delivering it again",
                     pending.batch_id, pending.start, pending.end)
        if self.spark is None:
            self.spark = _session()
        from plugin_framework.spark.foreachbatch.lazyframe import (  # (imports pyspark)
            quiet_large_tasks,
        )

        quiet_large_tasks(self.spark)
        self._schema = change_schema()
        self._ready = True
        if pending is not None and pending.stored:
            self._deliver_stored(pending)

    # --- transactions -----------------------------------------------------------------------

    def _open(self, builder: ChangeBuilder, txn: Any) -> Current:
        if self._cur is not None:
            # a transaction cut short by a lost connection: the server sends it again
            self._cur.builder.rollback(self._cur.mark)
        index, mark = builder.open_for(txn)
        self._cur = Current(builder, index, mark, bool(getattr(txn, "is_snapshot", False)))
        return self._cur

    def begin(self, ctx: Any, txn: Any) -> None:
        replay = self.replay
        if replay is not None and txn.final_lsn is not None and txn.final_lsn >= replay.end:
            self._emit()  # everything of the batch being delivered again has arrived
        cur = self._open(self.batch, txn)
        starts = getattr(txn, "snapshot_starts", None)
        if starts is not None:
            # The table's initial copy begins: a TRUNCATE row first, so that the mirrors
            # start the table here, empty (an empty table gets a state). docs/spark.md
            cur.builder.add_truncate(cur.index, [starts], txn.final_lsn)

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        cur = self._cur
        assert cur is not None
        cur.builder.add_change(cur.index, change)

    def fast_change(self, ctx: Any, relation: Any) -> Any:
        """The change callback's work on raw messages, in C where it is built
        (docs/framework.md, "fast_change")."""
        cur = self._cur
        return None if cur is None else cur.builder.raw_writer(cur.index, relation)

    def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        cur = self._cur
        assert cur is not None
        cur.builder.add_truncate(cur.index, relations, change.lsn)

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        cur = self._cur
        assert cur is not None
        self._cur = None
        end = LSN(txn.end_lsn)
        if cur.snapshot:
            # Snapshot rows are never sent again: a restart goes on after those the batches
            # hold (``snapshot_progress``), whatever their LSN (an initial copy's chunks all
            # have the slot's consistent point).
            self._progress = self._noted_progress
            if cur.builder.txn_rows(cur.index):
                cur.builder.close_txn(cur.index, txn, commit_lsn)
                self._batch_stored = True
                self._added(end)
            else:
                cur.builder.rollback(cur.mark)
        elif end <= self.committed_end or cur.builder.txn_rows(cur.index) == 0:
            cur.builder.rollback(cur.mark)  # delivered before, or nothing to deliver
        else:
            cur.builder.close_txn(cur.index, txn, commit_lsn)
            self._added(end)
        self._after(end)

    def begin_prepare(self, ctx: Any, txn: Any) -> None:
        self._open(ChangeBuilder(self.plans), txn)

    def prepare(self, ctx: Any, txn: Any, prepare_lsn: LSN) -> None:
        cur = self._cur
        assert cur is not None
        self._cur = None
        self.pending[txn.gid] = (cur.builder, cur.index, LSN(prepare_lsn))

    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        entry = self.pending.pop(txn.gid, None)
        end = LSN(txn.end_lsn)
        if entry is None:
            if end > self.committed_end:
                self._unseen_prepare(txn.gid, end)
            return
        builder, index, prepare_lsn = entry
        if end <= self.committed_end:
            return
        replay = self.replay
        if replay is not None and commit_lsn >= replay.end:
            self._emit()
        if builder.txn_rows(index):
            builder.close_txn(index, txn, commit_lsn)
            self.batch.extend(builder)
            # Until the batch holding these rows is finished, the slot stays at the PREPARE:
            # the server sends a prepared transaction's changes again only from before it
            # (after a restart from later, COMMIT PREPARED comes alone).
            self.delivered = min(self.delivered, prepare_lsn)
            self._added(end)
        self._after(end)

    def _unseen_prepare(self, gid: str, end: LSN) -> None:
        """COMMIT PREPARED of a transaction whose PREPARE this run did not receive, and that
        no finished batch holds: its changes are not to be had from the slot any more."""
        message = (f'COMMIT PREPARED of "{gid}" (ending at {end}) arrived without its '
                   "PREPARE, which the slot was acknowledged past before any batch held its "
                   "changes")
        if self.checkpoint is not None and self.checkpoint.last_committed is not None:
            # This checkpoint's own batches lead here: what it delivers would lack them.
            raise OutputError(
                f"{message}: they cannot be delivered. The slot was moved on by another "
                "consumer or by hand; take the target again from a new slot (with a "
                "snapshot) rather than go on without them")
        log.warning("%s (the slot was read before this checkpoint existed): its changes "
                    "are not in the batches", message)

    def rollback_prepared(self, ctx: Any, txn: Any, prepare_end_lsn: LSN,
                          prepare_time: Any) -> None:
        self.pending.pop(txn.gid, None)

    def shutdown(self, ctx: Any) -> None:
        self.drain()


def _session() -> Any:
    from pyspark.sql import SparkSession  # lazy: pyspark is heavy and optional

    active = SparkSession.getActiveSession()
    return active if active is not None else SparkSession.builder.getOrCreate()
