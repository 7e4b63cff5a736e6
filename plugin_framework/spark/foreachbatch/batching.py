"""The batching half of ``ForeachBatchPlugin`` (plugin.py, whose callbacks fill the batch):
the batch being filled, when it goes out (rows, bytes, age), its delivery to the sinks and
``fn`` through the checkpoint, and how far the slot may then be acknowledged (what the
plugin's Output, output.py, reports)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from plugin_framework import LSN
from plugin_framework.spark.changes.batch import BatchContext, KeyText, delivering
from plugin_framework.spark.changes.builder import ChangeBuilder
from plugin_framework.spark.changes.rows import remember_rows
from plugin_framework.spark.foreachbatch.checkpoint import BatchRange, Checkpoint

__all__ = ["BatchFunction", "Current", "MicroBatcher"]

log = logging.getLogger("pgdecode.spark")

BatchFunction = Callable[[Any, int], Any]


class Current:
    """The transaction being received: where its rows go, and how to take them back."""

    __slots__ = ("builder", "index", "mark", "snapshot")

    def __init__(self, builder: ChangeBuilder, index: int, mark: Any, snapshot: bool) -> None:
        self.builder = builder
        self.index = index
        self.mark = mark
        self.snapshot = snapshot  # rows of a snapshot (not in the slot: stored with the batch)


class MicroBatcher:
    """What ``ForeachBatchPlugin`` batches with: its state is set by the plugin's
    constructor and ``startup``."""

    fn: BatchFunction | None
    sinks: list[BatchFunction]
    spark: Any
    checkpoint_dir: str | None
    max_rows: int
    max_bytes: int
    max_delay: float
    batches: int  # delivered by this process
    rows_delivered: int
    last_batch: BatchRange | None
    checkpoint: Checkpoint | None
    batch: ChangeBuilder  # the batch being filled
    replay: BatchRange | None  # the batch being delivered again
    committed_end: LSN  # transactions ending at or before this were delivered
    delivered: LSN  # what the slot may forget
    marked: LSN
    pending: dict[str, tuple[ChangeBuilder, int, LSN]]  # prepared transactions, by gid
    _cur: Current | None  # the transaction being received
    _ready: bool
    _failed: bool
    _schema: Any
    _progress: dict[str, Any] | None
    _noted_progress: dict[str, Any] | None  # said before the next snapshot rows
    _batch_stored: bool
    _batch_txns: int
    _batch_end: LSN
    _batch_since: float | None
    _asked: bool  # a sink asked for rows again, or lacked a value, in the batch delivered
    # the source's ctx.request_snapshot (None: it takes none; the sinks then do without)
    _snapshot_requests: Callable[[str, Sequence[KeyText] | None], LSN] | None
    # the newest of those requests (its message's LSN): batches up to it are not consistent
    _reread: LSN | None
    _completing_copy: bool  # the batch delivered holds the initial copy's last rows
    _requested: set[str]  # tables the sinks asked to read again, in the batch delivered
    # tables written with values known not to be the source's and not asked for again (a
    # policy: no_reread, no key): no batch is consistent until they are read again whole
    _inexact: set[str]
    _rereading: set[str]  # of those, the ones being read again now
    _asked_here: LSN | None  # the newest request this run made
    consistent_lsn: int | None  # the targets equal the source as of this (last batch)
    unknown_toast: Counter[str]  # rows written without their unchanged TOAST value, by table

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

    # --- delivery ---------------------------------------------------------------------------

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
        """The batch's DataFrame (lazyframe.batch_frame), which remembers the rows it was
        made of (local_rows): the sinks read the driver's Arrow table instead."""
        from plugin_framework.spark.foreachbatch.lazyframe import batch_frame  # (pyspark)

        df = batch_frame(self.spark, table, self._schema)
        remember_rows(df, table)
        return df

    def _call(self, br: BatchRange, df: Any) -> None:
        """``fn`` and the sinks, for one batch, with the batch's context (changes/batch.py);
        nothing more is delivered by this process if one of them fails."""
        self._failed = True
        assert self.checkpoint is not None
        self._name_query(self.checkpoint.id)
        self._asked = False
        self._requested = set()
        context = BatchContext(self._request_snapshot, self._consistent(br),
                               self._note_unknown_toast)
        try:
            with delivering(context):
                for fn in [*self.sinks, *([self.fn] if self.fn is not None else [])]:
                    fn(df, br.batch_id)
        finally:
            self._name_query(None)
        self._failed = False
        self._inexact |= context.inexact - self._requested
        self.consistent_lsn = None if self._asked or context.inexact or self._inexact \
            else context.consistent_lsn

    def _consistent(self, br: BatchRange) -> int | None:
        """The LSN as of which the targets equal the source once the batch is in them: its
        end, if the initial snapshot is complete (or completed by this batch: its rows are
        the last, or its record has no table left) and no snapshot is under way (the
        batch's record, and what the source has said since) or asked for in a request the
        stream has not read yet; else None."""
        assert self.checkpoint is not None
        state = self.checkpoint.snapshot_state
        if state is None:
            return None  # no copy taken: rows that were there before may be missing
        if state != "done" and not self._completing_copy and br.snapshot_progress is None:
            return None
        if self._reread is not None and br.end <= self._reread:
            return None  # rows asked for again, before the stream has read the request
        if _reading(br.snapshot_progress) or _reading(self._noted_progress):
            return None
        return int(br.end)

    def _request_snapshot(self, table: str, keys: Sequence[KeyText] | None) -> None:
        """A sink's request for rows read again: the source's (``ctx.request_snapshot``);
        the batch is then not consistent."""
        self._asked = True
        request = self._snapshot_requests
        if request is None:
            raise RuntimeError("this stream's source takes no snapshot requests")
        self._requested.add(table)
        lsn = request(table, keys)
        self._asked_here = lsn  # (its read is in the progress the source notes)
        self._reread = lsn if self._reread is None else max(self._reread, lsn)

    def _note_progress(self, state: dict[str, Any] | None) -> None:
        """What the source says of its snapshots, before the rows it goes with: a table
        written inexactly is exact again once it has been read again whole."""
        self._noted_progress = state
        if state is None:
            return
        under_way = {*state.get("queue", ()), *([state["table"]] if state.get("table") else [])}
        self._rereading |= self._inexact & (under_way - set(state.get("keys_only", ())))
        for table in self._rereading - under_way:
            self._inexact.discard(table)
            self._rereading.discard(table)

    def _note_unknown_toast(self, table: str, rows: int) -> None:
        self._asked = True  # (not consistent: written without a value it should have)
        self.unknown_toast[table] += rows

    def _name_query(self, name: str | None) -> None:
        """The batch ids are the checkpoint's: the sinks tell whose batches their target
        holds by it (mirrors/queries.py), while fn and the sinks run (None: no longer)."""
        with contextlib.suppress(Exception):  # (Spark Connect has no SparkContext)
            self.spark.sparkContext.setLocalProperty("pgdecode.queryId", name)

    def drain(self, completes_copy: bool = False) -> None:
        """Deliver the batch being filled now, whatever its size and age (at a stop, or
        with the last rows of the initial copy: ``completes_copy``)."""
        if not self._ready or self._failed or self._cur is not None or self.replay is not None:
            return
        if self.batch.rows:
            self._completing_copy = completes_copy
            try:
                self._emit()
            finally:
                self._completing_copy = False
            self.delivered = max(self.delivered, self.marked)
        elif not completes_copy:
            self._settle()

    def _settle(self) -> None:
        """At a stop with nothing left to deliver: if the last batch was not consistent only
        because a copy or rows asked for were still to be read, and they are in the
        targets now (a read whose last chunk has no rows makes no batch), the targets
        equal the source as of its end."""
        checkpoint = self.checkpoint
        if checkpoint is None or checkpoint.last_committed is None \
                or checkpoint.consistent is not None or checkpoint.snapshot_state != "done" \
                or self._inexact:
            return
        if self._reread is not None and self._reread != self._asked_here \
                and self._reread > self.marked:
            return  # asked for by an earlier run, and not read again yet
        if _reading(self._noted_progress):
            return
        checkpoint.settle()
        self.consistent_lsn = int(checkpoint.last_committed.end)

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
                checkpoint.commit(replay, self._durable(replay.end), None, self._reread,
                                  frozenset(self._inexact))
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
        consistent = self.consistent_lsn
        self.checkpoint.commit(br, ack, None if consistent is None else LSN(consistent),
                               self._reread, frozenset(self._inexact))
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


def _reading(progress: dict[str, Any] | None) -> bool:
    """Whether a snapshot progress record has a table under way or queued."""
    return progress is not None and bool(progress.get("queue") or progress.get("table"))
