"""The dispatcher: turns the decoded pgoutput stream into output-plugin callbacks with the
reorder buffer's contract.

- Only committed transactions reach begin/change/commit, in commit order.
- Streamed transactions reach plugins with stream callbacks block by block; plugins without
  them get the transaction reassembled at Stream Commit, subtransaction aborts applied, and
  nothing for an aborted stream.
- Prepared transactions reach two-phase plugins at PREPARE (unless filter_prepare says no);
  the others get them as ordinary transactions at COMMIT PREPARED, nothing at ROLLBACK
  PREPARED.
- filter_by_origin skips a whole transaction for the plugin that asks.

Each plugin has its own context, options, private state and output. The pipeline knows up to
which LSN every output is durable, and never reports past a prepared transaction that some
plugin still waits for.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from plugin_framework.framework.context import (
    FastChange,
    FileOutput,
    LogicalDecodingContext,
    Output,
)
from plugin_framework.framework.model import (
    Action,
    Change,
    Relation,
    Row,
    Transaction,
    TruncateChange,
    new_change,
)
from plugin_framework.framework.plugin import LoadedPlugin
from plugin_framework.framework.spool import Spool, SpoolBudget
from plugin_framework.protocol import (
    LSN,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from plugin_framework.protocol import Relation as RelationMessage

DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
INSERT, UPDATE, DELETE = Action.INSERT, Action.UPDATE, Action.DELETE
_ROW_CHANGES = frozenset(b"IUD")  # the type bytes of Insert, Update and Delete
# The 32-bit field after a row change's type byte: its (sub)transaction id in a stream,
# else its relation id.
_AFTER_TYPE = struct.Struct(">I")
_UNKNOWN: Any = object()  # a relation the transaction's fast path has not looked at yet


class PipelineError(Exception):
    """The stream cannot be delivered with the promised semantics."""


class CallbackError(Exception):
    """An exception raised by a plugin callback, with PostgreSQL-style context."""

    def __init__(self, context: str, cause: BaseException) -> None:
        self.context = context
        self.cause = cause
        super().__init__(f"{context}: {type(cause).__name__}: {cause}")


class Member:
    """One plugin of a pipeline, with its own context and output."""

    __slots__ = ("callbacks", "ctx", "on_change", "plugin")

    def __init__(self, plugin: LoadedPlugin, ctx: LogicalDecodingContext) -> None:
        self.plugin = plugin
        self.ctx = ctx
        self.callbacks = plugin.callbacks
        self.on_change = plugin.callbacks["change"]

    def call(self, cb: str, lsn: LSN, xid: int | None, *args: Any, writes: bool = True) -> Any:
        ctx = self.ctx
        ctx.write_location = lsn
        ctx.write_xid = xid
        ctx.accept_writes = writes
        try:
            return self.callbacks[cb](ctx, *args)
        except CallbackError:
            raise
        except Exception as exc:
            raise self._error(cb, lsn, exc) from exc
        finally:
            ctx.accept_writes = False

    def call_change(self, lsn: LSN, xid: int | None, txn: Transaction, change: Change) -> None:
        """``call("change", ...)``, unrolled: it runs once per row change."""
        ctx = self.ctx
        ctx.write_location = lsn
        ctx.write_xid = xid
        ctx.accept_writes = True
        try:
            self.on_change(ctx, txn, change.relation, change)
        except CallbackError:
            raise
        except Exception as exc:
            raise self._error("change", lsn, exc) from exc
        finally:
            ctx.accept_writes = False

    def call_fast_change(self, write: FastChange, data: bytes, lsn: LSN, xid: int | None,
                         txn: Transaction) -> bool:
        """The plugin's ``fast_change`` formatter for one raw row change: True when it wrote
        the change's record, False when the change callback must run instead."""
        try:
            line = write(data, lsn, txn)
            if line is None:
                return False
            self.ctx.write_record(lsn, xid, line)
        except CallbackError:
            raise
        except Exception as exc:
            raise self._error("change", lsn, exc) from exc
        return True

    def _error(self, cb: str, lsn: LSN, exc: Exception) -> CallbackError:
        ctx = self.ctx
        slot = f'slot "{ctx.slot_name}", ' if ctx.slot_name else ""
        return CallbackError(
            f'{slot}output plugin "{self.plugin.name}", in the {cb} callback, '
            f"associated LSN {lsn}",
            exc,
        )


