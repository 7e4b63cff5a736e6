"""Scripted pgoutput streams for server-free tests of the reorder contract.

``Wal`` writes what a walsender running pgoutput sends for a sequence of transactions, with
``protocol.encode``: ordinary transactions whole at their commit, streamed ones block by block,
prepared ones at PREPARE and their outcome later. It follows pgoutput where the layout matters
to a consumer: a Relation message before a table's first change in each (streamed)
transaction that has not had it, sent again after the table changes shape; row changes inside
a stream block carry their subtransaction's xid, everything else the top-level xid; an Origin
message right after Begin (or the first Stream Start); a non-transactional message is sent when
decoded, before the transaction around it, with ``lsn`` at the end of its record, which is
where the next record starts.

Recording plugins write every event as a line to their output (``emitting``), so that what a
test reads is what the output holds, including what ``Pipeline.reset`` took back.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from plugin_framework import LSN, MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    RelationColumn,
    RelationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Update,
    XLogData,
    encode,
    encode_copy_data,
)
from plugin_framework.protocol.runs import row_change_run
from support.recorders import (
    Event,
    Recorder,
    StreamRecorder,
    StreamTwoPhaseRecorder,
    TwoPhaseRecorder,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INT4, TEXT = 23, 25
FIRST_RELID = 16384

Item = tuple[bytes, LSN]


# --- what transactions do ------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One thing a transaction does: a row change, TRUNCATE, a message, or ALTER TABLE
    (``alter``: the table's columns from now on). ``sub`` is the subtransaction doing it."""

    kind: str
    table: str = ""
    values: tuple[str | None, ...] = ()
    key: str | None = None
    tables: tuple[str, ...] = ()
    flags: tuple[bool, bool] = (False, False)
    prefix: str = ""
    content: bytes = b""
    sub: int | None = None


def ins(table: str, *values: str | None, sub: int | None = None) -> Op:
    return Op("insert", table, values, sub=sub)


def upd(table: str, key: str, *values: str | None, sub: int | None = None) -> Op:
    """UPDATE that changes the key (so pgoutput sends the old key) to ``values``."""
    return Op("update", table, values, key=key, sub=sub)


def dele(table: str, key: str, sub: int | None = None) -> Op:
    return Op("delete", table, key=key, sub=sub)


def trunc(*tables: str, cascade: bool = False, restart: bool = False,
          sub: int | None = None) -> Op:
    return Op("truncate", tables=tables, flags=(cascade, restart), sub=sub)


def msg(prefix: str, content: bytes, sub: int | None = None) -> Op:
    """pg_logical_emit_message(true, ...)."""
    return Op("message", prefix=prefix, content=content, sub=sub)


def nontx(prefix: str, content: bytes) -> Op:
    """pg_logical_emit_message(false, ...) inside the transaction."""
    return Op("nontx", prefix=prefix, content=content)


def alter(table: str, *columns: str) -> Op:
    return Op("alter", table, tuple(columns))


# --- the expected events (recorders.change_event's shape) ----------------------------------


def ev_insert(table: str, row: dict[str, str | None]) -> Event:
    return ("change", table, "INSERT", tuple(row.items()), None, False)


def ev_update(table: str, key: dict[str, str | None], row: dict[str, str | None]) -> Event:
    return ("change", table, "UPDATE", tuple(row.items()), tuple(key.items()), True)


def ev_delete(table: str, key: dict[str, str | None]) -> Event:
    return ("change", table, "DELETE", None, tuple(key.items()), True)


def _streamed(xid: int, sub: int | None, event: Event) -> Event:
    """A change event as recorders.StreamRecorder records it in a block."""
    if event[0] == "message":  # pgoutput sends the top-level xid with it
        return ("stream_message", xid, xid, event)
    kind = "stream_truncate" if event[0] == "truncate" else "stream_change"
    return (kind, xid, xid if sub is None else sub, event)


# --- the stream ------------------------------------------------------------------------------


