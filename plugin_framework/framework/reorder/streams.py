"""Streamed transactions (ReorderBufferStreamTXN's side of the contract): Stream Start and
Stop around each block, Stream Abort of the transaction or a subtransaction, Stream Commit
and Stream Prepare.

Plugins with stream callbacks get each block as it comes; the others get the transaction
reassembled from its spool at Stream Commit (or PREPARE), subtransaction aborts applied,
and nothing for an aborted stream. A streaming plugin that may not take a transaction at
PREPARE (no two-phase callbacks, or a filter_prepare) gets each block at the next message:
the block right before Stream Prepare is the rest pgoutput streams at PREPARE, which such a
plugin gets only at COMMIT PREPARED (docs/framework.md, "Delivery rules").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from plugin_framework.framework.model import Transaction
from plugin_framework.framework.reorder.holding import Holding
from plugin_framework.framework.reorder.replay import Replay
from plugin_framework.framework.reorder.txn import Block, PipelineError, TxnState
from plugin_framework.framework.spool import Spool
from plugin_framework.protocol import (
    LSN,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
)


class Streams(Holding, Replay):
    """The stream messages, and the items (changes, truncates, messages) of a block."""

    def _on_stream_start(self, m: StreamStart, lsn: LSN, raw: bytes | None) -> None:
        state = self._streams.get(m.xid)
        if state is None:
            restored = self._restored(m.xid) if m.first_segment else None
            if restored is not None:
                self._drop_restored(restored)  # streamed again: take the new copy
            if not m.first_segment:
                raise PipelineError(
                    f"stream of transaction {m.xid} continues, but its first segment was "
                    "never received"
                )
            state = self._streams[m.xid] = TxnState(
                Transaction(m.xid, is_streamed=True, first_lsn=lsn)
            )
        self._stream = state
        state.in_block = []
        state.block_lsn = lsn
        state.blocks += 1

    def _stream_begin_block(self, state: TxnState) -> None:
        """First content of a block: filter by origin once, open the block for streamers."""
        if not state.started:
            state.started = True
            xid = state.base.xid
            if any(held.base.xid == xid for held in self._prepared.values()):
                # The server streams again a transaction we hold prepared (the connection was
                # lost after its Stream Prepare): every member has it or will have it from
                # the spool; its re-sent Stream Prepare is then skipped too.
                state.skipped = list(range(len(self.members)))
            else:
                state.skipped = self._origin_filtered(state)
            for i, m in enumerate(self.members):
                if i in state.skipped:
                    continue
                (state.live if m.ctx.streaming else state.held).append(i)
                if m.ctx.streaming and (not m.ctx.twophase or m.plugin.has("filter_prepare")):
                    state.deferred.append(i)
            if state.held:
                state.spool = Spool(self.budget)
        if not state.in_block:
            state.in_block = [i for i in state.live if i not in state.deferred]
            for i in state.in_block:
                self.members[i].call("stream_start", state.block_lsn, state.base.xid,
                                     self._view(state, i))
            if state.deferred:
                state.block = Block(Spool(self.budget), {**self.relations, **state.relations},
                                    state.block_lsn)
            if not state.in_block:
                state.in_block = [-1]  # the block is open even when nobody streams

    def _stream_item(self, state: TxnState, lsn: LSN, xid: int | None, raw: bytes | None,
                     cb: str, args: Callable[[], tuple[Any, ...] | None]) -> None:
        self._stream_begin_block(state)
        now = state.in_block
        built = args() if now[0] >= 0 else None
        if built is not None:
            for i in now:
                member = self.members[i]
                if member.plugin.has(cb):  # records carry the top-level xid, as in C
                    member.call(cb, lsn, state.base.xid, self._view(state, i), *built)
        if cb == "stream_truncate":
            state.catalog_changes = True
        if raw is not None:
            if state.spool is not None:
                state.spool.append(lsn, xid or 0, True, raw)
            block = state.block
            if block is not None:
                block.spool.append(lsn, xid or 0, True, raw)
                if xid and xid != state.base.xid and cb != "stream_message":
                    block.subxids.add(xid)

    def _on_stream_stop(self, m: StreamStop, lsn: LSN, raw: bytes | None) -> None:
        state = self._stream
        if state is None:
            raise PipelineError("Stream Stop outside of a stream block")
        self._stream = None
        for i in state.in_block:
            if i >= 0:
                self.members[i].call("stream_stop", lsn, state.base.xid, self._view(state, i))
        state.in_block = []
        if state.block is not None:
            state.block.stop_lsn = lsn
            self._pending = state  # delivered by the next message, unless Stream Prepare

    def _release_block(self) -> None:
        """The message after a held-back block is not its transaction's Stream Prepare: the
        server streamed the block for its memory limit, and every streaming member has it."""
        state = self._pending
        assert state is not None and state.block is not None
        self._pending = None
        block, state.block = state.block, None
        try:
            self._replay_block(state, [i for i in state.deferred if i in state.live], block)
            state.streamed_subxids |= block.subxids
        finally:
            block.close()

    def _on_stream_abort(self, m: StreamAbort, lsn: LSN, raw: bytes | None) -> None:
        state = self._streams.get(m.xid)
        if state is None:
            return  # nothing of it was streamed to us
        if m.subxid == m.xid:
            del self._streams[m.xid]
            for i in state.live:
                self.members[i].call("stream_abort", m.abort_lsn or lsn, m.xid,
                                     self._view(state, i), m.abort_lsn)
            self._close(state)
            return
        state.aborted_subxids.add(m.subxid)
        state.streamed_subxids.discard(m.subxid)
        state.counts = {k: n for k, n in state.counts.items() if k[0] != m.subxid}
        for i in state.live:
            top = self._view(state, i)
            sub = Transaction(m.subxid, toptxn=top, is_streamed=True)
            self.members[i].call("stream_abort", m.abort_lsn or lsn, m.subxid, sub, m.abort_lsn)

    def _on_stream_commit(self, m: StreamCommit, lsn: LSN, raw: bytes | None) -> None:
        state = self._streams.pop(m.xid, None)
        if state is None:
            raise PipelineError(f"Stream Commit of transaction {m.xid}, which was never streamed")
        base = state.base
        base.final_lsn, base.end_lsn, base.commit_time = m.commit_lsn, m.end_lsn, m.commit_time
        for i in state.live:
            if self._delivered(i, m.commit_lsn):
                # a re-send of a transaction this member already committed: undo the re-stream
                self.members[i].call("stream_abort", m.end_lsn, m.xid, self._view(state, i),
                                     None)
        self._drop_delivered(state, m.commit_lsn)
        for i in state.live:
            view = self._committed_view(state, i, m)
            self.members[i].call("stream_commit", m.end_lsn, m.xid, view, m.commit_lsn)
        if state.held:
            self._replay(state, state.held, replace(base, is_streamed=False), m.commit_lsn,
                         prepared=False)
        self.relations.update(state.relations)
        self._finish(state, m.end_lsn)

    def _on_stream_prepare(self, m: StreamPrepare, lsn: LSN, raw: bytes | None) -> None:
        state = self._streams.pop(m.xid, None)
        if state is None:
            raise PipelineError(f"Stream Prepare of transaction {m.xid}, which was never streamed")
        # The block right before it is what the server streamed at PREPARE (pgoutput takes
        # every prepared transaction at PREPARE, whatever our plugins' filter_prepare says),
        # unless it is the first: the server sends Stream Prepare only for a transaction it
        # streamed before (for its memory limit), else Begin Prepare.
        if self._pending is state and state.blocks == 1:
            self._release_block()
        remainder = state.block
        state.block = None
        if self._pending is state:
            self._pending = None
        if m.gid in self._prepared:  # re-sent after a reconnect; we still hold the original
            for i in state.live:
                self.members[i].call("stream_abort", m.end_lsn, m.xid, self._view(state, i), None)
            if remainder is not None:
                remainder.close()
            self._close(state)
            return
        base = state.base
        for view in (base, *state.views.values()):
            view.final_lsn, view.end_lsn, view.gid = m.prepare_lsn, m.end_lsn, m.gid
            view.prepare_time, view.prepare_lsn, view.is_prepared = (m.prepare_time,
                                                                     m.prepare_lsn, True)
        state.prepare_lsn = m.prepare_lsn
        # A streaming member that takes it at PREPARE gets the rest and stream_prepare, as
        # ReorderBufferStreamCommit does; one without two-phase callbacks, or whose
        # filter_prepare declines, gets nothing now (decode.c's FilterPrepare): the rest,
        # and stream_commit or stream_abort, at COMMIT or ROLLBACK PREPARED.
        streamers, state.live = state.live, []
        taking = []
        for i in streamers:
            member = self.members[i]
            if member.ctx.twophase and not self._filters_prepare(member, base):
                if self._delivered(i, m.prepare_lsn):  # re-sent: undo the re-stream
                    member.call("stream_abort", m.end_lsn, m.xid, self._view(state, i), None)
                    state.outcome_only.append(i)
                    continue
                taking.append(i)
            else:
                state.streamed_held.append(i)
        if remainder is not None:
            deferred = [i for i in taking if i in state.deferred]
            if deferred:
                self._replay_block(state, deferred, remainder)
            if state.streamed_held:
                state.remainder = remainder
            else:
                remainder.close()
        for i in taking:
            state.live.append(i)
            self.members[i].call("stream_prepare", m.end_lsn, m.xid, self._view(state, i),
                                 m.prepare_lsn)
        waiting, state.held = state.held, []
        two_phase = []
        for i in waiting:
            member = self.members[i]
            if member.ctx.twophase and not self._filters_prepare(member, base):
                if not self._delivered(i, m.prepare_lsn):
                    two_phase.append(i)
                else:
                    state.outcome_only.append(i)
            else:
                state.held.append(i)
        if two_phase:
            self._replay(state, two_phase, base, m.prepare_lsn, prepared=True)
            state.live += two_phase
        state.live += state.outcome_only
        self.relations.update(state.relations)
        if not state.held and state.spool is not None:
            state.spool.close()
            state.spool = None
        self._prepared[m.gid] = state
        self._store_held(state, m.end_lsn)
        self._mark([*state.live, *state.skipped, *state.entries], m.end_lsn)
