"""Prepared transactions held durably for the members that await their outcome (hold.py):
stored at PREPARE, restored when a pipeline starts, released once the outcome is durable.

A member that gets a prepared transaction only at COMMIT PREPARED (``held``: no two-phase
callbacks, or its filter_prepare declined; ``streamed_held``: the same, but it had stream
blocks of it) would keep the acknowledgement at the PREPARE for as long as the transaction
stays prepared. A member whose output can hold it (a regular file's ``FileOutput.hold``) gets
it stored instead, and is marked past the PREPARE like the others: the slot moves on, a
fast shutdown does not wait, and a restart finds the transaction in the entry.

A restored transaction is one the server will not send again. If it does (another output
lagged, so the slot was not confirmed past the PREPARE), the restored copy is dropped and
the re-sent one taken as new, exactly as on a first run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from plugin_framework.framework.hold import STREAM, WHOLE, HeldTransaction, HoldStore
from plugin_framework.framework.model import Relation, Transaction
from plugin_framework.framework.outputs import Resuming, capable
from plugin_framework.framework.reorder.acknowledge import Acknowledgement
from plugin_framework.framework.reorder.txn import Block, PipelineError, TxnState
from plugin_framework.framework.spool import Entry, Spool
from plugin_framework.protocol import LSN, Decoder, Truncate
from plugin_framework.protocol.raw import ID_AFTER_TAG, ROW_CHANGE_TAGS

log = logging.getLogger("pgdecode.pipeline")

_RELATION, _TRUNCATE = ord("R"), ord("T")


class Holding(Acknowledgement):
    """Storing, restoring and releasing held prepared transactions."""

    def _hold_of(self, i: int) -> HoldStore | None:
        output = self.members[i].ctx.output
        return output.hold if capable(output, Resuming) else None

    def _store_held(self, state: TxnState, prepare_end: LSN) -> None:
        """At PREPARE: write an entry for each waiting member whose output can hold one
        (the entry of a kind is made once, and saved to each of those outputs)."""
        for kind, members in ((WHOLE, state.held), (STREAM, state.streamed_held)):
            stores = [(i, store) for i in members if (store := self._hold_of(i)) is not None]
            if not stores:
                continue
            held = self._held(state, kind, prepare_end)
            for i, store in stores:
                state.entries[i] = store.save(held)

    def _held(self, state: TxnState, kind: str, prepare_end: LSN) -> HeldTransaction:
        """What an entry of ``kind`` holds of a prepared transaction."""
        if kind == WHOLE:
            spool: Spool | None = state.spool
            start = {relid: rel for relid, rel in state.replay_relations.items()
                     if rel is not None}
            start_map = {**self.relations, **start}
        else:
            block = state.remainder
            spool = block.spool if block is not None else None
            start_map = block.relations if block is not None else {}
        frames: list[Entry] | Spool = spool if spool is not None else []
        return HeldTransaction(
            kind=kind, slot=self.slot_name, txn=state.base, prepare_end=prepare_end,
            relations=self._needed_relations(frames, start_map),
            aborted_subxids=set(state.aborted_subxids),
            streamed_subxids=set(state.streamed_subxids),
            catalog_changes=state.catalog_changes,
            remainder_lsns=(None if kind == WHOLE or state.remainder is None
                            else (state.remainder.start_lsn, state.remainder.stop_lsn)),
            frames=frames,
        )

    def _needed_relations(self, frames: Iterable[Entry],
                          start: dict[int, Relation]) -> dict[int, Relation]:
        """The definitions the frames' changes are read with that the frames do not give
        themselves (a relation described before the transaction began)."""
        described: set[int] = set()
        needed: dict[int, Relation] = {}
        decoder = Decoder(self.proto_version)
        for _lsn, _xid, in_stream, raw in frames:
            tag = raw[0]
            offset = 5 if in_stream else 1  # a stream block's messages carry an xid first
            if tag in ROW_CHANGE_TAGS or tag == _RELATION:
                relids: tuple[int, ...] = (ID_AFTER_TAG.unpack_from(raw, offset)[0],)
            elif tag == _TRUNCATE:
                decoder.in_stream = in_stream
                message = decoder.decode(raw)
                assert isinstance(message, Truncate)
                relids = message.relation_ids
            else:
                continue
            for relid in relids:
                if tag == _RELATION:
                    described.add(relid)
                elif relid not in described and relid not in needed:
                    rel = start.get(relid)
                    if rel is None:
                        raise PipelineError(
                            f"prepared transaction changes relation OID {relid}, which the "
                            "stream has not described")
                    needed[relid] = rel
        return needed

    def _record_outcome(self, state: TxnState, end_lsn: LSN) -> None:
        """The transaction's outcome is being delivered: its entries go once durable."""
        for i, path in state.entries.items():
            store = self._hold_of(i)
            if store is not None:
                store.outcome(path, end_lsn)

    def _drop_restored(self, state: TxnState) -> None:
        """The server sends a restored transaction again: take the new copy instead. Members
        with its old stream blocks are told to abort them first (the server streams it
        again from its start), as after a lost connection."""
        assert state.base.gid is not None
        del self._prepared[state.base.gid]
        for i in state.streamed_held:
            self.members[i].call("stream_abort", LSN(0), state.base.xid,
                                 self._view(state, i), None)
        self._close(state)

    def _restored(self, xid: int) -> TxnState | None:
        """The restored prepared transaction of ``xid``, if any."""
        for state in self._prepared.values():
            if state.restored and state.base.xid == xid:
                return state
        return None

    def _load_held(self) -> dict[int, list[HeldTransaction]]:
        """At startup, first: the entries each output holds (damaged ones refused)."""
        return {i: store.load(self.budget) for i in range(len(self.members))
                if (store := self._hold_of(i)) is not None}

    def _restore_held(self, loaded: dict[int, list[HeldTransaction]]) -> None:
        """At startup: the prepared transactions the outputs hold (``_load_held``), back into
        ``_prepared``."""
        restored: dict[str, TxnState] = {}
        for i, entries in loaded.items():
            store = self._hold_of(i)
            assert store is not None
            for held in entries:
                gid = held.txn.gid
                assert gid is not None
                if held.slot is not None and self.slot_name is not None \
                        and held.slot != self.slot_name:
                    raise PipelineError(
                        f"{held.path} holds a prepared transaction of replication slot "
                        f'"{held.slot}", not "{self.slot_name}"')
                done = self._done[i]
                if done < held.prepare_end or (held.outcome_end is not None
                                               and done >= held.outcome_end):
                    # The output was not durable past its PREPARE (the server sends the
                    # transaction again), or it already has the outcome.
                    store.discard(held)
                    continue
                state = restored.get(gid)
                if state is not None and state.base.xid != held.txn.xid:
                    # The gid was used again: the older transaction's outcome is before the
                    # newer PREPARE, which the output is durable past.
                    if state.prepare_lsn is not None and state.prepare_lsn > held.prepare_end:
                        store.discard(held)
                        continue
                    state = None
                if state is None:
                    state = restored[gid] = TxnState(held.txn, started=True, restored=True)
                    state.prepare_lsn = held.txn.prepare_lsn or held.txn.final_lsn
                self._restore_into(state, i, held)
        for gid, state in restored.items():
            self._restore_others(state)
            self._prepared[gid] = state
            log.info('holding prepared transaction "%s" (xid %d) from %s until its COMMIT or '
                     "ROLLBACK PREPARED", gid, state.base.xid,
                     ", ".join(str(p.parent) for p in state.entries.values()))

    def _restore_into(self, state: TxnState, i: int, held: HeldTransaction) -> None:
        assert held.path is not None
        spool = held.frames
        assert isinstance(spool, Spool)
        if held.kind == WHOLE:
            state.held.append(i)
            state.spool = spool
            state.replay_relations = dict(held.relations)
            state.aborted_subxids = set(held.aborted_subxids)
        else:
            state.streamed_held.append(i)
            if held.remainder_lsns is not None:
                start, stop = held.remainder_lsns
                state.remainder = Block(spool, dict(held.relations), start, stop)
            state.streamed_subxids = set(held.streamed_subxids)
            state.catalog_changes = held.catalog_changes
        state.entries[i] = held.path

    def _restore_others(self, state: TxnState) -> None:
        """The members without an entry for a restored transaction: as for a COMMIT PREPARED
        whose PREPARE was never seen (TwoPhase._unseen_prepared), a two-phase member gets
        its outcome; another gets it whole from the entry, if an entry holds it whole."""
        base: Transaction = state.base
        skipped = set(self._origin_filtered(state))
        for j, m in enumerate(self.members):
            if j in state.entries or j in skipped:
                continue
            if m.ctx.twophase and not self._filters_prepare(m, base):
                state.live.append(j)
            elif state.spool is not None:
                state.held.append(j)  # no entry: it keeps the acknowledgement at PREPARE
            else:
                paths = ", ".join(str(p) for p in state.entries.values())
                raise PipelineError(
                    f'prepared transaction "{base.gid}" is held in {paths} only as the rest '
                    f'of its stream, and output plugin "{m.plugin.name}" (not in the run '
                    "that held it) would need it whole at COMMIT PREPARED. Run without that "
                    "plugin until the transaction is committed or rolled back")