class Wal:
    """The messages a walsender sends, in order, each with its XLogData LSN (``items``)."""

    def __init__(self, start: int = 0x1000000) -> None:
        self.pos = start
        self.items: list[Item] = []
        self.columns: dict[str, tuple[str, ...]] = {}  # table -> its columns now
        self.relids: dict[str, int] = {}
        self.described: set[str] = set()  # pgoutput's schema_sent, outside streams
        self.described_in: dict[int, set[str]] = {}  # per streamed transaction
        self.streams: set[int] = set()  # streamed transactions with a first segment sent
        # per xid, what its changes should look like to a plugin, with the subtransaction
        # that made each (None: the top-level transaction)
        self.expected: dict[int, list[tuple[int | None, Event]]] = {}

    def table(self, name: str, *columns: str) -> None:
        """CREATE TABLE name (``columns``, the first one the primary key) before the stream."""
        self.relids.setdefault(name, FIRST_RELID + len(self.relids))
        self.columns[name] = tuple(columns)

    def lsn(self, step: int = 0x40) -> LSN:
        self.pos += step
        return LSN(self.pos)

    def send(self, message: Message, lsn: LSN) -> None:
        self.items.append((encode(message), lsn))

    def relation(self, name: str, xid: int | None = None) -> RelationMessage:
        cols = tuple(RelationColumn(i == 0, c, INT4 if i == 0 else TEXT, -1)
                     for i, c in enumerate(self.columns[name]))
        return RelationMessage(self.relids[name], "public", name, "d", cols, xid)

    def _tuple(self, name: str, values: Sequence[str | None]) -> TupleData:
        assert len(values) == len(self.columns[name]), (name, values)
        return TupleData(b"".join(b"n" if v is None else b"t" for v in values),
                         tuple(None if v is None else v.encode() for v in values))

    def _key(self, name: str, key: str) -> TupleData:
        return self._tuple(name, [key] + [None] * (len(self.columns[name]) - 1))

    def _row(self, name: str, values: Sequence[str | None]) -> dict[str, str | None]:
        return dict(zip(self.columns[name], values, strict=True))

    def _keyrow(self, name: str, key: str) -> dict[str, str | None]:
        return self._row(name, [key] + [None] * (len(self.columns[name]) - 1))

    def _ops(self, xid: int, ops: Iterable[Op], stream: int | None,
             expected: list[tuple[int | None, Event]],
             ) -> tuple[list[tuple[Message, LSN]], list[Op]]:
        """The messages of ``ops`` (after the transaction's Begin or a Stream Start), and the
        non-transactional messages among them (sent before, when outside a stream)."""
        out: list[tuple[Message, LSN]] = []
        pending_nontx: list[Op] = []
        described = self.described_in.setdefault(stream, set()) if stream is not None \
            else self.described
        for op in ops:
            if op.kind == "alter":
                # the relcache invalidation clears schema_sent and streamed_txns
                # (rel_sync_cache_relation_cb)
                self.columns[op.table] = op.values
                for sent in (self.described, *self.described_in.values()):
                    sent.discard(op.table)
                continue
            if op.kind == "nontx":
                pending_nontx.append(op)
                continue
            sxid = (op.sub if op.sub is not None else xid) if stream is not None else None
            lsn = self.lsn()
            for names in ((op.table,) if op.table else op.tables):
                if names not in described:
                    described.add(names)
                    out.append((self.relation(names, stream), lsn))
            if op.kind == "insert":
                out.append((Insert(self.relids[op.table], self._tuple(op.table, op.values),
                                   sxid), lsn))
                expected.append((op.sub, ev_insert(op.table, self._row(op.table, op.values))))
            elif op.kind == "update":
                assert op.key is not None
                out.append((Update(self.relids[op.table], self._tuple(op.table, op.values),
                                   key=self._key(op.table, op.key), xid=sxid), lsn))
                expected.append((op.sub, ev_update(op.table, self._keyrow(op.table, op.key),
                                          self._row(op.table, op.values))))
            elif op.kind == "delete":
                assert op.key is not None
                out.append((Delete(self.relids[op.table], key=self._key(op.table, op.key),
                                   xid=sxid), lsn))
                expected.append((op.sub, ev_delete(op.table, self._keyrow(op.table, op.key))))
            elif op.kind == "truncate":
                out.append((Truncate(tuple(self.relids[t] for t in op.tables), *op.flags,
                                     xid=sxid), lsn))
                expected.append((op.sub, ("truncate", tuple(sorted(op.tables)), *op.flags)))
            elif op.kind == "message":
                # pgoutput tags a transactional message in a stream with the top-level xid
                out.append((LogicalMessage(True, lsn, op.prefix, op.content,
                                           xid if stream is not None else None), lsn))
                expected.append((op.sub, ("message", True, op.prefix, op.content, int(lsn))))
            else:
                raise ValueError(op.kind)
        return out, pending_nontx

    def _send_nontx(self, ops: list[Op]) -> None:
        for op in ops:
            lsn = self.lsn()
            self.send(LogicalMessage(False, lsn, op.prefix, op.content), lsn)

    def txn(self, xid: int, *ops: Op, origin: str | None = None) -> tuple[LSN, LSN]:
        """An ordinary transaction, sent at its commit. Returns (commit LSN, end LSN)."""
        first = self.lsn()
        expected = self.expected.setdefault(xid, [])
        body, nontx_ops = self._ops(xid, ops, None, expected)
        commit_lsn = self._nontx_then_commit(nontx_ops)
        end = self._end(commit_lsn)
        self.send(Begin(commit_lsn, T0, xid), first)
        self._body(body, origin, first)
        self.send(Commit(commit_lsn, end, T0), end)
        return commit_lsn, end

    def _nontx_then_commit(self, nontx_ops: list[Op]) -> LSN:
        """Send the transaction's non-transactional messages; the last one's record ends
        where the commit record starts."""
        self._send_nontx(nontx_ops)
        return LSN(self.pos) if nontx_ops else self.lsn()

    def _end(self, record: LSN) -> LSN:
        self.pos = record + 0x30
        return LSN(self.pos)

    def _body(self, body: list[tuple[Message, LSN]], origin: str | None, at: LSN) -> None:
        if origin is not None:
            self.send(Origin(LSN(0x42), origin), at)
        for message, lsn in body:
            self.send(message, lsn)

    def prepared(self, xid: int, gid: str, *ops: Op,
                 origin: str | None = None) -> tuple[LSN, LSN]:
        """BEGIN ... PREPARE TRANSACTION gid on a two-phase slot. Returns (prepare LSN, end)."""
        first = self.lsn()
        expected = self.expected.setdefault(xid, [])
        body, nontx_ops = self._ops(xid, ops, None, expected)
        prepare_lsn = self._nontx_then_commit(nontx_ops)
        end = self._end(prepare_lsn)
        self.send(BeginPrepare(prepare_lsn, end, T0, xid, gid), first)
        self._body(body, origin, first)
        self.send(Prepare(prepare_lsn, end, T0, xid, gid), end)
        return prepare_lsn, end

    def commit_prepared(self, xid: int, gid: str) -> tuple[LSN, LSN]:
        commit_lsn = self.lsn()
        end = self._end(commit_lsn)
        self.send(CommitPrepared(commit_lsn, end, T0 + timedelta(seconds=1), xid, gid), end)
        return commit_lsn, end

    def rollback_prepared(self, xid: int, gid: str, prepare_end: LSN) -> LSN:
        record = self.lsn()
        end = self._end(record)
        self.send(RollbackPrepared(prepare_end, end, T0, T0 + timedelta(seconds=1), xid, gid),
                  end)
        return end

    def block(self, xid: int, *ops: Op, origin: str | None = None) -> list[Event]:
        """One stream block of transaction ``xid``: Stream Start, its changes, Stream Stop.
        Returns what a plugin with stream callbacks (recorders.StreamRecorder) gets of it."""
        first = xid not in self.streams
        self.streams.add(xid)
        start = self.lsn()
        expected = self.expected.setdefault(xid, [])
        before = len(expected)
        body, nontx_ops = self._ops(xid, ops, xid, expected)
        assert not nontx_ops, "a non-transactional message goes between blocks"
        self.send(StreamStart(xid, first), start)
        if first and origin is not None:
            self.send(Origin(LSN(0x42), origin), start)
        for message, lsn in body:
            self.send(message, lsn)
        self.send(StreamStop(), self.lsn())
        added = expected[before:]
        return [("stream_start", xid), *(_streamed(xid, sub, e) for sub, e in added),
                ("stream_stop", xid)]

    def nontx(self, prefix: str, content: bytes) -> LSN:
        """A non-transactional message outside any transaction sent: its LSN."""
        lsn = self.lsn()
        self.send(LogicalMessage(False, lsn, prefix, content), lsn)
        return lsn

    def stream_commit(self, xid: int) -> tuple[LSN, LSN]:
        commit_lsn = self.lsn()
        end = self._end(commit_lsn)
        self.send(StreamCommit(xid, commit_lsn, end, T0), end)
        self._stream_done(xid, committed=True)
        return commit_lsn, end

    def stream_abort(self, xid: int, subxid: int | None = None) -> None:
        """ROLLBACK (``subxid`` None) or ROLLBACK TO a savepoint of subtransaction ``subxid``.
        Protocol 4's abort LSN and time are left out, as a non-parallel stream does."""
        self.send(StreamAbort(xid, xid if subxid is None else subxid), self.lsn())
        if subxid is None:
            self._stream_done(xid, committed=False)
            self.expected.pop(xid, None)
        else:
            self.expected[xid] = [(s, e) for s, e in self.expected[xid] if s != subxid]

    def changes(self, xid: int) -> list[Event]:
        """What a plugin should get between begin and commit of ``xid``."""
        return [e for _, e in self.expected.get(xid, [])]

    def ordinary(self, xid: int, commit_lsn: LSN) -> list[Event]:
        """``xid`` as an ordinary plugin (recorders.Recorder) should get it."""
        return [("begin", xid), *self.changes(xid), ("commit", xid, int(commit_lsn))]

    def stream_prepare(self, xid: int, gid: str) -> tuple[LSN, LSN]:
        prepare_lsn = self.lsn()
        end = self._end(prepare_lsn)
        self.send(StreamPrepare(prepare_lsn, end, T0, xid, gid), end)
        # (pgoutput's stream_prepare does not clean up the relation sync cache: its
        # descriptions count as sent neither way)
        self._stream_done(xid, committed=False)
        return prepare_lsn, end

    def reconnect(self) -> int:
        """A new walsender session: every description is sent again. Returns the index in
        ``items`` where the session's messages start."""
        self.described = set()
        self.described_in = {}
        return len(self.items)

    def _stream_done(self, xid: int, *, committed: bool) -> None:
        # pgoutput's cleanup_rel_sync_cache: a committed stream's descriptions count as sent
        sent = self.described_in.pop(xid, set())
        if committed:
            self.described |= sent


