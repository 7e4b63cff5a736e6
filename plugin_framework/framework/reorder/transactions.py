"""Ordinary transactions and the opening of prepared ones: BEGIN (or BEGIN PREPARE) decides
who gets the transaction live and who later, COMMIT ends it (ReorderBufferCommit's job for a
transaction that was not streamed). Also which formatters their row changes take on the
fast path (``fast_change``; delivered by ``ReorderBufferState._deliver``).
"""

from __future__ import annotations

from plugin_framework.framework.model import Transaction
from plugin_framework.framework.reorder.holding import Holding
from plugin_framework.framework.reorder.txn import FastWriter, PipelineError, TxnState
from plugin_framework.framework.spool import Spool
from plugin_framework.protocol import LSN, Begin, BeginPrepare, Commit


class Transactions(Holding):
    """BEGIN, BEGIN PREPARE and COMMIT."""

    def _on_begin(self, m: Begin, lsn: LSN, raw: bytes | None) -> None:
        self._open(Transaction(m.xid, final_lsn=m.final_lsn, commit_time=m.commit_time,
                               first_lsn=lsn))

    def _on_begin_prepare(self, m: BeginPrepare, lsn: LSN, raw: bytes | None) -> None:
        restored = self._prepared.get(m.gid)
        if restored is not None and restored.restored:
            self._drop_restored(restored)  # the server sends it again: take the new copy
        self._open(Transaction(m.xid, final_lsn=m.prepare_lsn, end_lsn=m.end_lsn, gid=m.gid,
                               prepare_time=m.prepare_time, prepare_lsn=m.prepare_lsn,
                               is_prepared=True, first_lsn=lsn))

    def _open(self, txn: Transaction) -> None:
        if self._txn is not None:
            raise PipelineError(
                f"transaction {txn.xid} began before transaction {self._txn.base.xid} ended"
            )
        self._txn = TxnState(txn)

    def _current(self, what: str) -> TxnState:
        state = self._txn
        if state is None:
            raise PipelineError(f"{what} outside of a transaction")
        if not state.started:
            self._start(state)
        return state

    def _start(self, state: TxnState) -> None:
        """Decide, once the origin is known, who gets this transaction live and who later."""
        state.started = True
        base = state.base
        # A re-sent PREPARE of a transaction whose spool we still hold is skipped by all.
        resent = base.is_prepared and base.gid in self._prepared
        state.skipped = self._origin_filtered(state)
        for i, m in enumerate(self.members):
            if i in state.skipped:
                continue
            if not base.is_prepared:
                if self._delivered(i, base.final_lsn):
                    state.skipped.append(i)
                    continue
                state.live.append(i)
                self._savepoint(state, i)
                m.call("begin", base.first_lsn or LSN(0), base.xid, self._view(state, i))
            elif m.ctx.twophase and not self._filters_prepare(m, base):
                if resent or self._delivered(i, base.final_lsn):
                    state.skipped.append(i)
                    if not resent:
                        state.outcome_only.append(i)
                    continue
                state.live.append(i)
                self._savepoint(state, i)
                m.call("begin_prepare", base.first_lsn or LSN(0), base.xid,
                       self._view(state, i))
            elif resent:
                state.skipped.append(i)
            else:
                # It gets the transaction at COMMIT PREPARED; whether it already had it is
                # told by that record's LSN, not this one's.
                state.held.append(i)
        if state.held:
            state.spool = Spool(self.budget)
        if any(self.members[i].fast_change is not None for i in state.live):
            if self.change_filter is None:
                state.fast = {}
            else:
                state.filtered_fast = {}
                if self.raw_change_filter is not None:
                    state.fast, state.raw_filters = {}, {}

    def _on_commit(self, m: Commit, lsn: LSN, raw: bytes | None) -> None:
        state = self._current("commit")
        if state.base.is_prepared:
            raise PipelineError("Commit message ends a transaction begun by Begin Prepare")
        self._txn = None
        for view in (state.base, *state.views.values()):
            view.end_lsn, view.commit_time = m.end_lsn, m.commit_time
        for i in state.live:
            self.members[i].call("commit", m.end_lsn, state.base.xid, state.views[i],
                                 m.commit_lsn)
        self._finish(state, m.end_lsn)

    # --- the fast path: the fast_change callback ------------------------------------------------

    def _plan_writers(self, state: TxnState, relid: int) -> list[FastWriter] | None:
        """The formatters of a live transaction's changes of a relation, kept in
        ``state.fast``: ``_fast_writers``, or ``_raw_filtered_writers`` under a change filter
        with raw verdicts."""
        assert state.fast is not None
        writers = state.fast[relid] = (
            self._fast_writers(state, relid) if state.raw_filters is None
            else self._raw_filtered_writers(state, relid))
        return writers

    def _fast_writers(self, state: TxnState, relid: int) -> list[FastWriter] | None:
        """Each live member's fast_change formatter for a relation (see ``_formatters``), for
        the caches ``state.fast`` and ``state.filtered_fast``."""
        return self._formatters([(i, self._view(state, i)) for i in state.live],
                                self.relations.get(relid), state.base.first_lsn or LSN(0))

    def _raw_filtered_writers(self, state: TxnState, relid: int) -> list[FastWriter] | None:
        """Under a change_filter, the formatters for a relation (``_fast_writers``) when the
        raw change filter decides on its raw changes (its verdict then goes in
        ``state.raw_filters``); None when it does not (they are decoded and filtered)."""
        assert state.raw_filters is not None
        verdict = self._raw_verdict(self.relations.get(relid))
        if verdict is None:
            return None
        writers = self._fast_writers(state, relid)
        if writers is not None:
            state.raw_filters[relid] = verdict
        return writers
