"""Replay of a held transaction from its spool: what ReorderBufferReplay does for a
transaction whose changes were kept (and possibly spilled to disk) until its outcome.

Plugins that receive a streamed or prepared transaction only whole get it here, at its
Stream Commit, PREPARE or COMMIT PREPARED, with aborted subtransactions left out. Their row
changes take the plugins' ``fast_change`` formatters as a live transaction's do. A stream
block held back from streaming plugins (``txn.Block``) is delivered here too, as a block.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from plugin_framework.framework.model import Relation, Transaction
from plugin_framework.framework.reorder.buffer import DELIVERY_RUN, ReorderBufferState
from plugin_framework.framework.reorder.txn import (
    RAW_PASS,
    RAW_UNSURE,
    UNPLANNED,
    Block,
    FastWriter,
    TxnState,
)
from plugin_framework.framework.spool import Spool
from plugin_framework.protocol import (
    ID_AFTER_TAG,
    LSN,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    RelationMessage,
    Truncate,
    Update,
)

_XID = struct.Struct(">I")


class Replay(ReorderBufferState):
    """Delivers held transactions from their spools."""

    def _replay(self, state: TxnState, members: list[int], txn: Transaction, final_lsn: LSN,
                *, prepared: bool) -> None:
        """Deliver a held transaction from its spool as begin (or begin_prepare), its changes,
        and commit (or prepare)."""
        views = {i: replace(txn) for i in members}
        for i in members:
            state.views[i] = views[i]
            self.members[i].call("begin_prepare" if prepared else "begin",
                                 txn.first_lsn or LSN(0), txn.xid, views[i])
        spool = state.spool
        if spool is not None:
            decoder = Decoder(self.proto_version)
            overlay = TxnState(txn, relations={relid: rel for relid, rel
                                               in state.replay_relations.items()
                                               if rel is not None})
            aborted = state.aborted_subxids
            keepalive = self.keepalive
            # the fast path, as for a live transaction: per relation id, the members with
            # their formatters for the relation in force at that point of the replay
            fast: dict[int, list[FastWriter] | None] | None = None
            if any(self.members[i].fast_change is not None for i in members):
                fast = {}
            # under a change_filter: per relation id, the raw change filter's verdicts
            verdicts: dict[int, Callable[[bytes], int] | None] = {}
            # a run of changes that the same formatters take as they are: delivered in one
            # go (``_deliver_many``, each at its LSN) before anything else is
            run: list[bytes] = []
            run_lsns: list[LSN] = []
            run_writers: list[FastWriter] = []

            def deliver_run() -> None:
                if keepalive is not None:
                    keepalive()
                self._deliver_many(run_writers, run, run_lsns, txn.xid, overlay)
                run.clear()  # (nothing keeps them: lines() and the outputs copy)
                run_lsns.clear()

            # a run of one relation's changes of one (sub)transaction at a time (read_run),
            # in the formatters' form (a streamed change without its xid) when they exist
            for datas, lsns, xid, in_stream, is_run, _ in spool.runs(strip=fast is not None):
                if keepalive is not None:
                    keepalive()
                if xid and xid in aborted:
                    continue
                if is_run and fast is not None:
                    relid = ID_AFTER_TAG.unpack_from(datas[0], 1)[0]
                    writers = fast.get(relid, UNPLANNED)
                    if writers is UNPLANNED:
                        rel = overlay.relations.get(relid)
                        if rel is None:
                            rel = self.relations.get(relid)
                        writers = fast[relid] = self._formatters(
                            [(i, views[i]) for i in members], rel, lsns[0])
                        if self.change_filter is not None:
                            verdicts[relid] = self._raw_verdict(rel)
                    if writers is not None and self.change_filter is None:
                        # every change passes as it is: the run joins the one to deliver
                        if writers is not run_writers:
                            if run:
                                deliver_run()
                            run_writers = writers
                        run.extend(datas)
                        run_lsns.extend(lsns)
                        if len(run) >= DELIVERY_RUN:
                            deliver_run()
                        continue
                    if writers is not None:
                        check = verdicts[relid]
                        for k, data in enumerate(datas):
                            verdict = RAW_UNSURE if check is None else check(data)
                            if verdict == RAW_PASS:
                                if writers is not run_writers or len(run) >= DELIVERY_RUN:
                                    if run:
                                        deliver_run()
                                    run_writers = writers
                                run.append(data)
                                run_lsns.append(lsns[k])
                            elif verdict == RAW_UNSURE:
                                if run:
                                    deliver_run()
                                if keepalive is not None:
                                    keepalive()
                                decoder.in_stream = in_stream
                                message = decoder.decode(_spooled(data, xid, in_stream))
                                assert isinstance(message, Insert | Update | Delete)
                                self._deliver_filtered(
                                    writers, self._unfiltered_change(message, lsns[k], overlay),
                                    data, lsns[k], txn.xid)
                        continue
                if run:
                    deliver_run()
                decoder.in_stream = in_stream
                for k, data in enumerate(datas):
                    if keepalive is not None:  # (a plugin's callbacks may take their time)
                        keepalive()
                    msg = decoder.decode(_spooled(data, xid, in_stream) if is_run
                                         and fast is not None else data)
                    if fast is not None and isinstance(msg, RelationMessage):
                        fast.pop(msg.relation_id, None)  # formatters of the old description
                    self._replay_one(msg, lsns[k], members, views, overlay)
            if run:
                deliver_run()
        end = txn.end_lsn or final_lsn
        for i in members:
            if prepared:
                self.members[i].call("prepare", end, txn.xid, views[i], final_lsn)
            else:
                self.members[i].call("commit", end, txn.xid, views[i], final_lsn)

    def _replay_block(self, state: TxnState, members: list[int], block: Block) -> None:
        """Deliver a held-back stream block to ``members``: stream_start, its items,
        stream_stop, at the LSNs the server sent them with."""
        xid = state.base.xid
        views = {i: self._view(state, i) for i in members}
        for i in members:
            self.members[i].call("stream_start", block.start_lsn, xid, views[i])
        decoder = Decoder(self.proto_version)
        decoder.in_stream = True
        overlay = TxnState(state.base, relations=dict(block.relations))
        for lsn, _subxid, _in_stream, raw in block.spool:
            msg = decoder.decode(raw)
            if isinstance(msg, LogicalMessage):
                args: tuple[Any, ...] | None = (msg.lsn, msg.transactional, msg.prefix,
                                                msg.content)
                cb = "stream_message"
            elif isinstance(msg, Truncate):
                args, cb = self._truncate_args(msg, lsn, overlay), "stream_truncate"
            elif isinstance(msg, (Insert, Update, Delete)):
                change = self._change(msg, lsn, overlay)
                args = None if change is None else (change.relation, change)
                cb = "stream_change"
            else:
                if isinstance(msg, RelationMessage):
                    overlay.relations[msg.relation_id] = Relation.from_message(
                        msg, self.type_names)
                continue
            if args is None:
                continue
            for i in members:
                member = self.members[i]
                if member.plugin.has(cb):  # records carry the top-level xid, as in C
                    member.call(cb, lsn, xid, views[i], *args)
        for i in members:
            self.members[i].call("stream_stop", block.stop_lsn, xid, views[i])

    def _stream_commit_held(self, state: TxnState, m: CommitPrepared) -> None:
        """COMMIT PREPARED for the streaming members that did not take the transaction at
        PREPARE: as ReorderBufferCommit does for a streamed transaction (decode.c decodes
        COMMIT PREPARED as a plain commit when FilterPrepare says so), the rest of it as
        one more block, then stream_commit. Not a prepared transaction for them."""
        members = state.streamed_held
        if not members:
            return
        for i in members:
            view = self._committed_view(state, i, m)
            view.is_prepared = False
        remainder = state.remainder
        if state.catalog_changes:
            # the commit's invalidations end the block, or make one of their own
            if remainder is None:
                remainder = state.remainder = Block(Spool(self.budget), {}, m.commit_lsn)
            remainder.stop_lsn = m.commit_lsn
        if remainder is not None:
            self._replay_block(state, members, remainder)
        for i in members:
            self.members[i].call("stream_commit", m.end_lsn, state.base.xid,
                                 self._view(state, i), m.commit_lsn)

    def _stream_abort_held(self, state: TxnState, end_lsn: LSN) -> None:
        """ROLLBACK PREPARED for those members: ReorderBufferAbort's stream_abort for each
        subtransaction they had changes of (in the record's order: ascending xids), then
        for the transaction; the rest of it never reaches them."""
        members = state.streamed_held
        if not members:
            return
        top = state.base.xid
        subxids = sorted(state.streamed_subxids, key=lambda x: (x - top) % (1 << 32))
        for i in members:
            view = self._view(state, i)
            view.is_prepared = False
            for subxid in subxids:
                sub = Transaction(subxid, toptxn=view, is_streamed=True)
                self.members[i].call("stream_abort", end_lsn, subxid, sub, None)
            self.members[i].call("stream_abort", end_lsn, top, view, None)

    def _replay_one(self, msg: Message, lsn: LSN, members: list[int],
                    views: dict[int, Transaction], overlay: TxnState) -> None:
        if isinstance(msg, RelationMessage):
            overlay.relations[msg.relation_id] = Relation.from_message(msg, self.type_names)
            return
        args: tuple[Any, ...]
        if isinstance(msg, (Insert, Update, Delete)):
            change = self._change(msg, lsn, overlay)
            if change is not None:
                for i in members:
                    self.members[i].call_change(lsn, views[i].xid, views[i], change)
            return
        elif isinstance(msg, Truncate):
            truncated = self._truncate_args(msg, lsn, overlay)
            if truncated is None:
                return
            cb, args = "truncate", truncated
        elif isinstance(msg, LogicalMessage):
            cb, args = "message", (msg.lsn, msg.transactional, msg.prefix, msg.content)
        else:
            return  # Origin and Type carry nothing to replay
        for i in members:
            member = self.members[i]
            if member.plugin.has(cb):
                member.call(cb, lsn, views[i].xid, views[i], *args)


def _spooled(data: bytes, xid: int, in_stream: bool) -> bytes:
    """A streamed row change as it was spooled, from its formatters' form (``data``, without
    the xid after its tag); any other message as it is."""
    return data[:1] + _XID.pack(xid) + data[1:] if in_stream else data
