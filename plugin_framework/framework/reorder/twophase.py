"""Prepared transactions: PREPARE, COMMIT PREPARED and ROLLBACK PREPARED (the two-phase part
of reorderbuffer.c: ReorderBufferPrepare, ReorderBufferFinishPrepared).

Two-phase plugins get a prepared transaction at PREPARE (unless filter_prepare says no) and
its outcome later; the others get it whole at COMMIT PREPARED, and nothing at ROLLBACK
PREPARED. A re-sent PREPARE of one still held is skipped.
"""

from __future__ import annotations

from dataclasses import replace

from plugin_framework.framework.model import Transaction
from plugin_framework.framework.reorder.replay import Replay
from plugin_framework.framework.reorder.transactions import Transactions
from plugin_framework.framework.reorder.txn import PipelineError, TxnState
from plugin_framework.protocol import LSN, CommitPrepared, Prepare, RollbackPrepared


class TwoPhase(Transactions, Replay):
    """PREPARE and the outcome of a prepared transaction."""

    def _on_prepare(self, m: Prepare, lsn: LSN, raw: bytes | None) -> None:
        state = self._current("prepare")
        if not state.base.is_prepared:
            raise PipelineError("Prepare message ends a transaction begun by Begin")
        self._txn = None
        state.prepare_lsn = m.prepare_lsn
        for i in state.live:
            self.members[i].call("prepare", m.end_lsn, state.base.xid, state.views[i],
                                 m.prepare_lsn)
        if m.gid in self._prepared:  # a re-send of one we hold: keep the original
            self._close(state)
            return
        self._prepared[m.gid] = state
        if state.held:
            # Replayed at COMMIT PREPARED, after later transactions may have described its
            # tables anew: keep the definitions its changes were made with.
            for relid, rel in self.relations.items():
                state.replay_relations.setdefault(relid, rel)
        self._store_held(state, m.end_lsn)
        self._mark([*state.live, *state.skipped, *state.entries], m.end_lsn)
        state.live += state.outcome_only  # from now on, they wait for the outcome too

    def _on_commit_prepared(self, m: CommitPrepared, lsn: LSN, raw: bytes | None) -> None:
        state = self._outcome_of(m.gid, m.xid, m.end_lsn)
        if state is None:
            state = self._unseen_prepared(m.xid, m.gid, m.commit_lsn, committed=True)
        base = state.base
        base.final_lsn, base.end_lsn, base.commit_time = m.commit_lsn, m.end_lsn, m.commit_time
        self._drop_delivered(state, m.commit_lsn)
        # As ReorderBufferFinishPrepared does, final_lsn becomes the COMMIT PREPARED's LSN.
        for i in state.live:
            view = self._committed_view(state, i, m)
            self.members[i].call("commit_prepared", m.end_lsn, base.xid, view, m.commit_lsn)
        self._stream_commit_held(state, m)
        if state.held:
            ordinary = replace(base, final_lsn=m.commit_lsn, is_prepared=False)
            self._replay(state, state.held, ordinary, m.commit_lsn, prepared=False)
        self._finish(state, m.end_lsn)

    def _on_rollback_prepared(self, m: RollbackPrepared, lsn: LSN, raw: bytes | None) -> None:
        state = self._outcome_of(m.gid, m.xid, m.rollback_end_lsn)
        if state is None:
            state = self._unseen_prepared(m.xid, m.gid, LSN(m.rollback_end_lsn - 1),
                                          committed=False)
        self._drop_delivered(state, LSN(m.rollback_end_lsn - 1))
        # As in C, the rollback's time goes where a commit's would (txn->xact_time).
        state.base.end_lsn, state.base.commit_time = m.rollback_end_lsn, m.rollback_time
        for i in state.live:
            view = self._view(state, i)
            view.end_lsn, view.commit_time = m.rollback_end_lsn, m.rollback_time
            self.members[i].call("rollback_prepared", m.rollback_end_lsn, state.base.xid, view,
                                 m.prepare_end_lsn, m.prepare_time)
        self._stream_abort_held(state, m.rollback_end_lsn)
        self._finish(state, m.rollback_end_lsn, committed=False)

    def _outcome_of(self, gid: str, xid: int, end_lsn: LSN) -> TxnState | None:
        """The prepared transaction a COMMIT or ROLLBACK PREPARED ends (None: never seen),
        its entries recorded as delivered. A restored one of another xid had its outcome
        delivered before its gid was used again (an entry a crash left behind)."""
        state = self._prepared.pop(gid, None)
        if state is not None and state.base.xid != xid and state.restored:
            self._record_outcome(state, LSN(0))
            self._close(state)
            state = None
        if state is not None:
            self._record_outcome(state, end_lsn)
        return state

    def _unseen_prepared(self, xid: int, gid: str, lsn: LSN, *, committed: bool) -> TxnState:
        """COMMIT/ROLLBACK PREPARED of a transaction whose PREPARE this pipeline never saw
        (acknowledged by an earlier run, or decoded before the slot did two-phase): only
        two-phase plugins can take it, unless a plugin's output already holds the outcome.
        A rollback owes the other plugins nothing; a commit's changes are gone for them."""
        state = TxnState(Transaction(xid, gid=gid, is_prepared=True), started=True)
        for i, m in enumerate(self.members):
            if self._delivered(i, lsn):
                continue
            if not m.ctx.twophase:
                if not committed:
                    continue
                raise PipelineError(
                    f'prepared transaction "{gid}" was prepared before this pipeline started, '
                    f'and output plugin "{m.plugin.name}" has no two-phase callbacks to receive '
                    "it: its changes are no longer in the slot"
                )
            state.live.append(i)
        return state
