"""The reorder buffer's state (PostgreSQL's ReorderBuffer struct), and the lookups every
part of it shares: a member's view of a transaction, a relation by id, the Change a row
message describes, who filters a transaction out.

Each job of the buffer is a class built on this one (acknowledge.py, replay.py,
transactions.py, twophase.py, streams.py); ``Pipeline`` (pipeline.py) is all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

from plugin_framework.framework.model import (
    Action,
    Change,
    Relation,
    Row,
    Transaction,
    TruncateChange,
    new_change,
)
from plugin_framework.framework.outputs import Rewinding, capable
from plugin_framework.framework.reorder.members import Member
from plugin_framework.framework.reorder.txn import FastWriter, PipelineError, TxnState
from plugin_framework.framework.spool import SpoolBudget
from plugin_framework.protocol import (
    LSN,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    StreamCommit,
    Truncate,
    Update,
)

# The spools' memory budget, shared by all held transactions (past it they go to disk). The
# server's logical_decoding_work_mem defaults to 64 MB; this client's default is smaller so
# that the whole process stays within about 100 MB (the interpreter and psycopg take about
# 44 MB; spooled entries are packed, so the budget is what they take; docs/performance.md).
DEFAULT_MEMORY_LIMIT = 48 * 1024 * 1024
TRUNCATE_TAG = ord("T")
INSERT_TAG = ord("I")
# the op names of TxnState.counts' pgoutput tags, for Pipeline.delivered
CHANGE_OPS = {ord("I"): "insert", ord("U"): "update", ord("D"): "delete",
              TRUNCATE_TAG: "truncate"}
INSERT, UPDATE, DELETE = Action.INSERT, Action.UPDATE, Action.DELETE
# The most changes _deliver_many hands a formatter at once: its records, joined for the
# output, stay small enough to reuse the same memory run after run (a run of 10,000 lines,
# megabytes, cost more in fresh pages than in formatting; docs/performance.md).
DELIVERY_RUN = 1024


class ReorderBufferState:
    """What the reorder buffer knows between messages."""

    def __init__(self, *, proto_version: int, memory_limit: int, spool_dir: str | None,
                 slot_name: str | None, catalog: Any) -> None:
        self.proto_version = proto_version
        self.decoder = Decoder(proto_version)
        self.members: list[Member] = []
        self.slot_name = slot_name
        self.catalog = catalog
        self.server_version: int | None = None  # see set_server_version
        self.budget = SpoolBudget(memory_limit, spool_dir)
        self.relations: dict[int, Relation] = {}
        self.type_names: dict[int, tuple[str, str]] = {}
        self._txn: TxnState | None = None  # the ordinary or prepared transaction open now
        self._streams: dict[int, TxnState] = {}  # streamed transactions, by xid
        self._stream: TxnState | None = None  # the one whose stream block is open now
        self._prepared: dict[str, TxnState] = {}  # prepared, awaiting their outcome, by gid
        # the streamed transaction whose last block awaits the next message (see txn.Block)
        self._pending: TxnState | None = None
        # Per member: the end LSN of the last transaction it has had (or its output already
        # held when the pipeline started). A transaction whose commit record lies before it
        # was delivered already: the server re-sends such after a reconnect or a crash.
        self._done: list[LSN] = []
        self._position = LSN(0)
        self._started = False
        # Applied to every change before any plugin sees it: returns the change, a transformed
        # one (an UPDATE that becomes an INSERT or DELETE), or None to drop it. Row filters
        # and column lists are built on it. TRUNCATE is never filtered.
        self.change_filter: Callable[[Change], Change | None] | None = None
        # With a change_filter, optionally: per relation, an object whose verdict(data) says
        # on a raw row change (the non-streamed message) what the change_filter would do with
        # it: RAW_DROP (None), RAW_PASS (the change unaltered) or RAW_UNSURE (ask it). None
        # for a relation: always ask. Row filters build one (rowfilter/raw.py) so that the
        # changes they pass go from the raw message to the plugins' formatters undecoded.
        self.raw_change_filter: Callable[[Relation], Any] | None = None
        # The same two for a snapshot's rows (``snapshot_rows``), where they differ: a table
        # synchronization copies rows under other rules than changes (rowfilter: COPY). None:
        # change_filter and raw_change_filter.
        self.snapshot_change_filter: Callable[[Change], Change | None] | None = None
        self.raw_snapshot_change_filter: Callable[[Relation], Any] | None = None
        # TRUNCATE is never filtered by row, but a publication's publish options and its
        # tables decide which relations of a TRUNCATE are delivered: the relations left, or
        # none (then no truncate callback runs).
        self.truncate_filter: Callable[[list[Relation]], list[Relation]] | None = None
        # Called between the changes of a transaction replayed from its spool, where no new
        # message is read for as long as the plugins take: the source answers the server
        # there (a status update that acknowledges nothing new), so that a long replay does
        # not look like a dead client to wal_sender_timeout. It must not feed the pipeline.
        self.keepalive: Callable[[], None] | None = None
        self.transactions = 0  # finished transactions (any outcome), for progress reports
        self.changes = 0
        self.last_commit_time: datetime | None = None  # of the last finished transaction
        # row changes (and TRUNCATEd tables) of committed transactions, by (schema, table,
        # op): insert, update, delete, truncate, snapshot (read by the metrics collector)
        self.delivered: dict[tuple[str, str, str], int] = {}

    @property
    def prepared_held(self) -> int:
        """Prepared transactions received and awaiting COMMIT or ROLLBACK PREPARED."""
        return len(self._prepared)

    # --- a member's part of a transaction -------------------------------------------------------

    def _view(self, state: TxnState, i: int) -> Transaction:
        """Member i's own copy of the transaction (plugins may annotate theirs)."""
        view = state.views.get(i)
        if view is None:
            view = state.views[i] = replace(state.base)
        return view

    def _formatters(self, members: list[tuple[int, Transaction]], rel: Relation | None,
                    lsn: LSN) -> list[FastWriter] | None:
        """Each of ``members`` (index, its view of the transaction) with its ``fast_change``
        formatter for ``rel`` (None for members without one); None if no member has one, or
        ``rel`` is not described (the change callback's path says so)."""
        if rel is None:
            return None
        writers: list[FastWriter] = []
        for i, view in members:
            member = self.members[i]
            write = (member.compile_fast_change(rel, lsn) if member.fast_change is not None
                     else None)
            writers.append((member, view, write))
        return writers if any(w[2] is not None for w in writers) else None

    def _deliver(self, writers: list[FastWriter], data: bytes, lsn: LSN, xid: int,
                 change: Change | None, *, raw: bytes | None = None,
                 decoder: Decoder | None = None, state: TxnState | None = None) -> None:
        """A row change for the members in ``writers``: a member's formatter writes it from
        the raw message ``data`` (a streamed change's without its xid) if it has one and
        takes it; the others get the change callback with ``change``. ``change`` may be None
        when the change_filter would pass it unaltered (there is none, or the raw change
        filter said so): it is then read, once and only if a member needs it, from ``raw``
        (default ``data``) by ``decoder`` in ``state``."""
        for member, view, write in writers:
            if write is not None and member.call_fast_change(write, data, lsn, xid, view):
                continue
            if change is None:
                assert decoder is not None
                message = decoder.decode(data if raw is None else raw)
                assert isinstance(message, Insert | Update | Delete)
                change = self._unfiltered_change(message, lsn, state)
            member.call_change(lsn, xid, view, change)

    def _deliver_many(self, writers: list[FastWriter], datas: list[bytes],
                      lsn: LSN | list[LSN], xid: int, state: TxnState) -> None:
        """``_deliver`` of each of ``datas`` in turn, raw row changes (in the non-streamed
        form) that the change_filter would pass unaltered, at ``lsn`` or at each one's of a
        list of LSNs: a member's formatter takes a run of them in one call where it has
        ``lines``. Each member gets them all before the next one does (each has its own
        output, so only its own order counts)."""
        if len(datas) > DELIVERY_RUN:
            for i in range(0, len(datas), DELIVERY_RUN):
                self._deliver_many(writers, datas[i:i + DELIVERY_RUN],
                                   lsn[i:i + DELIVERY_RUN] if isinstance(lsn, list) else lsn,
                                   xid, state)
            return
        at = lsn if isinstance(lsn, list) else [lsn] * len(datas)  # each change's
        decoder = self.decoder  # (never inside a stream block here)
        # Members whose formatter has no lines(): one change at a time, all together (a
        # change the callback needs is decoded once for them, as feed does).
        single = [w for w in writers if getattr(w[2], "lines", None) is None]
        if single:
            for i, data in enumerate(datas):
                self._deliver(single, data, at[i], xid, None,
                              decoder=decoder, state=state)
        end = len(datas)
        for member, view, write in writers:
            lines = getattr(write, "lines", None)
            if lines is None:
                continue
            declined: list[FastWriter] = [(member, view, None)]  # for the change callback
            i = 0
            while i < end:
                i = member.call_fast_lines(lines, datas, i, lsn, xid, view)
                if i < end:
                    self._deliver(declined, datas[i], at[i], xid, None,
                                  decoder=decoder, state=state)
                    i += 1

    def _raw_verdict(self, rel: Relation | None) -> Callable[[bytes], int] | None:
        """The raw change filter's verdict on a relation's raw row changes, or None when
        they must be decoded and filtered (no raw change filter, or none for it)."""
        if rel is None or self.raw_change_filter is None:
            return None
        try:
            check = self.raw_change_filter(rel)
        except Exception:  # change_filter raises it again, for the change, next
            return None
        return None if check is None else check.verdict

    def _deliver_filtered(self, writers: list[FastWriter], built: Change, data: bytes,
                          lsn: LSN, xid: int) -> None:
        """A row change under the ``change_filter``, ``built`` from its message ``data``:
        passed unaltered (the very object returned), the raw message says exactly what the
        callback would get, so it takes the formatters (``_deliver``); altered (a column
        list, an UPDATE published as an INSERT), it goes to every member's callback."""
        assert self.change_filter is not None
        change = self.change_filter(built)
        if change is built:
            self._deliver(writers, data, lsn, xid, change)
        elif change is not None:
            for member, view, _write in writers:
                member.call_change(lsn, xid, view, change)

    def _committed_view(self, state: TxnState, i: int,
                        m: StreamCommit | CommitPrepared) -> Transaction:
        """Member i's view, with the positions and time of the commit that ends it."""
        view = self._view(state, i)
        view.final_lsn, view.end_lsn, view.commit_time = m.commit_lsn, m.end_lsn, m.commit_time
        return view

    def _savepoint(self, state: TxnState, i: int) -> None:
        output = self.members[i].ctx.output
        if capable(output, Rewinding):
            state.rollbacks.append(partial(output.rollback_to, output.savepoint()))

    def _close(self, state: TxnState) -> None:
        """Release the transaction's spools."""
        if state.spool is not None:
            state.spool.close()
            state.spool = None
        for block in (state.block, state.remainder):
            if block is not None:
                block.close()
        state.block = state.remainder = None
        if self._pending is state:
            self._pending = None

    def _origin_filtered(self, state: TxnState) -> list[int]:
        """The members that skip this transaction: those that filter every origin
        (ctx.filter_all_origins), and those whose filter_by_origin says so."""
        origin = state.base.origin
        if not origin:
            return []
        skipped = []
        for i, m in enumerate(self.members):
            if m.ctx.filter_all_origins or (m.plugin.has("filter_by_origin") and m.call(
                "filter_by_origin", state.base.final_lsn or LSN(0), state.base.xid, origin,
                writes=False,
            )):
                skipped.append(i)
        return skipped

    def _filters_prepare(self, m: Member, base: Transaction) -> bool:
        return bool(m.plugin.has("filter_prepare") and m.call(
            "filter_prepare", base.final_lsn or LSN(0), base.xid, base.xid, base.gid,
            writes=False,
        ))

    # --- what a message describes --------------------------------------------------------------

    def _relation(self, relid: int, state: TxnState | None) -> Relation:
        if state is not None:
            rel = state.relations.get(relid)
            if rel is not None:
                return rel
        try:
            return self.relations[relid]
        except KeyError:
            raise PipelineError(
                f"change for relation OID {relid}, which the stream has not described: "
                "the stream must be read from the slot's start, not from the middle"
            ) from None

    def _change(self, m: Insert | Update | Delete, lsn: LSN,
                state: TxnState | None) -> Change | None:
        """The Change a message describes, after ``change_filter`` (None: filtered out)."""
        change = self._unfiltered_change(m, lsn, state)
        if self.change_filter is not None:
            return self.change_filter(change)
        return change

    def _unfiltered_change(self, m: Insert | Update | Delete, lsn: LSN,
                           state: TxnState | None) -> Change:
        """The Change a message describes."""
        rel = self._relation(m.relation_id, state)
        change: Change
        if type(m) is Insert:
            change = new_change(INSERT, rel, Row(rel, m.new), None, False, lsn, m.xid)
        elif type(m) is Update:
            before = m.key if m.key is not None else m.old
            change = new_change(UPDATE, rel, Row(rel, m.new),
                                None if before is None else Row(rel, before), m.key is not None,
                                lsn, m.xid)
        else:
            assert isinstance(m, Delete)
            before = m.key if m.key is not None else m.old
            assert before is not None
            change = new_change(DELETE, rel, None, Row(rel, before), m.key is not None, lsn,
                                m.xid)
        return change

    def _truncate_args(self, m: Truncate, lsn: LSN,
                       state: TxnState | None) -> tuple[Any, ...] | None:
        """(relations, TruncateChange), after ``truncate_filter`` (None: nothing left)."""
        rels = [self._relation(r, state) for r in m.relation_ids]
        if self.truncate_filter is not None:
            rels = self.truncate_filter(rels)
            if not rels:
                return None
        return rels, TruncateChange(m.cascade, m.restart_identity, lsn, m.xid)
