"""Micro-batches of committed transactions for a ``foreachBatch`` function.

``ForeachBatchPlugin`` is an output plugin that collects the rows of committed transactions
(``plugin_framework.spark.changes``) and, when a batch is full (rows, bytes) or old enough
(time), turns it into a Spark DataFrame through Arrow and calls ``fn(batch_df, batch_id)``,
exactly as ``DataStreamWriter.foreachBatch`` would.

Delivery is exactly-once for an idempotent ``fn``:

- a batch never splits a transaction, and holds only committed ones: prepared transactions
  wait (in memory) for COMMIT PREPARED and are dropped at ROLLBACK PREPARED;
- the checkpoint records each batch's id and LSN range before ``fn`` runs and its completion
  after (``plugin_framework.spark.checkpoint``);
- the plugin's Output (``make_output()``) reports as durable only what ``fn`` has finished
  and never passes the PREPARE of a prepared transaction whose rows no finished batch
  holds (undecided, or committed into the batch being filled), so the slot keeps
  everything else; after a crash, the unfinished batch is rebuilt from the re-sent stream
  with the same id and exactly the same transactions, and transactions already delivered
  are skipped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from plugin_framework import LSN, OutputPlugin
from plugin_framework.framework import OutputError, OutputRecord
from plugin_framework.spark.changes.builder import ChangeBuilder
from plugin_framework.spark.changes.plans import PlanCache
from plugin_framework.spark.changes.rows import remember_rows
from plugin_framework.spark.changes.schema import change_schema
from plugin_framework.spark.checkpoint import BatchRange, Checkpoint

log = logging.getLogger("pgdecode.spark")

BatchFunction = Callable[[Any, int], Any]

DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_DELAY = 5.0


class MicroBatchOutput:
    """The Output of a ForeachBatchPlugin: durable up to what ``fn`` has finished.

    It takes snapshots (docs/snapshot.md) as FileOutput does, through the checkpoint: whether
    an initial copy is under way, and how far the snapshot is whose rows the batches hold."""

    # A copy that could not go on after an interruption would be taken again whole, and
    # batches already delivered cannot be taken back: such a copy is refused.
    copy_must_resume = True

    def __init__(self, plugin: ForeachBatchPlugin) -> None:
        self.plugin = plugin
        self.durable_lsn = LSN(0)
        self._ctx: Any = None

    def attach(self, ctx: Any) -> None:
        """The context of the pipeline member this output serves (its options say where the
        checkpoint is, which the source asks about before startup)."""
        self._ctx = ctx

    # --- snapshots ------------------------------------------------------------------------

    @property
    def snapshot_state(self) -> str | None:
        """"copying" while an initial copy is under way, "done" after it, None without one."""
        return self.plugin._checkpoint_of(self._ctx).snapshot_state

    @property
    def resume_incremental(self) -> dict[str, Any] | None:
        """How far the snapshot is whose rows the delivered batches hold."""
        return self.plugin._checkpoint_of(self._ctx).snapshot_progress

    def begin_snapshot(self) -> None:
        self.plugin._checkpoint_of(self._ctx).set_snapshot_state("copying")

    def note_incremental(self, state: dict[str, Any] | None) -> None:
        """Said before the snapshot rows it goes with; each batch records the progress of
        the last snapshot rows in it (so no ``snapshot_checkpoint`` is needed)."""
        self.plugin._noted_progress = state

    def end_snapshot(self) -> None:
        """The copy is complete: its last rows are delivered now, then it is recorded done."""
        self.plugin.drain()
        checkpoint = self.plugin._checkpoint_of(self._ctx)
        if checkpoint.snapshot_state is not None:
            checkpoint.set_snapshot_state("done")

    # --- the Output protocol --------------------------------------------------------------

    def write(self, record: OutputRecord) -> None:
        raise OutputError("the spark emitter delivers DataFrames; it has nothing to write")

    def mark(self, lsn: LSN) -> None:
        self.plugin._on_mark(lsn)

    def flush(self) -> LSN:
        self.durable_lsn = self.plugin._on_flush()
        return self.durable_lsn

    def drain(self) -> None:
        """Deliver the batch being filled now (a source calls this before its last status
        update, so that the acknowledgement covers it)."""
        self.plugin.drain()

    def close(self) -> None:
        self.plugin._on_close()


class _Current:
    """The transaction being received: where its rows go, and how to take them back."""

    __slots__ = ("builder", "index", "mark", "snapshot")

    def __init__(self, builder: ChangeBuilder, index: int, mark: Any, snapshot: bool) -> None:
        self.builder = builder
        self.index = index
        self.mark = mark
        self.snapshot = snapshot  # rows of a snapshot (not in the slot: stored with the batch)


class ForeachBatchPlugin(OutputPlugin):
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
        self.last_batch: BatchRange | None = None
        self._ready = False
        self._failed = False
        self.checkpoint: Checkpoint | None = None
        self._noted_progress: dict[str, Any] | None = None  # said before the next snapshot rows

    def checkpoint_path(self, ctx: Any) -> str | None:
        """Where the checkpoint is (the emitter reads it from its options)."""
        return self.checkpoint_dir

    def _checkpoint_of(self, ctx: Any) -> Checkpoint:
        """The checkpoint, opened now if startup has not opened it yet (the source asks
        about snapshots before it starts the plugins)."""
        if self.checkpoint is None:
            path = self.checkpoint_path(ctx)
            if path is None:
                raise ValueError("a checkpoint directory is required (option checkpoint=DIR)")
            self.checkpoint = Checkpoint(path, None if ctx is None else ctx.slot_name)
        return self.checkpoint

    @property
    def status_note(self) -> str:
        """For the status line: the batches this process delivered, and the last one's id."""
        last = self.last_batch
        return (f"{self.batches} batches ({self.rows_delivered} rows)"
                + ("" if last is None else f", last {last.batch_id}"))

    def make_output(self) -> MicroBatchOutput:
        """The Output to give this plugin in ``Pipeline.add(..., output=...)``."""
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
        self.batch = ChangeBuilder(self.plans)
        checkpoint = self._checkpoint_of(ctx)
        pending = checkpoint.pending
        last = checkpoint.last_committed
        self.replay: BatchRange | None = pending
        # how far the snapshot is whose rows the batches hold, with the batch being filled
        self._progress = checkpoint.snapshot_progress
        self._batch_stored = False  # the batch being filled has snapshot rows
        # Transactions ending at or before this were delivered by an earlier run.
        self.committed_end = pending.start if pending is not None else checkpoint.delivered
        # What the slot may forget: never more than was safe when the last batch finished.
        self.delivered = LSN(checkpoint.acked if last is not None else 0)
        self.marked = self.delivered
        self.pending: dict[str, tuple[ChangeBuilder, int, LSN]] = {}
        self._cur: _Current | None = None
        self._batch_txns = 0
        self._batch_end = LSN(0)
        self._batch_since: float | None = None
        if pending is not None:
            log.info("batch %d (%s to %s) was not finished: delivering it again",
                     pending.batch_id, pending.start, pending.end)
        if self.spark is None:
            self.spark = _session()
        from plugin_framework.spark.lazyframe import quiet_large_tasks  # (imports pyspark)

        quiet_large_tasks(self.spark)
        self._schema = change_schema()
        self._ready = True
        if pending is not None and pending.stored:
            self._deliver_stored(pending)

    def _deliver_stored(self, pending: BatchRange) -> None:
        """Deliver again, from the checkpoint, a batch with snapshot rows that ``fn`` had not
        finished (the slot cannot send those rows again). The slot is acknowledged no
        further than before it: a prepared transaction undecided then is sent again."""
        assert self.checkpoint is not None
        table = self.checkpoint.stored_rows(pending)
        self._call(pending, self._frame(table))
        self._finished(pending, self.checkpoint.acked)
        log.info("batch %d (%d rows, with snapshot rows) delivered again from the checkpoint",
                 pending.batch_id, pending.rows)

    def _frame(self, table: Any) -> Any:
        """The batch's DataFrame, which remembers the rows it was made of (local_rows), and
        is made in the JVM only when something reads it (lazyframe.py): the sinks read the
        driver's Arrow table instead.

        Spark keeps a DataFrame made from Arrow data under the session's
        localRelationThreshold (48 MB) as a LocalRelation: every row converted in the driver,
        at once, whether ``fn`` reads them or not, which took most of a no-op batch's time.
        With the threshold at 0 for this call, the batch stays Arrow until a job reads it
        (the same rows: only when they are converted differs). The session's own setting is
        back after the call."""
        from plugin_framework.spark.lazyframe import frame, session_setting  # (pyspark)

        def make() -> Any:
            # fn's threads may make two batches' frames at once: one setting at a time
            with _SETTING, session_setting(self.spark, _LOCAL_RELATION, "0"):
                return self.spark.createDataFrame(table, self._schema)

        df = frame(self.spark, make, self._schema)
        remember_rows(df, table)
        return df

    def _call(self, br: BatchRange, df: Any) -> None:
        """``fn`` and the sinks, for one batch; nothing more is delivered by this process if
        one of them fails."""
        self._failed = True
        assert self.checkpoint is not None
        self._name_query(self.checkpoint.id)
        try:
            for fn in [*self.sinks, *([self.fn] if self.fn is not None else [])]:
                fn(df, br.batch_id)
        finally:
            self._name_query(None)
        self._failed = False

    def _name_query(self, name: str | None) -> None:
        """The batch ids are the checkpoint's: the sinks tell whose batches their target
        holds by it (changelog.query_of), while fn and the sinks run (None: no longer)."""
        with contextlib.suppress(Exception):  # (Spark Connect has no SparkContext)
            self.spark.sparkContext.setLocalProperty("pgdecode.queryId", name)

    # --- transactions -----------------------------------------------------------------------

    def _open(self, builder: ChangeBuilder, txn: Any) -> _Current:
        if self._cur is not None:
            # a transaction cut short by a lost connection: the server sends it again
            self._cur.builder.rollback(self._cur.mark)
        index, mark = builder.open_for(txn)
        self._cur = _Current(builder, index, mark, bool(getattr(txn, "is_snapshot", False)))
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

    def drain(self) -> None:
        """Deliver the batch being filled now, whatever its size and age (at a stop)."""
        if (self._ready and not self._failed and self._cur is None and self.replay is None
                and self.batch.rows):
            self._emit()
            self.delivered = max(self.delivered, self.marked)

    # --- batching ---------------------------------------------------------------------------

    def _added(self, end: LSN) -> None:
        self._batch_txns += 1
        self._batch_end = end
        if self._batch_since is None:
            self._batch_since = time.monotonic()

    def _after(self, end: LSN) -> None:
        replay = self.replay
        if replay is not None:
            if end >= replay.end:
                self._emit()
            return
        batch = self.batch
        if batch.rows and (batch.rows >= self.max_rows or batch.nbytes >= self.max_bytes
                           or self._due()):
            self._emit()

    def _due(self) -> bool:
        since = self._batch_since
        return since is not None and time.monotonic() - since >= self.max_delay

    def _emit(self) -> None:
        batch = self.batch
        replay = self.replay
        checkpoint = self.checkpoint
        assert checkpoint is not None
        if replay is not None:
            if batch.rows != replay.rows or self._batch_end != replay.end:
                log.warning("batch %d delivered again with %d rows up to %s; it had %d rows up "
                            "to %s", replay.batch_id, batch.rows, self._batch_end, replay.rows,
                            replay.end)
            if not batch.rows:
                # nothing of it came back (it cannot be rebuilt): record it finished as it was
                checkpoint.commit(replay, self._durable(replay.end))
                self.replay = None
                self.committed_end = max(self.committed_end, replay.end)
                return
            # rebuilt from the stream: no snapshot rows (those batches are stored)
            assert not self._batch_stored
            br = BatchRange(replay.batch_id, replay.start, self._batch_end, batch.rows,
                            self._batch_txns, replay.snapshot_progress)
        else:
            # (Progress without rows, an empty last chunk, goes with the next batch: read
            # again after a restart, that chunk is empty again.)
            if not batch.rows:
                return
            br = BatchRange(checkpoint.next_batch_id, self.committed_end,
                            max(self._batch_end, self.committed_end), batch.rows,
                            self._batch_txns, self._progress, self._batch_stored)
        started = time.monotonic()
        table = batch.to_arrow()
        if replay is None:
            checkpoint.begin(br, table if br.stored else None)
        self._call(br, self._frame(table))
        self.delivered = max(self.delivered, br.end)
        self._finished(br, self._durable(br.end))
        batch.clear()
        self._batch_txns = 0
        self._batch_since = None
        self._batch_stored = False
        log.debug("batch %d: %d rows of %d transactions, %s to %s, in %.2f s", br.batch_id,
                 br.rows, br.transactions, br.start, br.end, time.monotonic() - started)

    def _finished(self, br: BatchRange, ack: LSN) -> None:
        """``fn`` returned for a batch: recorded in the checkpoint with ``ack``, how far the
        slot may then be acknowledged."""
        assert self.checkpoint is not None
        self.checkpoint.commit(br, ack)
        self.replay = None
        self.committed_end = max(self.committed_end, br.end)
        self.batches += 1
        self.rows_delivered += br.rows
        self.last_batch = br

    def _durable(self, lsn: LSN) -> LSN:
        """``lsn``, held back to the PREPARE of the oldest undecided prepared transaction
        (the server must send it again, since only this process has its rows)."""
        for _, _, prepare_lsn in self.pending.values():
            lsn = min(lsn, prepare_lsn)
        return lsn

    # --- the output's side ------------------------------------------------------------------

    def _on_mark(self, lsn: LSN) -> None:
        if lsn > self.marked:
            self.marked = lsn
        if not self.batch.rows and self._cur is None and lsn > self.delivered:
            self.delivered = lsn  # everything up to here is delivered or had no rows

    def _on_flush(self) -> LSN:
        if (self._ready and not self._failed and self._cur is None and self.replay is None
                and self.batch.rows and self._due()):
            self._emit()
            if not self.batch.rows:
                self.delivered = max(self.delivered, self.marked)
        return self._durable(self.delivered)

    def _on_close(self) -> None:
        pass


_LOCAL_RELATION: Final = "spark.sql.execution.arrow.localRelationThreshold"
_SETTING = threading.Lock()  # held while a batch's frame is made with that setting at 0


def _session() -> Any:
    from pyspark.sql import SparkSession  # lazy: pyspark is heavy and optional

    active = SparkSession.getActiveSession()
    return active if active is not None else SparkSession.builder.getOrCreate()
