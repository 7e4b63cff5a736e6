"""The incremental snapshot: a table's rows copied chunk by chunk into a running stream, with
no new slot and no pause (the watermark method of DBLog, Netflix 2019; Debezium's incremental
snapshots).

For each chunk (up to CHUNK_ROWS rows in key order after the last one copied):
1. a low watermark goes into the WAL (a non-transactional logical message), then the chunk is
   read (a plain SELECT, read committed), then a high watermark;
2. the stream is read on as usual; between the two watermarks, in the stream, the keys of the
   table's changes are noted: those transactions committed while the chunk may have been
   read, and their changes are in the stream;
3. at the high watermark, the chunk's rows whose keys were not noted are delivered, as a
   snapshot transaction (``txn.is_snapshot``) at that point of the stream. A noted row's
   value is the stream's to give.

A row not changed between the watermarks had, when read, the value it has at the high
watermark, so a consumer that upserts by key ends with the table. The stream's messages are
in commit order except streamed and prepared transactions, which the server sends before
they commit (or never commit): a chunk whose window sees one of those touch the table (or any
outcome of one) is read again. Watermarks and requests are non-transactional messages with
the prefix ``pgdecode``: the plugins never see them.

A snapshot is asked for with ``stream --snapshot-table`` or, for a running stream,
``pgdecode snapshot --table`` (a request message the stream reads from its slot).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from plugin_framework.framework import Pipeline
from plugin_framework.protocol import (
    LSN,
    Decoder,
    Delete,
    Insert,
    LogicalMessage,
    Update,
)
from plugin_framework.sources.errors import SourceError
from plugin_framework.sources.session import PROGRESS_INTERVAL, SnapshotProgress
from plugin_framework.sources.snapshots.catalog import (
    Key,
    Range,
    TableCopy,
    copy_statement,
    key_from_text,
    key_text,
    last_key,
    qualified_name,
    ranges_text,
    row_key,
    snapshot_table,
)
from plugin_framework.sources.snapshots.copy import copy_chunks
from plugin_framework.sources.snapshots.requests import (
    PREFIX,
    KeyText,
    read_request,
    request_snapshot,
)
from plugin_framework.sources.snapshots.toasted import Moves, made_whole
from plugin_framework.sources.snapshots.window import TableRead, Window

log = logging.getLogger("pgdecode.snapshot")




CHUNK_ROWS = 5000


MAX_RETRIES = 20  # reads of one chunk whose window streamed or prepared transactions crossed


# Streamed and prepared transactions are not in commit order (see the module's text)
_OUT_OF_ORDER = frozenset(ord(c) for c in "bPKrcAp")


_ENDS = frozenset(ord(c) for c in "CPKc")  # a transaction's end: an output may mark there


class IncrementalSnapshot:
    """Takes incremental snapshots of tables inside a stream (see the module's text). The
    source calls ``intercept`` for each message before feeding it to the pipeline, and
    ``step`` between reads."""

    def __init__(self, conninfo: str, slot: str, publications: Sequence[str],
                 pipeline: Pipeline, proto_version: int, chunk_rows: int = CHUNK_ROWS,
                 binary: bool = False, requests: bool = True,
                 track_moves: bool = True) -> None:
        # binary: the stream's values are in binary format, which the chunk's text keys
        # cannot be matched with: a snapshot is refused. requests: whether request messages
        # (``pgdecode snapshot``) are taken (a reader that reads the stream again would
        # take one again after it was done)
        self.conninfo, self.slot, self.publications = conninfo, slot, list(publications)
        self.requests = requests
        # moved rows read again (toasted.Moves; a reader that reads the stream again cannot
        # replay such reads: Spark's source)
        self.track_moves = track_moves
        self.pipeline = pipeline
        self.chunk_rows = chunk_rows
        self.binary = binary
        self.decoder = Decoder(proto_version)
        self.queue: list[str] = []
        self.current: TableRead | None = None
        self.window: Window | None = None
        self.done: list[str] = []
        # where to go on with a queued table an earlier run had begun (``resume``): after a
        # key, or in the ranges left of an initial copy that split it
        self.resume_after: dict[str, Key] = {}
        self.resume_ranges: dict[str, list[Range]] = {}
        self.resume_moved: dict[str, list[Key]] = {}
        # tables of an initial copy (walsender.py) that no output holds anything of: each
        # one's copy begins at its first chunk's low watermark (``_begin_copy``)
        self.starts: list[str] = []
        self.asked: set[str] = set()  # tables a request message asked for
        self.keys_only: set[str] = set()  # queued tables to read only the keys of (moved)
        # the requests of this stream's own (``ask``), taken already, whose messages it has
        # not read yet (recorded with the progress: one read after a restart is taken too)
        self.handled: set[str] = set()
        # the last request message taken: the progress an output records holds what it
        # asked for, so a restart that reads the message again leaves it
        self.requests_lsn = LSN(0)
        self._conn: psycopg.Connection[Any] | None = None
        # how far the table under way is (the last one's, once done), for the status line and
        # the logs; and the tables done since this object was made
        self.figures: SnapshotProgress | None = None
        self._moves_noted = False  # since the last progress noted
        self._finished = 0
        self._last_log = time.monotonic()

    # --- requests -----------------------------------------------------------------------------

    def request(self, table: str, keys: Sequence[Key] | None = None) -> None:
        """Read ``table`` into the stream: every row, or the rows under ``keys`` (read
        again once the table's chunks under way are read, if it is under way)."""
        table = qualified_name(table)
        current = self.current
        under_way = current is not None and current.copy.qualified == table
        if keys is not None:
            if current is not None and under_way:
                current.moves.add(keys)
            else:
                self.resume_moved.setdefault(table, []).extend(keys)
                if table not in self.queue:
                    self.keys_only.add(table)
                    self._queue(table)
            self._note_progress()
            return
        # Every row as it is now. A read under way, or one to resume, goes on after the
        # rows it read before the request (the values an ALTER TABLE gave are not in them),
        # so the table is read again whole, after the read under way.
        self.keys_only.discard(table)  # every row: the keys asked for among them
        self.resume_after.pop(table, None)
        self.resume_ranges.pop(table, None)
        if table not in self.queue:
            self._queue(table)
        self._note_progress()

    def include(self, table: str) -> None:
        """A table of ``--snapshot-table``: read it, unless it is read already or waits to go
        on (the same command run again after a restart goes on where it was)."""
        table = qualified_name(table)
        current = self.current
        self.keys_only.discard(table)  # every row: the keys asked for among them
        if table in self.queue or (current is not None and current.copy.qualified == table
                                   and not current.keys_only):
            return
        self._queue(table)
        self._note_progress()

    def ask(self, table: str, keys: Sequence[KeyText] | None = None) -> LSN:
        """A request of this run's own (a mirror's): taken at once, and made durable as a
        request message, which a restart before it is done reads again. Returns the
        message's LSN."""
        request_id = uuid.uuid4().hex
        self.handled.add(request_id)
        lsn = request_snapshot(self._connection(), self.slot, table, keys, request_id)
        log.info("incremental snapshot of %s%s asked for", qualified_name(table),
                 "" if keys is None else f" ({len(keys)} rows)")
        self.request(table, None if keys is None else [key_from_text(k) for k in keys])
        return lsn

    def _queue(self, table: str) -> None:
        self.queue.append(table)
        if self.figures is not None and not self.figures.done:
            self.figures.tables += 1

    @property
    def busy(self) -> bool:
        return self.current is not None or bool(self.queue)

    def close(self) -> None:
        """At the end of a stream: the chunk under way is read again from the next one (its
        watermarks may never come), and the connection is opened again when needed."""
        self.window = None
        self.disconnect()

    def disconnect(self) -> None:
        """Close the connection to the database (opened again when needed)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True,
                                         client_encoding="UTF8")
        return self._conn

    # --- the stream side ------------------------------------------------------------------------

    def intercept(self, data: bytes, lsn: LSN) -> bool:
        """Look at a message before the pipeline does; True: it is ours, not the plugins'."""
        tag = data[0]
        if tag == _M:
            in_stream = self.pipeline.decoder.in_stream
            self.decoder.in_stream = in_stream
            message = self.decoder.decode(data)
            assert isinstance(message, LogicalMessage)
            if message.prefix != PREFIX:
                return self._touches(data, in_stream)
            if not message.transactional:
                self._on_message(message, lsn)
                return True
            return False
        if self.current is not None and self.track_moves:
            if tag == _U:
                self._note_move(data)
            elif self._moves_noted and tag in _ENDS:  # recorded with the mark that follows
                self._moves_noted = False
                self._note_progress()
        window = self.window
        if window is None or not window.open or window.replay:
            return False
        if tag in _OUT_OF_ORDER:
            window.dirty = True
            return False
        return self._touches(data, self.pipeline.decoder.in_stream)

    def _touches(self, data: bytes, in_stream: bool) -> bool:
        """Note the keys of a change of the table in the window (never ours to swallow)."""
        window, table = self.window, self.current
        if window is None or not window.open or window.replay or table is None \
                or data[0] not in (_I, _U, _D):
            return False
        self.decoder.in_stream = in_stream
        message = self.decoder.decode(data)
        assert isinstance(message, Insert | Update | Delete)
        if message.relation_id != table.copy.relid:
            return False
        if in_stream:
            window.dirty = True
            return False
        relation = self.pipeline.relations.get(message.relation_id)
        if relation is None:
            window.dirty = True
            return False
        positions = [relation.index[name] for name in table.copy.key]
        keys: dict[str, Key] = {}
        for name in ("new", "key", "old"):
            tuple_ = getattr(message, name, None)
            if tuple_ is not None:
                keys[name] = tuple(tuple_.values[i] for i in positions)
                window.changed.add(keys[name])
        new = getattr(message, "new", None)
        old = keys.get("old", keys.get("key"))
        if isinstance(message, Update) and old is None:
            old = keys["new"]  # the key did not change
        window.moves.append((old, keys.get("new"), new))
        return False

    def _on_message(self, message: LogicalMessage, lsn: LSN) -> None:
        try:
            body = json.loads(bytes(message.content))
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        asked = read_request(body, self.slot)
        if asked is not None:
            if lsn <= self.requests_lsn:
                return  # taken before a restart: in the progress resumed from
            self.requests_lsn = lsn
            if asked.id is not None and asked.id in self.handled:
                self.handled.discard(asked.id)  # taken when it was asked
                return
            if self.requests:
                log.info("incremental snapshot of %s requested%s", asked.table,
                         "" if asked.keys is None else f" ({len(asked.keys)} rows)")
                self.asked.add(asked.table)
                self.request(asked.table, asked.keys)
            return
        window = self.window
        if window is None or body.get("chunk") != window.chunk_id:
            return
        if body.get("mark") == "low":
            window.open = True
            if self.current is not None:  # moves noted from here on are the window's
                window.noted = self.current.moves.noted
            if window.after is None and window.table in self.starts and not window.replay:
                self._begin_copy(window.table, lsn)
        elif body.get("mark") == "high" and window.open:
            self._deliver(window, lsn)

    def _deliver(self, window: Window, lsn: LSN) -> None:
        table = self.current
        assert table is not None
        self.window = None
        if window.replay:
            assert table.copy.relation is not None
            self.pipeline.snapshot_rows(table.copy.relation, table.copy.types, window.inserts,
                                        lsn, _now(), mark=True)
            return
        if window.dirty:
            table.retries += 1
            if table.retries > MAX_RETRIES:
                raise SourceError(
                    f"incremental snapshot of {table.copy.qualified}: {MAX_RETRIES} reads of "
                    "one chunk in a row overlapped streamed or prepared transactions changing "
                    "it; take it when such transactions are rarer")
            return  # read again at the next step
        table.retries = 0
        kept = [(key, data) for data, key in zip(window.inserts, window.keys, strict=True)
                if key not in window.changed]
        kept += made_whole(window.moves, dict(zip(window.keys, window.inserts, strict=True)),
                           table.copy.relid, len(table.copy.columns),
                           Decoder(self.decoder.proto_version))
        keep = [data for _, data in kept]
        # rows given whole as the window's last change left them
        table.moves.delivered([key for key, _ in kept], table.moves.noted)
        if window.moved is not None:  # each read again: given, or the stream has its news
            table.moves.delivered(window.moved, window.noted)
        assert table.copy.relation is not None
        table.rows += len(keep)
        progress = self.figures
        if progress is not None:
            progress.rows += len(keep)
            progress.bytes += sum(map(len, keep))
        if window.moved is None:
            if window.keys:
                table.after = window.keys[-1]
            table.moves.read_all = len(window.inserts) < self.chunk_rows
            if table.moves.read_all and table.ranges:  # the range's end: the next range
                table.after, table.upto = table.ranges.pop(0)
                table.moves.read_all = False
        finished = table.moves.read_all and not table.moves
        if finished:
            self.current = None
            if table.copy.qualified not in self.done:
                self.done.append(table.copy.qualified)
            self._finished += 1
        self._note_progress()  # recorded with the chunk's mark, below
        self.pipeline.snapshot_rows(table.copy.relation, table.copy.types, keep, lsn,
                                    _now(), mark=True)
        if finished:
            fields = None
            if progress is not None:
                progress.tables_done += 1
                progress.done = True
                fields = progress.fields()
            log.info("incremental snapshot of %s done: %d rows", table.copy.qualified,
                     table.rows, extra={"snapshot": fields})
        elif progress is not None and time.monotonic() - self._last_log >= PROGRESS_INTERVAL:
            self._last_log = time.monotonic()
            progress.log(log)
        if finished and self.track_moves:
            self._next_table()  # at once: its rows' moves are noted from here on

    def _begin_copy(self, name: str, lsn: LSN) -> None:
        """The copy of a table of an initial copy begins here, before the first chunk's
        window: a snapshot transaction with no rows and ``snapshot_starts`` (a mirror
        starts the table there, empty, as for an uninterrupted copy; docs/framework.md).
        Not at the high watermark: the stream's changes inside the window are the rows'
        values, and would go with the table."""
        table = self.current
        assert table is not None and table.copy.relation is not None
        self.starts.remove(name)
        self._note_progress()  # recorded with the next mark, which comes after it
        self.pipeline.snapshot_rows(table.copy.relation, table.copy.types, [], lsn, _now(),
                                    first=True)

    def _note_progress(self) -> None:
        """Tell the outputs that record it (FILE.progress) where the snapshots stand after
        the chunk being delivered: a restart resumes there."""
        self.pipeline.note_snapshot_progress(self.progress())

    def progress(self) -> dict[str, Any] | None:
        """Where the snapshots stand (None: none was asked for), as ``resume`` takes it."""
        table = self.current
        if table is None and not self.queue and not self.done:
            return None
        state: dict[str, Any] = {
            "slot": self.slot, "queue": list(self.queue), "done": list(self.done),
            "after": {name: key_text(key) for name, key in self.resume_after.items()}}
        if self.requests_lsn:
            state["requests_lsn"] = str(self.requests_lsn)
        if self.handled:
            state["asked"] = sorted(self.handled)
        ranges = {name: ranges_text(left) for name, left in self.resume_ranges.items()}
        if table is not None:
            state["table"] = table.copy.qualified
            if table.upto is not None or table.ranges:
                ranges[table.copy.qualified] = ranges_text([(table.after, table.upto),
                                                             *table.ranges])
            elif table.after is not None:
                state["after"][table.copy.qualified] = key_text(table.after)
        if ranges:
            state["ranges"] = ranges
        if self.starts:
            state["starts"] = list(self.starts)
        moved = {name: [key_text(k) for k in keys] for name, keys in self.resume_moved.items()}
        if table is not None and table.moves:
            moved[table.copy.qualified] = [key_text(k) for k in table.moves.keys]
        if moved:
            state["moved"] = moved
        keys_only = sorted(self.keys_only | ({table.copy.qualified}
                                             if table is not None and table.keys_only else set()))
        if keys_only:
            state["keys_only"] = keys_only
        return state

    def resume(self, state: dict[str, Any]) -> None:
        """Go on with the snapshots an output recorded (``note_incremental``, or an initial
        copy's record of the same form that did not finish): the table under way and those
        queued, each after the last key the output holds of it (of each of its ranges, for
        a table an initial copy split: snapshot.CopyLedger)."""
        if state.get("slot") != self.slot:
            return
        self.done = [str(name) for name in state.get("done", [])]
        self.requests_lsn = LSN(str(state.get("requests_lsn") or "0/0"))
        self.handled = {str(request_id) for request_id in state.get("asked", [])}
        self.resume_after = {str(name): key_from_text(key)
                             for name, key in (state.get("after") or {}).items()}
        self.resume_ranges = {str(name): [(_bound(after), _bound(upto)) for after, upto in left]
                              for name, left in (state.get("ranges") or {}).items()}
        self.resume_moved = {str(name): [key_from_text(key) for key in keys]
                             for name, keys in (state.get("moved") or {}).items()}
        table = state.get("table")
        names = ([table] if table is not None else []) + list(state.get("queue", []))
        if state.get("initial"):  # an initial copy's record: the tables it had not begun
            self.starts = [str(n) for n in names
                           if n not in self.resume_after and n not in self.resume_ranges]
        else:
            self.starts = [str(n) for n in state.get("starts", [])]
        self.keys_only = {str(name) for name in state.get("keys_only", [])}
        for name in names:
            self._queue(str(name))
            log.info("incremental snapshot of %s: resumed after key %s", name,
                     (state.get("ranges") or {}).get(name) or state.get("after", {}).get(name))

    # --- the database side ----------------------------------------------------------------------

    def step(self) -> None:
        """Between reads of the stream: start the next chunk if none is under way."""
        if self.window is not None:
            return
        if self.current is None and not self._next_table():
            return
        assert self.current is not None
        self.window = self._read_chunk(self.current)

    def _next_table(self) -> bool:
        """The next queued table becomes the one under way; False: none can."""
        if not self.queue:
            return False
        name = self.queue.pop(0)
        try:
            self.current = self._table(name)
        except SourceError as exc:
            if name not in self.asked:
                raise  # --snapshot-table: the command line is wrong
            # asked by `pgdecode snapshot`: the stream goes on without it
            log.error("%s; the request is dropped", exc)
            self._note_progress()
            return False
        self.figures = SnapshotProgress(
            tables=self._finished + 1 + len(self.queue), tables_done=self._finished,
            rows_estimate=self.current.copy.rows_estimate, table=self.current.copy.qualified)
        self.current.after = self.resume_after.pop(name, None)
        self.current.moves = Moves(self.resume_moved.pop(name, []))
        if name in self.keys_only:  # only the rows under the keys asked for: no chunks
            self.keys_only.discard(name)
            self.current.keys_only = self.current.moves.read_all = True
        ranges = self.resume_ranges.pop(name, None)
        if ranges:
            (self.current.after, self.current.upto), *self.current.ranges = ranges
        elif self.current.copy.ordered and not self.current.keys_only:
            # up to the greatest key now: what is inserted above it comes from the stream
            self.current.upto = last_key(self._connection(), self.current.copy)
        return True

    def adopt(self, window: Window | None) -> bool:
        """Take a chunk read earlier (by a reader that reads the stream again, from the
        same progress): True if it is the next one."""
        if self.current is None and not self._next_table():
            return False
        assert self.current is not None
        if window is None or window.table != self.current.copy.qualified \
                or window.after != self.current.after:
            return False
        window.rewind()
        self.window = window
        return True

    def replay(self, table: str, after: Key | None, last: Key | None, chunk_id: str) -> None:
        """The chunk of a batch planned again (Spark's source): the table's rows after
        ``after`` up to ``last`` as they are now, every one delivered at the high watermark
        of ``chunk_id`` (the stream after it brings each row to its value then; see
        docs/snapshot.md)."""
        copy = self._table(table).copy
        inserts: list[bytes] = []
        if last is not None:
            statement = copy_statement(copy, after=after, upto=last)
            inserts = [i for chunk in copy_chunks(self._connection(), copy, CHUNK_ROWS,
                                                  statement=statement) for i in chunk.inserts]
        self.current = TableRead(copy, after)
        self.window = Window(chunk_id, copy.qualified, after, inserts,
                              self._keys(copy, inserts), open=True, replay=True)

    def _table(self, name: str) -> TableRead:
        if self.binary:
            raise SourceError(
                f"incremental snapshot of {name}: this stream's values are in binary format "
                "(--binary), and the chunks' keys are matched with the stream's as text: "
                "take it from a stream without --binary")
        copy = snapshot_table(self._connection(), name, self.publications)
        log.info("incremental snapshot of %s: by %s", copy.qualified, ", ".join(copy.key))
        return TableRead(copy)

    def _read_chunk(self, table: TableRead) -> Window:
        """The next chunk between its watermarks: the rows after the last key delivered, or,
        once those are all read, rows moved since that are to be read again."""
        conn = self._connection()
        chunk_id = uuid.uuid4().hex
        copy = table.copy
        moved = table.moves.first(self.chunk_rows) if table.moves.read_all else None
        if moved:
            statement = copy_statement(copy, keys=moved)
        else:
            statement = copy_statement(copy, after=table.after, limit=self.chunk_rows,
                                       upto=table.upto)
        low = self._mark(conn, chunk_id, "low")
        inserts = [i for chunk in copy_chunks(conn, copy, self.chunk_rows + 1,
                                              statement=statement) for i in chunk.inserts]
        high = self._mark(conn, chunk_id, "high")
        return Window(chunk_id, copy.qualified, table.after, inserts,
                      self._keys(copy, inserts), low=low, high=high, moved=moved or None)

    def _note_move(self, data: bytes) -> None:
        """An UPDATE, maybe of the table under way: a row to read again (toasted.Moves)?"""
        table = self.current
        assert table is not None
        in_stream = self.pipeline.decoder.in_stream
        at = 5 if in_stream else 1  # the relation's id, after a streamed change's xid
        if int.from_bytes(data[at:at + 4], "big") != table.copy.relid:
            return
        relation = self.pipeline.relations.get(table.copy.relid)
        if relation is None or any(k not in relation.index for k in table.copy.key):
            return
        self.decoder.in_stream = in_stream
        message = self.decoder.decode(data)
        assert isinstance(message, Update)
        if table.moves.note(message, [relation.index[k] for k in table.copy.key]):
            self._moves_noted = True  # for the progress record, at the transaction's end

    def _keys(self, copy: TableCopy, inserts: list[bytes]) -> list[Key]:
        decoder = Decoder(self.decoder.proto_version)
        return [row_key(decoder, copy, data) for data in inserts]

    def _mark(self, conn: psycopg.Connection[Any], chunk_id: str, mark: str) -> LSN:
        row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text",
                           (PREFIX, json.dumps({"chunk": chunk_id, "mark": mark}))).fetchone()
        assert row is not None
        return LSN(row[0])


def _bound(values: Sequence[Any] | None) -> Key | None:
    return None if values is None else key_from_text(values)


def _now() -> datetime:
    return datetime.now(UTC)


_M, _I, _U, _D = ord("M"), ord("I"), ord("U"), ord("D")
