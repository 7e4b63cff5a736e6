"""Replay of a held transaction from its spool: what ReorderBufferReplay does for a
transaction whose changes were kept (and possibly spilled to disk) until its outcome.

Plugins that receive a streamed or prepared transaction only whole get it here, at its
Stream Commit, PREPARE or COMMIT PREPARED, with aborted subtransactions left out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from plugin_framework.framework.model import Relation, Transaction
from plugin_framework.framework.reorder.buffer import ReorderBufferState
from plugin_framework.framework.reorder.txn import TxnState
from plugin_framework.protocol import (
    LSN,
    Decoder,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    RelationMessage,
    Truncate,
    Update,
)


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
            for lsn, xid, in_stream, raw in spool:
                if keepalive is not None:
                    keepalive()
                if xid and xid in aborted:
                    continue
                decoder.in_stream = in_stream
                msg = decoder.decode(raw)
                self._replay_one(msg, lsn, members, views, overlay)
        end = txn.end_lsn or final_lsn
        for i in members:
            if prepared:
                self.members[i].call("prepare", end, txn.xid, views[i], final_lsn)
            else:
                self.members[i].call("commit", end, txn.xid, views[i], final_lsn)

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
