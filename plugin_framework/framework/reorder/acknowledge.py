"""Acknowledgement: up to which LSN every output is durable, what each plugin already had,
and the end of a transaction.

PostgreSQL's plugins call OutputPluginUpdateProgress; here the reorder buffer marks each
plugin's output itself at the end of every transaction (``_mark``), and the source asks
``flush()`` or ``safe_lsn()`` what it may confirm to the server. Neither ever passes a
prepared transaction that some plugin still waits for.
"""

from __future__ import annotations

from collections.abc import Iterable

from plugin_framework.framework.outputs import Batching, Resuming, capable
from plugin_framework.framework.reorder.buffer import CHANGE_OPS, ReorderBufferState
from plugin_framework.framework.reorder.txn import TxnState
from plugin_framework.protocol import LSN


class Acknowledgement(ReorderBufferState):
    """Marks, flushes and the already-delivered test."""

    def flush(self) -> LSN:
        """Flush every output; return the LSN up to which the server may forget the stream."""
        durable = min((m.ctx.output.flush() for m in self.members), default=self._position)
        return self._cap(durable)

    def drain(self) -> None:
        """Ask outputs that batch (the Spark emitter's) to deliver what they hold now."""
        for m in self.members:
            if capable(m.ctx.output, Batching):
                m.ctx.output.drain()

    def safe_lsn(self) -> LSN:
        durable = min((m.ctx.output.durable_lsn for m in self.members), default=self._position)
        return self._cap(durable)

    def _cap(self, lsn: LSN) -> LSN:
        # Never past what this pipeline has itself finished: outputs resumed after a restart
        # are durable further than that, but a prepared transaction that a plugin still
        # needs may lie between (the server sends it again, and only its PREPARE caps).
        lsn = min(lsn, self._position)
        for state in self._prepared.values():
            if self._unstored(state) and state.prepare_lsn is not None:
                lsn = min(lsn, state.prepare_lsn)
        return lsn

    def _unstored(self, state: TxnState) -> bool:
        """Whether a member awaits this prepared transaction with no entry of its output
        holding it (holding.py): the acknowledgement must then stay at its PREPARE."""
        entries = state.entries
        return any(i not in entries for i in state.held) or any(
            i not in entries for i in state.streamed_held)

    @property
    def in_flight(self) -> bool:
        """True while a transaction is open, streamed, or prepared and awaited by a plugin
        whose output does not hold it durably."""
        return (self._txn is not None or bool(self._streams)
                or any(self._unstored(s) for s in self._prepared.values()))

    @property
    def position(self) -> LSN:
        """The end LSN of the last transaction (or message) the pipeline finished."""
        return self._position

    @property
    def at_boundary(self) -> bool:
        """True between transactions (and between stream blocks): a clean place to stop."""
        return self._txn is None and self._stream is None

    def _open_streams(self, i: int) -> list[int]:
        """The streamed transactions member i has blocks of, and no end for yet."""
        return ([s.base.xid for s in self._streams.values() if i in s.live]
                + [s.base.xid for s in self._prepared.values() if i in s.streamed_held])

    def _mark(self, members: Iterable[int], lsn: LSN) -> None:
        """Everything ``members`` will ever write for WAL before ``lsn`` is written (what a
        C plugin tells with OutputPluginUpdateProgress)."""
        done = self._done
        if lsn > self._position:
            self._position = lsn
        for i in members:
            output = self.members[i].ctx.output
            if capable(output, Resuming):
                output.note_open_streams(self._open_streams(i))
            output.mark(lsn)
            if lsn > done[i]:
                done[i] = lsn

    def _finish(self, state: TxnState, end_lsn: LSN, *, committed: bool = True) -> None:
        """A transaction has its outcome, for every member: release it, mark every output
        at its end, count it."""
        self._close(state)
        self._mark(range(len(self.members)), end_lsn)
        self.transactions += 1
        self.last_commit_time = state.base.commit_time
        if committed and (state.live or state.held or state.streamed_held):
            self._count(state)  # not a re-send that every member already had

    def _count(self, state: TxnState) -> None:
        """Add a committed transaction's changes to ``delivered``."""
        delivered = self.delivered
        snapshot = state.base.is_snapshot
        for (_, relid, tag), n in state.counts.items():
            rel = state.relations.get(relid) or self.relations.get(relid)
            op = "snapshot" if snapshot else CHANGE_OPS[tag]
            key = (rel.namespace, rel.name, op) if rel is not None else ("", str(relid), op)
            delivered[key] = delivered.get(key, 0) + n

    def _delivered(self, i: int, lsn: LSN | None) -> bool:
        """Whether member i already had the transaction whose commit (or prepare, or
        rollback) record is at ``lsn``."""
        return lsn is not None and lsn < self._done[i]

    def _drop_delivered(self, state: TxnState, lsn: LSN) -> None:
        """Take members that already had this outcome (a re-send) out of the delivery."""
        state.live = [i for i in state.live if not self._delivered(i, lsn)]
        state.held = [i for i in state.held if not self._delivered(i, lsn)]
        state.streamed_held = [i for i in state.streamed_held if not self._delivered(i, lsn)]