# --- recording into the output ---------------------------------------------------------------


class _Lines(list[Event]):
    """A recorder's ``events`` that writes each event to the plugin's output instead."""

    def __init__(self, ctx: Any) -> None:
        super().__init__()
        self.ctx = ctx

    def append(self, event: Event) -> None:
        self.ctx.emit(repr(event))


def emitting(cls: type[Any]) -> type[Any]:
    """``cls`` (a recorder of tests/support/recorders.py) writing its events to its output."""

    def startup(self: Any, ctx: Any, options: Any, is_init: bool) -> None:
        cls.startup(self, ctx, options, is_init)
        self.events = _Lines(ctx)

    return type(f"Emitting{cls.__name__}", (cls,), {"startup": startup})


def events(output: MemoryOutput) -> list[Event]:
    return [ast.literal_eval(line) for line in output.lines]


def pipeline(*plugins: OutputPlugin, proto: int = 4, memory_limit: int | None = None,
             outputs: list[MemoryOutput] | None = None) -> tuple[Pipeline, list[MemoryOutput]]:
    """A started Pipeline with ``plugins``, each writing to a MemoryOutput."""
    kwargs: dict[str, Any] = {} if memory_limit is None else {"memory_limit": memory_limit}
    p = Pipeline(proto_version=proto, **kwargs)
    outs = outputs if outputs is not None else [MemoryOutput() for _ in plugins]
    for plugin, out in zip(plugins, outs, strict=True):
        p.add(plugin, output=out)
    p.startup()
    return p, outs


