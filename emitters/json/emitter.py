"""JsonEmitter: the json emitter's callbacks, and its state per decoding context."""

from __future__ import annotations

import binascii
from typing import Any, Final

import orjson

from emitters.json.debezium import DebeziumEnvelope
from emitters.json.fast import FAST_PATH_BUILT
from emitters.json.options import DEBEZIUM_OPTIONS, JSON_ONLY_OPTIONS, OPTIONS
from emitters.json.relation import JsonRelationPlan, opaque_columns, row, row_mixed
from emitters.options import OptionError, parse_options
from plugin_framework import LSN, OutputPlugin
from plugin_framework.framework import KIND_BINARY
from plugin_framework.pgtypes import TypeConverters

__all__ = ["JsonEmitter"]

_dumps: Final = orjson.dumps


def _lsn(value: Any) -> str | None:
    return None if value is None else str(value)


def _txn_fields(txn: Any) -> bytes:
    """The transaction's part of every line of it: ``,"xid":...`` up to the origin, and gid
    and phase for a prepared transaction."""
    fields: dict[str, Any] = {"xid": None if txn.is_snapshot else txn.xid}
    if txn.gid is not None and txn.is_prepared:
        fields.update(commit_lsn=None, commit_time=None, origin=txn.origin, gid=txn.gid,
                      phase="prepare", prepare_lsn=_lsn(txn.final_lsn),
                      prepare_time=txn.prepare_time)
    else:
        fields.update(commit_lsn=_lsn(txn.final_lsn), commit_time=txn.commit_time,
                      origin=txn.origin)
        if txn.gid is not None:
            fields.update(gid=txn.gid, phase="commit_prepared")
    return b"," + _dumps(fields)[1:-1]


def _txn_bytes(txn: Any) -> bytes:
    cached = txn.output_plugin_private
    if type(cached) is not bytes:
        cached = txn.output_plugin_private = _txn_fields(txn)
    return cached


_NO_TXN: Final = b',"xid":null,"commit_lsn":null,"commit_time":null,"origin":null'


class _State:
    """One decoding context's options, converters and per-relation plans."""

    __slots__ = ("envelope", "events", "last", "plans", "snapshot", "types")

    def __init__(self, options: dict[str, Any], catalog: Any) -> None:
        self.types = TypeConverters(numeric_as=options["numeric-as"], bytea=options["bytea"],
                                    catalog=catalog)
        self.events: bool = options["include-transaction-events"]
        # by Relation object: a new description, a new plan
        self.plans: dict[Any, JsonRelationPlan] = {}
        self.last: tuple[Any, JsonRelationPlan | None] = (None, None)
        self.snapshot = False  # the transaction begun last holds snapshot rows
        self.envelope: DebeziumEnvelope | None = None  # -o envelope=debezium

    def plan(self, relation: Any) -> JsonRelationPlan:
        last, plan = self.last
        if relation is last and plan is not None:
            return plan
        plan = self.plans.get(relation)
        if plan is None:
            plan = self.plans[relation] = JsonRelationPlan(relation, self.types)
        self.last = (relation, plan)
        return plan