@dataclass(eq=False)
class _Txn:
    """A transaction being received: ordinary, prepared or streamed."""

    base: Transaction
    views: dict[int, Transaction] = field(default_factory=dict)  # member index -> its view
    live: list[int] = field(default_factory=list)  # members receiving callbacks as it goes
    held: list[int] = field(default_factory=list)  # members waiting for a replay from spool
    streamed_held: list[int] = field(default_factory=list)  # got stream blocks, await outcome
    skipped: list[int] = field(default_factory=list)  # filtered by origin
    # two-phase members whose output already holds this PREPARE (the server re-sent it
    # after a restart): they skip it, and get only its COMMIT/ROLLBACK PREPARED
    outcome_only: list[int] = field(default_factory=list)
    spool: Spool | None = None
    started: bool = False
    relations: dict[int, Relation] = field(default_factory=dict)  # in-stream descriptions
    # for a transaction replayed from its spool after self.relations moved on: the definitions
    # in force when it began of the relations it redescribes (None: it described them first)
    replay_relations: dict[int, Relation | None] = field(default_factory=dict)
    # each takes back from one live member's output what it wrote of this transaction
    # (ordinary and prepared transactions, whose lines are the tail of that output)
    rollbacks: list[Callable[[], None]] = field(default_factory=list)
    aborted_subxids: set[int] = field(default_factory=set)
    in_block: list[int] = field(default_factory=list)  # members in the current stream block
    prepare_lsn: LSN | None = None
    block_lsn: LSN = field(default_factory=LSN)  # where the current stream block started
    # For an ordinary or prepared transaction with live members that have a fast_change:
    # per relation id, each live member with its view and its formatter (None: the change
    # callback), or None when no live member has a formatter for that relation.
    fast: dict[int, list[tuple[Member, Transaction, FastChange | None]] | None] | None = None