def feed(p: Pipeline, items: Iterable[Item]) -> Pipeline:
    for data, lsn in items:
        p.feed(data, lsn)
    return p


def feed_in_runs(p: Pipeline, items: Sequence[Item], batch_ends: Iterable[int] = ()
                 ) -> Pipeline:
    """``feed``, the way the walsender source hands over what it reads: each message framed
    as XLogData, read in batches that end after each index of ``batch_ends`` (and at the
    end), and in a batch each run of row changes (protocol/runs.py) in one ``feed_run``."""
    framed = [encode_copy_data(XLogData(lsn, lsn, T0, data)) for data, lsn in items]
    cuts = sorted({0, len(items), *(c for c in batch_ends if 0 < c < len(items))})
    for start, end in pairwise(cuts):
        batch = framed[start:end]
        i = 0
        while i < len(batch):
            datas, lsns, after = row_change_run(batch, i)
            if datas:
                p.feed_run(datas, lsns)
                i = after
            else:
                p.feed(*items[start + i])
                i += 1
    return p


def file_events(path: Path) -> list[Event]:
    """The events a recorder wrote to a FileOutput."""
    return [ast.literal_eval(line) for line in path.read_text().splitlines()]


def run(items: list[Item], *plugins: OutputPlugin, **kwargs: Any) -> list[list[Event]]:
    """Each plugin's events after a pipeline of ``plugins`` is fed ``items``."""
    p, outs = pipeline(*plugins, **kwargs)
    feed(p, items)
    return [events(o) for o in outs]