class JsonEmitter(OutputPlugin):
    """JSON Lines: one object per row change, truncated table and logical message; with
    options, per transaction boundary. See docs/json-format.md."""

    name = "json"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        given = ctx.output_plugin_options or {}
        values = parse_options(OPTIONS, given)
        state = ctx.output_plugin_private = _State(values, ctx.catalog)
        if values["envelope"] == "debezium":
            wrong = sorted(JSON_ONLY_OPTIONS.intersection(given))
            if wrong:
                raise OptionError(f'option "{wrong[0]}" does not apply to envelope=debezium')
            state.envelope = DebeziumEnvelope(values, ctx.catalog, ctx.slot_name)
        else:
            wrong = sorted(DEBEZIUM_OPTIONS.intersection(given))
            if wrong:
                raise OptionError(f'option "{wrong[0]}" applies only to envelope=debezium')
        if not values["two-phase"]:
            ctx.twophase = False  # prepared transactions then arrive whole, at COMMIT PREPARED

    def fast_change(self, ctx: Any, relation: Any) -> Any:
        """The relation's C formatter (docs/framework.md, "fast_change"); None where the C
        module is not built, so every change goes through ``change``. It is asked once per
        transaction, after ``begin``: a snapshot transaction's gets the snapshot head."""
        state = ctx.output_plugin_private
        if not FAST_PATH_BUILT or state.envelope is not None:
            return None
        plan = state.plan(relation)
        return plan.fast_snapshot() if state.snapshot else plan.fast

    # -- transactions

    def _event(self, ctx: Any, op: str, txn: Any, **extra: Any) -> None:
        tail = b"," + _dumps(extra)[1:-1] if extra else b""
        ctx.emit(b'{"op":"' + op.encode() + b'"' + _txn_bytes(txn) + tail + b"}")

    def begin(self, ctx: Any, txn: Any) -> None:
        envelope = ctx.output_plugin_private.envelope
        if envelope is not None:
            envelope.begin(txn)
            return
        txn.output_plugin_private = _txn_fields(txn)
        ctx.output_plugin_private.snapshot = txn.is_snapshot
        if ctx.output_plugin_private.events:
            self._event(ctx, "begin", txn)

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        envelope = ctx.output_plugin_private.envelope
        if envelope is not None:
            envelope.commit(txn)
        elif ctx.output_plugin_private.events:
            self._event(ctx, "commit", txn, end_lsn=_lsn(txn.end_lsn))

    def begin_prepare(self, ctx: Any, txn: Any) -> None:
        self.begin(ctx, txn)

    def prepare(self, ctx: Any, txn: Any, prepare_lsn: LSN) -> None:
        if ctx.output_plugin_private.events:
            self._event(ctx, "prepare", txn, end_lsn=_lsn(txn.end_lsn))

    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        ctx.emit(_dumps({
            "op": "commit_prepared", "xid": txn.xid, "commit_lsn": str(commit_lsn),
            "commit_time": txn.commit_time, "origin": txn.origin, "gid": txn.gid,
            "end_lsn": _lsn(txn.end_lsn),
        }))

    def rollback_prepared(self, ctx: Any, txn: Any, prepare_end_lsn: LSN,
                          prepare_time: Any) -> None:
        ctx.emit(_dumps({
            "op": "rollback_prepared", "xid": txn.xid, "origin": txn.origin, "gid": txn.gid,
            "prepare_end_lsn": _lsn(prepare_end_lsn), "prepare_time": prepare_time,
            "end_lsn": _lsn(txn.end_lsn),
        }))

    # -- changes

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        state = ctx.output_plugin_private
        if state.envelope is not None:
            for line in state.envelope.change(txn, relation, change):
                ctx.emit(line)
            return
        last, plan = state.last
        if relation is not last or plan is None:
            plan = state.plan(relation)
        fields = txn.output_plugin_private
        if type(fields) is not bytes:
            fields = _txn_bytes(txn)
        action = change.action
        before, key = plan.heads["SNAPSHOT" if txn.is_snapshot else action]
        new, old = change.new, change.old
        if action == "INSERT":
            body = b',"new":' + _dumps(row(plan, new.data)[0])
        else:
            if old is None:
                body = b',"old_is_key":false,"old":null'
            else:
                data = old.data
                if change.old_is_key:  # only the identity columns are meaningful
                    values, toast = row_mixed(plan, data.kinds, data.values, plan.key_idx)
                    body = b',"old_is_key":true,"old":' + _dumps(values)
                else:
                    values, toast = row(plan, data)
                    body = b',"old_is_key":false,"old":' + _dumps(values)
                if toast:
                    body += b',"old_unchanged_toast":' + _dumps(toast)
            if action == "UPDATE":
                values, toast = row(plan, new.data)
                body += b',"new":' + _dumps(values) + b',"unchanged_toast":' + _dumps(toast)
        if plan.opaque and ((new is not None and KIND_BINARY in new.data.kinds)
                            or (old is not None and KIND_BINARY in old.data.kinds)):
            opaque = opaque_columns(plan, new, old)
            if opaque:
                body += b',"binary":' + _dumps(opaque)
        lsn = change.lsn
        ctx.emit(b'%s,"lsn":"%X/%X"%s%s%s}' % (before, lsn >> 32, lsn & 0xFFFFFFFF, fields, key,
                                               body))

    def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        """One line per table, all with the statement's LSN, cascade and restart_identity."""
        state = ctx.output_plugin_private
        if state.envelope is not None:
            for line in state.envelope.truncate(txn, relations, int(change.lsn)):
                ctx.emit(line)
            return
        tail = (b',"lsn":"' + str(change.lsn).encode() + b'"' + _txn_bytes(txn)
                + b',"cascade":' + (b"true" if change.cascade else b"false")
                + b',"restart_identity":' + (b"true" if change.restart_identity else b"false")
                + b"}")
        for relation in relations:
            ctx.emit(state.plan(relation).truncate_head + tail)

    def message(self, ctx: Any, txn: Any, message_lsn: LSN, transactional: bool, prefix: str,
                message: bytes) -> None:
        content = bytes(message)
        envelope = ctx.output_plugin_private.envelope
        if envelope is not None:
            ctx.emit(envelope.message(txn, int(message_lsn), prefix, content))
            return
        try:
            text, encoding = content.decode(), "utf-8"
        except UnicodeDecodeError:
            text, encoding = binascii.b2a_base64(content, newline=False).decode(), "base64"
        tail = _dumps({"transactional": transactional, "prefix": prefix, "content": text,
                       "content_encoding": encoding})
        ctx.emit(b'{"op":"message","lsn":"' + str(message_lsn).encode() + b'"'
                 + (_txn_bytes(txn) if txn is not None else _NO_TXN) + b"," + tail[1:])