class Pipeline:
    """Drives output plugins from pgoutput messages."""

    def __init__(self, *, proto_version: int = 4, memory_limit: int = DEFAULT_MEMORY_LIMIT,
                 spool_dir: str | None = None, slot_name: str | None = None,
                 catalog: Any = None) -> None:
        self.proto_version = proto_version
        self.decoder = Decoder(proto_version)
        self.members: list[Member] = []
        self.slot_name = slot_name
        self.catalog = catalog
        self.server_version: int | None = None  # see set_server_version
        self.budget = SpoolBudget(memory_limit, spool_dir)
        self.relations: dict[int, Relation] = {}
        self.type_names: dict[int, tuple[str, str]] = {}
        self._txn: _Txn | None = None
        self._streams: dict[int, _Txn] = {}
        self._stream: _Txn | None = None
        self._prepared: dict[str, _Txn] = {}
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
        # TRUNCATE is never filtered by row, but a publication's publish options and its
        # tables decide which relations of a TRUNCATE are delivered: the relations left, or
        # none (then no truncate callback runs).
        self.truncate_filter: Callable[[list[Relation]], list[Relation]] | None = None
        self.transactions = 0  # finished transactions (any outcome), for progress reports
        self.changes = 0
        self._handlers: dict[type, Callable[[Any, LSN, bytes | None], None]] = {
            Begin: self._on_begin, Commit: self._on_commit, Origin: self._on_origin,
            RelationMessage: self._on_relation, Type: self._on_type,
            Insert: self._on_change, Update: self._on_change, Delete: self._on_change,
            Truncate: self._on_truncate, LogicalMessage: self._on_message,
            BeginPrepare: self._on_begin_prepare, Prepare: self._on_prepare,
            CommitPrepared: self._on_commit_prepared,
            RollbackPrepared: self._on_rollback_prepared,
            StreamStart: self._on_stream_start, StreamStop: self._on_stream_stop,
            StreamCommit: self._on_stream_commit, StreamAbort: self._on_stream_abort,
            StreamPrepare: self._on_stream_prepare,
        }

    # --- set-up -------------------------------------------------------------------------------

    def set_proto_version(self, proto_version: int) -> None:
        """The protocol version the source negotiated (before startup)."""
        self.proto_version = proto_version
        self.decoder = Decoder(proto_version)

    def set_server_version(self, server_version: int | None) -> None:
        """The server the stream comes from (``server_version_num``, e.g. 150004), as every
        plugin's ``ctx.server_version``: emitters that print as the server does need it."""
        self.server_version = server_version
        for m in self.members:
            m.ctx.server_version = server_version

    def add(self, plugin: object, *, options: Mapping[str, str | None] | None = None,
            output: Output | None = None, name: str | None = None) -> LogicalDecodingContext:
        """Add a plugin (OutputPlugin instance, hookimpl object, or LoadedPlugin)."""
        if self._started:
            raise PipelineError("plugins must be added before startup()")
        loaded = plugin if isinstance(plugin, LoadedPlugin) else LoadedPlugin(plugin, name)
        ctx = LogicalDecodingContext(
            plugin_name=loaded.name, output=output if output is not None else FileOutput("-"),
            output_plugin_options=dict(options or {}), slot_name=self.slot_name,
            catalog=self.catalog, server_version=self.server_version,
        )
        self.members.append(Member(loaded, ctx))
        return ctx

    def startup(self, is_init: bool = False) -> None:
        """Call every plugin's startup. A plugin may clear ``ctx.streaming`` or
        ``ctx.twophase`` there to receive streamed or prepared transactions whole, at commit
        (as ``ctx->streaming &= ...`` does in C)."""
        self._started = True
        if self.slot_name is not None:
            # An output resumed after a restart skips what it holds; that is only right for
            # the stream that wrote it.
            for m in self.members:
                claim = getattr(m.ctx.output, "claim", None)
                if claim is not None:
                    claim(self.slot_name)
        self._done = [LSN(getattr(m.ctx.output, "resume_lsn", 0)) for m in self.members]
        for m in self.members:
            m.ctx.streaming = m.plugin.streaming
            m.ctx.twophase = m.plugin.two_phase
            if m.plugin.has("startup"):
                m.call("startup", LSN(0), None, m.ctx.options, is_init, writes=False)
            m.ctx.streaming = m.ctx.streaming and m.plugin.streaming
            m.ctx.twophase = m.ctx.twophase and m.plugin.two_phase
        for m in self.members:
            # Streams the output had blocks of, unfinished, when it was last durable: the
            # server streams them again from their start. Abort the old blocks first, as
            # reset() does after a lost connection.
            for xid in getattr(m.ctx.output, "resume_open_streams", ()):
                if m.plugin.has("stream_abort"):
                    m.call("stream_abort", LSN(0), xid,
                           Transaction(xid, is_streamed=True), None)

    def shutdown(self) -> None:
        for m in self.members:
            if m.plugin.has("shutdown"):
                m.call("shutdown", LSN(0), None, writes=False)
        for m in self.members:
            m.ctx.output.close()
        for state in [*self._streams.values(), *self._prepared.values()]:
            if state.spool is not None:
                state.spool.close()

    # --- input --------------------------------------------------------------------------------

    def feed(self, data: bytes, lsn: LSN) -> None:
        """One pgoutput message as the server sent it, and its XLogData start LSN."""
        stream = self._stream
        if stream is not None:
            if stream.in_block and not stream.live and stream.spool is not None \
                    and len(data) >= 5 and data[0] in _ROW_CHANGES:
                # A row change of a streamed transaction that only goes to the spool: its rows
                # are parsed once, at replay, not also now (a malformed one is reported then).
                self.changes += 1
                stream.spool.append(lsn, _AFTER_TYPE.unpack_from(data, 1)[0], True, data)
                return
        else:
            state = self._txn
            if state is not None and (state.fast is not None or not state.started) \
                    and len(data) >= 5 and data[0] in _ROW_CHANGES:
                if not state.started:
                    self._start(state)
                fast = state.fast
                if fast is not None:
                    relid = _AFTER_TYPE.unpack_from(data, 1)[0]
                    writers = fast.get(relid, _UNKNOWN)
                    if writers is _UNKNOWN:
                        writers = fast[relid] = self._fast_writers(state, relid)
                    if writers is not None:
                        self._fast_change(state, writers, data, lsn)
                        return
        message = self.decoder.decode(data)
        self._handlers[type(message)](message, lsn, data)

    def handle(self, message: Message, lsn: LSN) -> None:
        """A message decoded elsewhere (its raw bytes are re-encoded only if it must be held)."""
        from plugin_framework.protocol import encode

        if isinstance(message, StreamStart):
            self.decoder.in_stream = True
        elif isinstance(message, StreamStop):
            self.decoder.in_stream = False
        self._handlers[type(message)](message, lsn, encode(message))

    # --- acknowledgement ----------------------------------------------------------------------

    def flush(self) -> LSN:
        """Flush every output; return the LSN up to which the server may forget the stream."""
        durable = min((m.ctx.output.flush() for m in self.members), default=self._position)
        return self._cap(durable)

    def drain(self) -> None:
        """Ask outputs that batch (the Spark emitter's) to deliver what they hold now."""
        for m in self.members:
            drain = getattr(m.ctx.output, "drain", None)
            if callable(drain):
                drain()

    def safe_lsn(self) -> LSN:
        durable = min((m.ctx.output.durable_lsn for m in self.members), default=self._position)
        return self._cap(durable)

    def _cap(self, lsn: LSN) -> LSN:
        # Never past what this pipeline has itself finished: outputs resumed after a restart
        # are durable further than that, but a prepared transaction that a plugin still
        # needs may lie between (the server sends it again, and only its PREPARE caps).
        lsn = min(lsn, self._position)
        for state in self._prepared.values():
            if (state.held or state.streamed_held) and state.prepare_lsn is not None:
                lsn = min(lsn, state.prepare_lsn)
        return lsn

    @property
    def in_flight(self) -> bool:
        """True while a transaction is open, streamed, or prepared and awaited by a plugin."""
        return (self._txn is not None or bool(self._streams)
                or any(s.held or s.streamed_held for s in self._prepared.values()))

    # --- helpers ------------------------------------------------------------------------------

    def _view(self, state: _Txn, i: int) -> Transaction:
        view = state.views.get(i)
        if view is None:
            view = state.views[i] = replace(state.base)
        return view

    def _savepoint(self, state: _Txn, i: int) -> None:
        output = self.members[i].ctx.output
        savepoint = getattr(output, "savepoint", None)
        rollback_to = getattr(output, "rollback_to", None)
        if savepoint is not None and rollback_to is not None:
            state.rollbacks.append(partial(rollback_to, savepoint()))

    def _open_streams(self, i: int) -> list[int]:
        """The streamed transactions member i has blocks of, and no end for yet."""
        return ([s.base.xid for s in self._streams.values() if i in s.live]
                + [s.base.xid for s in self._prepared.values() if i in s.streamed_held])

    def _mark(self, members: Iterable[int], lsn: LSN) -> None:
        done = self._done
        if lsn > self._position:
            self._position = lsn
        for i in members:
            output = self.members[i].ctx.output
            note = getattr(output, "note_open_streams", None)
            if note is not None:
                note(self._open_streams(i))
            output.mark(lsn)
            if lsn > done[i]:
                done[i] = lsn

    def _delivered(self, i: int, lsn: LSN | None) -> bool:
        """Whether member i already had the transaction whose commit (or prepare, or
        rollback) record is at ``lsn``."""
        return lsn is not None and lsn < self._done[i]

    @property
    def position(self) -> LSN:
        """The end LSN of the last transaction (or message) the pipeline finished."""
        return self._position

    @property
    def at_boundary(self) -> bool:
        """True between transactions (and between stream blocks): a clean place to stop."""
        return self._txn is None and self._stream is None

    def reset(self) -> None:
        """Forget what was received but not finished, after the connection was lost: the
        server will send it again. An ordinary or prepared transaction cut short is taken
        back from its live members' outputs where they can (files; not pipes). Plugins that
        were streamed part of a transaction are told to abort it. Prepared transactions
        awaited by a plugin are kept (acknowledgement never passed them, so the server
        re-sends them, and those re-sends are skipped)."""
        if self._txn is not None:
            for rollback in self._txn.rollbacks:
                rollback()
            self._close(self._txn)
        for state in self._streams.values():
            for i in state.live:
                self.members[i].call("stream_abort", LSN(0), state.base.xid,
                                     self._view(state, i), None)
            self._close(state)
        self._streams.clear()
        self._stream = None
        self._txn = None
        self.decoder.in_stream = False

    def _origin_filtered(self, state: _Txn) -> list[int]:
        origin = state.base.origin
        if not origin:
            return []
        skipped = []
        for i, m in enumerate(self.members):
            if m.plugin.has("filter_by_origin") and m.call(
                "filter_by_origin", state.base.final_lsn or LSN(0), state.base.xid, origin,
                writes=False,
            ):
                skipped.append(i)
        return skipped

    def _filters_prepare(self, m: Member, base: Transaction) -> bool:
        return bool(m.plugin.has("filter_prepare") and m.call(
            "filter_prepare", base.final_lsn or LSN(0), base.xid, base.xid, base.gid,
            writes=False,
        ))

    def _relation(self, relid: int, state: _Txn | None) -> Relation:
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
                state: _Txn | None) -> Change | None:
        """The Change a message describes, after ``change_filter`` (None: filtered out)."""
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
        if self.change_filter is not None:
            return self.change_filter(change)
        return change

    # --- ordinary and prepared transactions ----------------------------------------------------

    def _on_begin(self, m: Begin, lsn: LSN, raw: bytes | None) -> None:
        self._open(Transaction(m.xid, final_lsn=m.final_lsn, commit_time=m.commit_time,
                               first_lsn=lsn))

    def _on_begin_prepare(self, m: BeginPrepare, lsn: LSN, raw: bytes | None) -> None:
        self._open(Transaction(m.xid, final_lsn=m.prepare_lsn, end_lsn=m.end_lsn, gid=m.gid,
                               prepare_time=m.prepare_time, prepare_lsn=m.prepare_lsn,
                               is_prepared=True, first_lsn=lsn))

    def _open(self, txn: Transaction) -> None:
        if self._txn is not None:
            raise PipelineError(
                f"transaction {txn.xid} began before transaction {self._txn.base.xid} ended"
            )
        self._txn = _Txn(txn)

    def _current(self, what: str) -> _Txn:
        state = self._txn
        if state is None:
            raise PipelineError(f"{what} outside of a transaction")
        if not state.started:
            self._start(state)
        return state

    def _start(self, state: _Txn) -> None:
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
        if self.change_filter is None and any(
                self.members[i].ctx.fast_change is not None for i in state.live):
            state.fast = {}

    def _on_origin(self, m: Origin, lsn: LSN, raw: bytes | None) -> None:
        state = self._stream if self._stream is not None else self._txn
        if state is None:
            raise PipelineError("Origin message outside of a transaction")
        state.base.origin = m.name
        state.base.origin_lsn = m.origin_lsn
        for view in state.views.values():
            view.origin, view.origin_lsn = m.name, m.origin_lsn

    def _on_relation(self, m: RelationMessage, lsn: LSN, raw: bytes | None) -> None:
        if self.catalog is not None:
            self.catalog.invalidate()
        rel = Relation.from_message(m, self.type_names)
        stream = self._stream
        if stream is not None:
            self._stream_begin_block(stream)
            stream.relations[m.relation_id] = rel
            if stream.spool is not None and raw is not None:
                stream.spool.append(lsn, m.xid or 0, True, raw)
        else:
            state = self._txn
            if state is not None and state.spool is not None and raw is not None:
                # Its held members get it replayed later: at that point in the replay they
                # need this definition, and before it the one in force now.
                state.replay_relations.setdefault(m.relation_id,
                                                  self.relations.get(m.relation_id))
                state.spool.append(lsn, 0, False, raw)
            self.relations[m.relation_id] = rel
            if state is not None and state.fast is not None:
                state.fast.pop(m.relation_id, None)  # formatters of the old description

    def _on_type(self, m: Type, lsn: LSN, raw: bytes | None) -> None:
        self.type_names[m.type_oid] = (m.namespace, m.name)

    def _on_change(self, m: Insert | Update | Delete, lsn: LSN, raw: bytes | None) -> None:
        self.changes += 1
        stream = self._stream
        if stream is not None:
            def args() -> tuple[Any, ...] | None:
                change = self._change(m, lsn, stream)
                return None if change is None else (change.relation, change)

            self._stream_item(stream, lsn, m.xid, raw, "stream_change", args)
            return
        state = self._txn
        if state is None or not state.started:
            state = self._current("change")
        live = state.live
        change = self._change(m, lsn, state) if live else None
        if change is not None:
            members = self.members
            for i in live:
                members[i].call_change(lsn, state.base.xid, self._view(state, i), change)
        if state.spool is not None and raw is not None:
            state.spool.append(lsn, 0, False, raw)

    def _fast_writers(self, state: _Txn,
                      relid: int) -> list[tuple[Member, Transaction, FastChange | None]] | None:
        """Each live member's fast_change formatter for a relation (None for members
        without one), or None if no member has one (or the relation is not described: the
        change callback's path says so)."""
        rel = self.relations.get(relid)
        if rel is None:
            return None
        writers: list[tuple[Member, Transaction, FastChange | None]] = []
        for i in state.live:
            member = self.members[i]
            compile_ = member.ctx.fast_change
            try:
                write = compile_(rel) if compile_ is not None else None
            except Exception as exc:
                raise member._error("change", state.base.first_lsn or LSN(0), exc) from exc
            writers.append((member, self._view(state, i), write))
        return writers if any(w[2] is not None for w in writers) else None

    def _fast_change(self, state: _Txn,
                     writers: list[tuple[Member, Transaction, FastChange | None]],
                     data: bytes, lsn: LSN) -> None:
        """A row change of an ordinary or prepared transaction, for live members whose
        formatters turn its raw message into their record; the others, and any formatter
        that declines, get the change callback (with no change_filter: the change as is)."""
        self.changes += 1
        xid = state.base.xid
        change: Change | None = None
        for member, view, write in writers:
            if write is not None and member.call_fast_change(write, data, lsn, xid, view):
                continue
            if change is None:
                message = self.decoder.decode(data)
                assert isinstance(message, Insert | Update | Delete)
                change = self._change(message, lsn, state)
                assert change is not None
            member.call_change(lsn, xid, view, change)
        if state.spool is not None:
            state.spool.append(lsn, 0, False, data)

    def _truncate_args(self, m: Truncate, lsn: LSN,
                       state: _Txn | None) -> tuple[Any, ...] | None:
        """(relations, TruncateChange), after ``truncate_filter`` (None: nothing left)."""
        rels = [self._relation(r, state) for r in m.relation_ids]
        if self.truncate_filter is not None:
            rels = self.truncate_filter(rels)
            if not rels:
                return None
        return rels, TruncateChange(m.cascade, m.restart_identity, lsn, m.xid)

    def _on_truncate(self, m: Truncate, lsn: LSN, raw: bytes | None) -> None:
        stream = self._stream
        if stream is not None:
            self._stream_item(stream, lsn, m.xid, raw, "stream_truncate",
                              lambda: self._truncate_args(m, lsn, stream))
            return
        state = self._current("truncate")
        args = self._truncate_args(m, lsn, state)
        if args is not None:
            for i in state.live:
                member = self.members[i]
                if member.plugin.has("truncate"):
                    member.call("truncate", lsn, state.base.xid, self._view(state, i), *args)
        if state.spool is not None and raw is not None:
            state.spool.append(lsn, 0, False, raw)

    def _on_message(self, m: LogicalMessage, lsn: LSN, raw: bytes | None) -> None:
        args = (m.lsn, m.transactional, m.prefix, m.content)
        if not m.transactional:
            # m.lsn is where the message's WAL record ends (decode.c queues it at its
            # endptr), which is where the next record, often the enclosing transaction's
            # COMMIT, starts. Marking m.lsn passes the message (a restart at m.lsn skips it)
            # but not that COMMIT, and the same message re-sent has m.lsn == done.
            for i, member in enumerate(self.members):
                if member.plugin.has("message") and m.lsn > self._done[i]:
                    member.call("message", m.lsn, None, None, *args)
            self._mark(range(len(self.members)), m.lsn)
            return
        stream = self._stream
        if stream is not None:
            self._stream_item(stream, lsn, m.xid, raw, "stream_message", lambda: args)
            return
        state = self._current("transactional message")
        for i in state.live:
            member = self.members[i]
            if member.plugin.has("message"):
                member.call("message", m.lsn, state.base.xid, self._view(state, i), *args)
        if state.spool is not None and raw is not None:
            state.spool.append(lsn, 0, False, raw)

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
        self._mark(range(len(self.members)), m.end_lsn)
        self.transactions += 1

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
        self._mark([*state.live, *state.skipped], m.end_lsn)
        state.live += state.outcome_only  # from now on, they wait for the outcome too

    def _on_commit_prepared(self, m: CommitPrepared, lsn: LSN, raw: bytes | None) -> None:
        state = self._prepared.pop(m.gid, None)
        if state is None:
            state = self._unseen_prepared(m.xid, m.gid, m.commit_lsn, committed=True)
        base = state.base
        base.final_lsn, base.end_lsn, base.commit_time = m.commit_lsn, m.end_lsn, m.commit_time
        self._drop_delivered(state, m.commit_lsn)
        # As ReorderBufferFinishPrepared does, final_lsn becomes the COMMIT PREPARED's LSN.
        for i in state.live:
            view = self._view(state, i)
            view.final_lsn, view.end_lsn, view.commit_time = (m.commit_lsn, m.end_lsn,
                                                               m.commit_time)
            self.members[i].call("commit_prepared", m.end_lsn, base.xid, view, m.commit_lsn)
        for i in state.streamed_held:
            view = self._view(state, i)
            view.final_lsn, view.end_lsn, view.commit_time = (m.commit_lsn, m.end_lsn,
                                                               m.commit_time)
            self.members[i].call("stream_commit", m.end_lsn, base.xid, view, m.commit_lsn)
        if state.held:
            ordinary = replace(base, final_lsn=m.commit_lsn, is_prepared=False)
            self._replay(state, state.held, ordinary, m.commit_lsn, prepared=False)
        self._close(state)
        self._mark(range(len(self.members)), m.end_lsn)
        self.transactions += 1

    def _on_rollback_prepared(self, m: RollbackPrepared, lsn: LSN, raw: bytes | None) -> None:
        state = self._prepared.pop(m.gid, None)
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
        for i in state.streamed_held:
            self.members[i].call("stream_abort", m.rollback_end_lsn, state.base.xid,
                                 self._view(state, i), None)
        self._close(state)
        self._mark(range(len(self.members)), m.rollback_end_lsn)
        self.transactions += 1

    def _drop_delivered(self, state: _Txn, lsn: LSN) -> None:
        """Take members that already had this outcome (a re-send) out of the delivery."""
        state.live = [i for i in state.live if not self._delivered(i, lsn)]
        state.held = [i for i in state.held if not self._delivered(i, lsn)]
        state.streamed_held = [i for i in state.streamed_held if not self._delivered(i, lsn)]

    def _unseen_prepared(self, xid: int, gid: str, lsn: LSN, *, committed: bool) -> _Txn:
        """COMMIT/ROLLBACK PREPARED of a transaction whose PREPARE this pipeline never saw
        (acknowledged by an earlier run, or decoded before the slot did two-phase): only
        two-phase plugins can take it, unless a plugin's output already holds the outcome.
        A rollback owes the other plugins nothing; a commit's changes are gone for them."""
        state = _Txn(Transaction(xid, gid=gid, is_prepared=True), started=True)
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

    def _close(self, state: _Txn) -> None:
        if state.spool is not None:
            state.spool.close()
            state.spool = None

    # --- streamed transactions ----------------------------------------------------------------

    def _on_stream_start(self, m: StreamStart, lsn: LSN, raw: bytes | None) -> None:
        state = self._streams.get(m.xid)
        if state is None:
            if not m.first_segment:
                raise PipelineError(
                    f"stream of transaction {m.xid} continues, but its first segment was "
                    "never received"
                )
            state = self._streams[m.xid] = _Txn(
                Transaction(m.xid, is_streamed=True, first_lsn=lsn)
            )
        self._stream = state
        state.in_block = []
        state.block_lsn = lsn

    def _stream_begin_block(self, state: _Txn) -> None:
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
            if state.held:
                state.spool = Spool(self.budget)
        if not state.in_block:
            state.in_block = list(state.live)
            for i in state.live:
                self.members[i].call("stream_start", state.block_lsn, state.base.xid,
                                     self._view(state, i))
            if not state.in_block:
                state.in_block = [-1]  # the block is open even when nobody streams

    def _stream_item(self, state: _Txn, lsn: LSN, xid: int | None, raw: bytes | None, cb: str,
                     args: Callable[[], tuple[Any, ...] | None]) -> None:
        self._stream_begin_block(state)
        built = args() if state.live else None
        if built is not None:
            for i in state.live:
                member = self.members[i]
                if member.plugin.has(cb):  # records carry the top-level xid, as in C
                    member.call(cb, lsn, state.base.xid, self._view(state, i), *built)
        if state.spool is not None and raw is not None:
            state.spool.append(lsn, xid or 0, True, raw)

    def _on_stream_stop(self, m: StreamStop, lsn: LSN, raw: bytes | None) -> None:
        state = self._stream
        if state is None:
            raise PipelineError("Stream Stop outside of a stream block")
        self._stream = None
        for i in state.in_block:
            if i >= 0:
                self.members[i].call("stream_stop", lsn, state.base.xid, self._view(state, i))
        state.in_block = []

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
        for i in [i for i in state.live if self._delivered(i, m.commit_lsn)]:
            # a re-send of a transaction this member already committed: undo the re-stream
            self.members[i].call("stream_abort", m.end_lsn, m.xid, self._view(state, i), None)
        state.live = [i for i in state.live if not self._delivered(i, m.commit_lsn)]
        state.held = [i for i in state.held if not self._delivered(i, m.commit_lsn)]
        for i in state.live:
            view = self._view(state, i)
            view.final_lsn, view.end_lsn, view.commit_time = (m.commit_lsn, m.end_lsn,
                                                               m.commit_time)
            self.members[i].call("stream_commit", m.end_lsn, m.xid, view, m.commit_lsn)
        if state.held:
            self._replay(state, state.held, replace(base, is_streamed=False), m.commit_lsn,
                         prepared=False)
        self.relations.update(state.relations)
        self._close(state)
        self._mark(range(len(self.members)), m.end_lsn)
        self.transactions += 1

    def _on_stream_prepare(self, m: StreamPrepare, lsn: LSN, raw: bytes | None) -> None:
        state = self._streams.pop(m.xid, None)
        if state is None:
            raise PipelineError(f"Stream Prepare of transaction {m.xid}, which was never streamed")
        if m.gid in self._prepared:  # re-sent after a reconnect; we still hold the original
            for i in state.live:
                self.members[i].call("stream_abort", m.end_lsn, m.xid, self._view(state, i), None)
            self._close(state)
            return
        base = state.base
        for view in (base, *state.views.values()):
            view.final_lsn, view.end_lsn, view.gid = m.prepare_lsn, m.end_lsn, m.gid
            view.prepare_time, view.prepare_lsn, view.is_prepared = (m.prepare_time,
                                                                     m.prepare_lsn, True)
        state.prepare_lsn = m.prepare_lsn
        streamers, state.live = state.live, []
        for i in streamers:
            member = self.members[i]
            if member.ctx.twophase and not self._filters_prepare(member, base):
                if self._delivered(i, m.prepare_lsn):  # re-sent: undo the re-stream
                    member.call("stream_abort", m.end_lsn, m.xid, self._view(state, i), None)
                    state.outcome_only.append(i)
                    continue
                state.live.append(i)
                member.call("stream_prepare", m.end_lsn, m.xid, self._view(state, i),
                            m.prepare_lsn)
            else:
                state.streamed_held.append(i)
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
        if not state.held:
            self._close(state)
        self._prepared[m.gid] = state
        self._mark([*state.live, *state.skipped], m.end_lsn)

    # --- replay of held transactions ------------------------------------------------------------

    def _replay(self, state: _Txn, members: list[int], txn: Transaction, final_lsn: LSN,
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
            overlay = _Txn(txn, relations={relid: rel for relid, rel
                                           in state.replay_relations.items()
                                           if rel is not None})
            aborted = state.aborted_subxids
            for lsn, xid, in_stream, raw in spool:
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
                    views: dict[int, Transaction], overlay: _Txn) -> None:
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

    def feed_all(self, items: Sequence[tuple[bytes, LSN]]) -> None:
        for data, lsn in items:
            self.feed(data, lsn)