def changes_of(evs: list[Event]) -> list[Event]:
    return [e for e in evs if e[0] == "change"]


def spilled(p: Pipeline) -> int:
    """Bytes the pipeline's spools wrote to disk (the one look at the reorder internals)."""
    return int(p.budget.spilled_bytes)


# --- the recorders, writing to their outputs ---------------------------------------------------


class OriginFilter(Recorder):
    name = "origin-filter"

    def filter_by_origin(self, ctx: Any, origin: str) -> bool:
        return origin == "upstream"


class StreamOriginFilter(StreamRecorder, OriginFilter):
    name = "stream-origin-filter"


class TwoPhaseOriginFilter(TwoPhaseRecorder, OriginFilter):
    name = "2pc-origin-filter"


class FinalLsnRecorder(TwoPhaseRecorder):
    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self.events.append(("commit_prepared", txn.gid, int(txn.final_lsn), int(commit_lsn)))


class Minimal(OutputPlugin):
    """Only the required callbacks: TRUNCATE and messages are skipped for it, as in C."""

    name = "minimal"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        self.ctx = ctx

    def begin(self, ctx: Any, txn: Any) -> None:
        ctx.emit(repr(("begin", txn.xid)))

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        ctx.emit(repr(("change", relation.name, str(change.action))))

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        ctx.emit(repr(("commit", txn.xid)))


class OriginRecorder(Recorder):
    name = "origin-recorder"

    def begin(self, ctx: Any, txn: Any) -> None:
        self.events.append(("begin", txn.xid, txn.origin))


class StreamWithoutOptional(StreamRecorder):
    """stream_message and stream_truncate are optional: without them those are skipped in
    streamed transactions (stream_message_cb_wrapper returns when the callback is NULL)."""

    name = "stream-without-optional"
    stream_message = None  # type: ignore[assignment]
    stream_truncate = None  # type: ignore[assignment]


class StreamingOff(StreamRecorder):
    """Clears ctx.streaming in startup (ctx->streaming &= false): reassembled transactions."""

    name = "streaming-off"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        super().startup(ctx, options, is_init)
        ctx.streaming = False


class TwoPhaseOff(TwoPhaseRecorder):
    name = "two-phase-off"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        super().startup(ctx, options, is_init)
        ctx.twophase = False


Rec = emitting(Recorder)
StreamRec = emitting(StreamRecorder)
TwoPhaseRec = emitting(TwoPhaseRecorder)
StreamTwoPhaseRec = emitting(StreamTwoPhaseRecorder)
