"""The pipeline: PostgreSQL's ReorderBuffer for a pgoutput stream. Messages go in (``feed``
with their bytes, or ``handle`` decoded); output-plugin callbacks come out with the reorder
buffer's contract:

- Only committed transactions reach begin/change/commit, in commit order.
- Streamed transactions reach plugins with stream callbacks block by block; plugins without
  them get the transaction reassembled at Stream Commit, subtransaction aborts applied, and
  nothing for an aborted stream (streams.py).
- Prepared transactions reach two-phase plugins at PREPARE (unless filter_prepare says no);
  the others get them as ordinary transactions at COMMIT PREPARED, nothing at ROLLBACK
  PREPARED (twophase.py), or, streamed before PREPARE to a streaming plugin, the rest and
  stream_commit at COMMIT PREPARED, stream_abort at ROLLBACK PREPARED (streams.py).
- filter_by_origin skips a whole transaction for the plugin that asks.

Each plugin has its own context, options, private state and output. The pipeline knows up to
which LSN every output is durable, and never reports past a prepared transaction that some
plugin still waits for (acknowledge.py).

This module holds the set-up, the input routes, and the messages that belong to a stream
block or to a transaction alike (Relation, Origin, row changes, TRUNCATE, messages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from plugin_framework.framework.context import LogicalDecodingContext
from plugin_framework.framework.model import Relation, Transaction
from plugin_framework.framework.outputs import (
    Batching,
    FileOutput,
    Output,
    RecordingSnapshots,
    Resuming,
    capable,
)
from plugin_framework.framework.plugin import LoadedPlugin
from plugin_framework.framework.reorder.buffer import (
    DEFAULT_MEMORY_LIMIT,
    INSERT_TAG,
    TRUNCATE_TAG,
)
from plugin_framework.framework.reorder.members import Member
from plugin_framework.framework.reorder.streams import Streams
from plugin_framework.framework.reorder.twophase import TwoPhase
from plugin_framework.framework.reorder.txn import (
    RAW_PASS,
    RAW_UNSURE,
    UNPLANNED,
    PipelineError,
    TxnState,
)
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
    RelationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    encode,
)
from plugin_framework.protocol.raw import ID_AFTER_TAG, ROW_CHANGE_MIN_SIZE, ROW_CHANGE_TAGS

STREAMED_CHANGE_MIN_SIZE = ROW_CHANGE_MIN_SIZE + ID_AFTER_TAG.size  # the tag, xid, relation id
_TAGS: dict[type, int] = {Insert: ord("I"), Update: ord("U"), Delete: ord("D")}


class Pipeline(Streams, TwoPhase):
    """Drives output plugins from pgoutput messages (the ReorderBuffer of a slot)."""

    def __init__(self, *, proto_version: int = 4, memory_limit: int = DEFAULT_MEMORY_LIMIT,
                 spool_dir: str | None = None, slot_name: str | None = None,
                 catalog: Any = None) -> None:
        super().__init__(proto_version=proto_version, memory_limit=memory_limit,
                         spool_dir=spool_dir, slot_name=slot_name, catalog=catalog)
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
        if capable(ctx.output, Batching):
            ctx.output.attach(ctx)  # it needs its member's options before startup
        self.members.append(Member(loaded, ctx))
        return ctx

    def startup(self, is_init: bool = False) -> None:
        """Call every plugin's startup. A plugin may clear ``ctx.streaming`` or
        ``ctx.twophase`` there to receive streamed or prepared transactions whole, at commit
        (as ``ctx->streaming &= ...`` does in C)."""
        self._started = True
        for m in self.members:
            m.ctx.streaming = m.plugin.streaming
            m.ctx.twophase = m.plugin.two_phase
            if m.plugin.has("startup"):
                m.call("startup", LSN(0), None, m.ctx.options, is_init, writes=False)
            m.ctx.streaming = m.ctx.streaming and m.plugin.streaming
            m.ctx.twophase = m.ctx.twophase and m.plugin.two_phase
        held = self._load_held()  # every entry checked before an output is claimed (cut)
        if self.slot_name is not None:
            # An output resumed after a restart skips what it holds; that is only right for
            # the stream that wrote it, with prepared transactions taken the same way.
            for m in self.members:
                if capable(m.ctx.output, Resuming):
                    m.ctx.output.claim(self.slot_name, two_phase=m.ctx.twophase)
        self._done = [m.ctx.output.resume_lsn if capable(m.ctx.output, Resuming) else LSN(0)
                      for m in self.members]
        self._restore_held(held)
        for i, m in enumerate(self.members):
            # Streams the output had blocks of, unfinished, when it was last durable: the
            # server streams them again from their start. Abort the old blocks first, as
            # reset() does after a lost connection. (Not those of a prepared transaction it
            # holds: the server does not send that again, its rest is in the entry.)
            holding = {s.base.xid for s in self._prepared.values() if i in s.streamed_held}
            resumed = m.ctx.output.resume_open_streams \
                if capable(m.ctx.output, Resuming) else ()
            for xid in resumed:
                if xid not in holding and m.plugin.has("stream_abort"):
                    m.call("stream_abort", LSN(0), xid,
                           Transaction(xid, is_streamed=True), None)

    def shutdown(self) -> None:
        try:
            for m in self.members:
                if m.plugin.has("shutdown"):
                    m.call("shutdown", LSN(0), None, writes=False)
        finally:  # a failing shutdown callback must not leave the outputs unclosed
            for m in self.members:
                m.ctx.output.close()
        for state in [*self._streams.values(), *self._prepared.values()]:
            self._close(state)

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

    # --- input --------------------------------------------------------------------------------

    def feed(self, data: bytes, lsn: LSN) -> None:
        """One pgoutput message as the server sent it, and its XLogData start LSN."""
        pending = self._pending
        if pending is not None and not (
                data[:1] == b"p" and isinstance(prepare := self.decoder.decode(data), StreamPrepare)
                and prepare.xid == pending.base.xid):
            self._release_block()
        stream = self._stream
        if stream is not None:
            if stream.in_block and not stream.live and stream.spool is not None \
                    and len(data) >= STREAMED_CHANGE_MIN_SIZE and data[0] in ROW_CHANGE_TAGS:
                # A row change of a streamed transaction that only goes to the spool: its rows
                # are parsed once, at replay, not also now (a malformed one is reported then).
                self.changes += 1
                xid = ID_AFTER_TAG.unpack_from(data, 1)[0]
                counts = stream.counts
                key = (xid, ID_AFTER_TAG.unpack_from(data, 5)[0], data[0])
                counts[key] = counts.get(key, 0) + 1
                stream.spool.append(lsn, xid, True, data)
                return
        else:
            state = self._txn
            if state is not None and (state.fast is not None or not state.started) \
                    and len(data) >= ROW_CHANGE_MIN_SIZE and data[0] in ROW_CHANGE_TAGS:
                if not state.started:
                    self._start(state)
                fast = state.fast
                if fast is not None:
                    relid = ID_AFTER_TAG.unpack_from(data, 1)[0]
                    writers = fast.get(relid, UNPLANNED)
                    if writers is UNPLANNED:
                        writers = self._plan_writers(state, relid)
                    verdicts = state.raw_filters  # under a change_filter
                    if writers is not None:
                        verdict = RAW_PASS if verdicts is None else verdicts[relid](data)
                        if verdict != RAW_UNSURE:  # else decoded and filtered below
                            self.changes += 1
                            counts = state.counts
                            key = (0, relid, data[0])
                            counts[key] = counts.get(key, 0) + 1
                            if verdict == RAW_PASS:
                                self._deliver(writers, data, lsn, state.base.xid, None,
                                              decoder=self.decoder, state=state)
                            if state.spool is not None:
                                state.spool.append(lsn, 0, False, data)
                            return
        message = self.decoder.decode(data)
        self._handlers[type(message)](message, lsn, data)

    def feed_run(self, datas: list[bytes], lsns: list[LSN]) -> None:
        """A run of row changes at their LSNs, as the walsender source finds them in what it
        reads (protocol/runs.py: the same type byte and the same id after it): what ``feed``
        does with each in turn. An ordinary transaction's changes of one relation go to each
        member's formatter in one call (``_feed_changes``); a stream block's that only go to
        its spool are spooled without a trip through ``feed`` each."""
        if self._pending is not None:  # what feed does at any message but a StreamPrepare
            self._release_block()
        stream, state = self._stream, self._txn
        if stream is None and state is not None and len(datas[0]) >= ROW_CHANGE_MIN_SIZE:
            if not state.started:
                self._start(state)
            if state.fast is not None:
                self._feed_changes(ID_AFTER_TAG.unpack_from(datas[0], 1)[0], datas[0][0],
                                   datas, lsns)
                return
        elif stream is not None:
            if not stream.in_block:  # the block's first content opens it, as feed does
                self.feed(datas[0], lsns[0])
                if len(datas) == 1:
                    return
                datas, lsns = datas[1:], lsns[1:]
            if stream.in_block and not stream.live and stream.spool is not None:
                self._spool_run(stream, datas, lsns)
                return
        for data, lsn in zip(datas, lsns, strict=True):
            self.feed(data, lsn)

    def _spool_run(self, stream: TxnState, datas: list[bytes], lsns: list[LSN]) -> None:
        """``feed`` of each of a run of a stream block's row changes (one xid: the run's
        key) that only go to its spool: counted and spooled in one go (if one is too short
        for its ids, each goes through ``feed``, which reports it in its place)."""
        spool = stream.spool
        assert spool is not None
        if min(map(len, datas)) < STREAMED_CHANGE_MIN_SIZE:
            for data, lsn in zip(datas, lsns, strict=True):
                self.feed(data, lsn)
            return
        self.changes += len(datas)
        counts = stream.counts
        xid = ID_AFTER_TAG.unpack_from(datas[0], 1)[0]
        tag = datas[0][0]
        read_id = ID_AFTER_TAG.unpack_from
        for data in datas:  # (the relation may change within the run)
            key = (xid, read_id(data, 5)[0], tag)
            counts[key] = counts.get(key, 0) + 1
        spool.append_run(lsns, xid, True, datas)

    def _feed_changes(self, relid: int, tag: int, datas: list[bytes],
                      lsns: LSN | list[LSN]) -> None:
        """Raw row changes of type ``tag`` of relation ``relid`` in the open ordinary
        transaction, all at one LSN (a snapshot's chunk) or each at its own (a list): what
        ``feed`` does with each in turn, except that a member's formatter takes the run in
        one call (``_deliver_many``)."""
        state = self._current("rows")
        fast, verdicts, spool = state.fast, state.raw_filters, state.spool
        writers = None
        if fast is not None and self._stream is None and self._pending is None:
            writers = fast.get(relid, UNPLANNED)
            if writers is UNPLANNED:
                writers = self._plan_writers(state, relid)
        each = lsns if isinstance(lsns, list) else [lsns] * len(datas)
        if writers is None:  # no formatter, or the filter must see each change decoded
            for data, lsn in zip(datas, each, strict=True):
                self.feed(data, lsn)
            return
        xid = state.base.xid
        run, at = datas, lsns
        decided = len(datas)  # counted here; an unsure one where it is decoded
        if verdicts is not None or spool is not None:
            verdict = None if verdicts is None else verdicts[relid]
            run = []
            run_at: list[LSN] = []
            for data, lsn in zip(datas, each, strict=True):
                said = RAW_PASS if verdict is None else verdict(data)
                if said == RAW_UNSURE:  # decoded and filtered, in its place (as feed does)
                    decided -= 1
                    self._deliver_many(writers, run, run_at, xid, state)
                    run, run_at = [], []
                    message = self.decoder.decode(data)
                    self._handlers[type(message)](message, lsn, data)
                    continue
                if said == RAW_PASS:
                    run.append(data)
                    run_at.append(lsn)
                if spool is not None:
                    spool.append(lsn, 0, False, data)
            at = run_at
        self._deliver_many(writers, run, at, xid, state)
        self.changes += decided
        key = (0, relid, tag)
        state.counts[key] = state.counts.get(key, 0) + decided

    def feed_all(self, items: Sequence[tuple[bytes, LSN]]) -> None:
        for data, lsn in items:
            self.feed(data, lsn)

    def handle(self, message: Message, lsn: LSN) -> None:
        """A message decoded elsewhere (its raw bytes are re-encoded only if it must be held)."""
        pending = self._pending
        if pending is not None and not (isinstance(message, StreamPrepare)
                                        and message.xid == pending.base.xid):
            self._release_block()
        if isinstance(message, StreamStart):
            self.decoder.in_stream = True
        elif isinstance(message, StreamStop):
            self.decoder.in_stream = False
        self._handlers[type(message)](message, lsn, encode(message))

    # --- messages of a stream block or a transaction alike ---------------------------------------

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
            if m.relation_id in stream.relations:
                stream.catalog_changes = True  # described again: its definition changed
            stream.relations[m.relation_id] = rel
            if raw is not None:
                if stream.spool is not None:
                    stream.spool.append(lsn, m.xid or 0, True, raw)
                if stream.block is not None:
                    stream.block.spool.append(lsn, m.xid or 0, True, raw)
        else:
            state = self._txn
            if state is not None and state.spool is not None and raw is not None:
                # Its held members get it replayed later: at that point in the replay they
                # need this definition, and before it the one in force now.
                state.replay_relations.setdefault(m.relation_id,
                                                  self.relations.get(m.relation_id))
                state.spool.append(lsn, 0, False, raw)
            self.relations[m.relation_id] = rel
            if state is not None:  # formatters of the old description
                if state.fast is not None:
                    state.fast.pop(m.relation_id, None)
                if state.raw_filters is not None:
                    state.raw_filters.pop(m.relation_id, None)
                if state.filtered_fast is not None:
                    state.filtered_fast.pop(m.relation_id, None)

    def _on_type(self, m: Type, lsn: LSN, raw: bytes | None) -> None:
        self.type_names[m.type_oid] = (m.namespace, m.name)

    def _on_change(self, m: Insert | Update | Delete, lsn: LSN, raw: bytes | None) -> None:
        self.changes += 1
        stream = self._stream
        key = (m.xid or 0, m.relation_id, _TAGS[type(m)])
        if stream is not None:
            stream.counts[key] = stream.counts.get(key, 0) + 1
            def args() -> tuple[Any, ...] | None:
                change = self._change(m, lsn, stream)
                return None if change is None else (change.relation, change)

            self._stream_item(stream, lsn, m.xid, raw, "stream_change", args)
            return
        state = self._txn
        if state is None or not state.started:
            state = self._current("change")
        state.counts[key] = state.counts.get(key, 0) + 1
        live = state.live
        if live:
            built = self._unfiltered_change(m, lsn, state)
            cache, writers = state.filtered_fast, None
            if cache is not None and raw is not None:
                writers = cache.get(m.relation_id, UNPLANNED)
                if writers is UNPLANNED:
                    writers = cache[m.relation_id] = self._fast_writers(state, m.relation_id)
            if writers is not None and raw is not None:
                self._deliver_filtered(writers, built, raw, lsn, state.base.xid)
            else:
                change = built if self.change_filter is None else self.change_filter(built)
                if change is not None:
                    members = self.members
                    for i in live:
                        members[i].call_change(lsn, state.base.xid, self._view(state, i),
                                               change)
        if state.spool is not None and raw is not None:
            state.spool.append(lsn, 0, False, raw)

    def _on_truncate(self, m: Truncate, lsn: LSN, raw: bytes | None) -> None:
        stream = self._stream
        counts = (stream if stream is not None else self._current("truncate")).counts
        for relid in m.relation_ids:
            key = (m.xid or 0, relid, TRUNCATE_TAG)
            counts[key] = counts.get(key, 0) + 1
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

    # --- the initial snapshot ------------------------------------------------------------------

    def snapshot_rows(self, relation: RelationMessage, types: Iterable[Type],
                      inserts: Iterable[bytes], lsn: LSN, read_time: datetime,
                      *, mark: bool = False, first: bool = False) -> None:
        """Rows of a table's initial copy (sources/snapshots/copy.py), as one read-only transaction
        (``txn.is_snapshot``, xid 0, at the slot's consistent point ``lsn``): the table's
        description, then ``inserts``, raw pgoutput Insert messages, which take the path of
        any transaction's inserts (the change filter, the fast path). Nothing is marked
        (``end_snapshot`` marks the whole initial copy) unless ``mark``: an incremental
        snapshot's chunk, at its own place in the stream. ``first``: the table's copy
        begins here, and nothing of it was delivered before (``txn.snapshot_starts``)."""
        txn = Transaction(0, final_lsn=lsn, end_lsn=lsn, commit_time=read_time,
                          first_lsn=lsn, is_snapshot=True)
        self._open(txn)
        for t in types:
            self._on_type(t, lsn, None)
        self._on_relation(relation, lsn, None)  # described first, as the stream does
        if first:  # before the plugins' begin, which the rows bring about
            txn.snapshot_starts = self.relations[relation.relation_id]
        filters = self.change_filter, self.raw_change_filter
        if self.snapshot_change_filter is not None:
            self.change_filter = self.snapshot_change_filter
            self.raw_change_filter = self.raw_snapshot_change_filter
        try:
            self._feed_changes(relation.relation_id, INSERT_TAG, list(inserts), lsn)
        finally:
            self.change_filter, self.raw_change_filter = filters
        state = self._current("snapshot rows")
        self._txn = None
        for i in state.live:
            self.members[i].call("commit", lsn, 0, state.views[i], lsn)
        self._close(state)
        self.transactions += 1
        self._count(state)
        if mark:
            self._mark(range(len(self.members)), lsn)

    def begin_snapshot(self) -> None:
        """Before the first snapshot rows: outputs that record their state (FILE.progress)
        record that a copy is under way, so that a run that dies during it is told to copy
        again from a new slot (the copy's snapshot dies with the connection)."""
        for output in self._recording():
            output.begin_snapshot()

    def note_snapshot_progress(self, state: dict[str, Any] | None) -> None:
        """How far the snapshots will be once the next snapshot rows are delivered (the form
        of an incremental snapshot's record: sources/snapshots/incremental.py; None: none under
        way).
        Said before those rows, so that an output that delivers them at once (Spark's
        batches) records the state that goes with them; outputs that record it (FILE.progress)
        do so with their next mark or ``snapshot_checkpoint``."""
        for output in self._recording():
            output.note_incremental(state)

    def snapshot_checkpoint(self) -> None:
        """The initial copy's rows so far are whole transactions in every output, as far as
        the last ``note_snapshot_progress`` said: outputs that record it do, durably at the
        next flush."""
        for output in self._recording():
            output.snapshot_checkpoint()

    def take_snapshot_requests(
            self, request: Callable[[str, Sequence[Sequence[str | None]] | None], LSN]) -> None:
        """The source takes incremental snapshot requests: every plugin may make them
        (``ctx.request_snapshot``)."""
        for m in self.members:
            m.ctx.request_snapshot = request

    def continue_snapshot(self) -> None:
        """An initial copy cut short goes on as an incremental snapshot inside the stream:
        outputs that record the copy's state record that (until ``end_snapshot``), so that
        the copy is not taken for complete while tables are left."""
        for output in self._recording():
            output.continue_snapshot()

    def end_snapshot(self, lsn: LSN) -> None:
        """The copy is complete: every output holds what it had of it once durable at
        ``lsn`` (the slot's consistent point), and records the copy as done."""
        for output in self._recording():
            output.end_snapshot()
        self._mark(range(len(self.members)), lsn)

    def _recording(self) -> list[RecordingSnapshots]:
        """The outputs that record the snapshots' state (outputs.RecordingSnapshots)."""
        return [m.ctx.output for m in self.members
                if capable(m.ctx.output, RecordingSnapshots)]
