"""The data source's reads of the slot: a peek through the SQL interface
(``pg_logical_slot_peek_binary_changes``, up to the WAL flushed) run through a pgdecode
Pipeline, whose committed transactions ending in a range become change rows
(``decode_slot``); the slot's position, and its advance once Spark commits a batch.

Nothing here is consumed: a batch planned again reads the same range again. Why a peek asks
for as many messages as it does, and reads no further than it must: ``decode_slot``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from plugin_framework import LSN, MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.sources.errors import explain
from plugin_framework.sources.session import (
    SourceConfig,
    highest_proto_version,
    pgoutput_options,
)
from plugin_framework.sources.slots import (
    check_usable,
    create_slot,
    list_slots,
    lookup_slot,
    sql_query,
)
from plugin_framework.sources.snapshots.incremental import IncrementalSnapshot
from plugin_framework.spark.changes.builder import ChangeBuilder
from plugin_framework.spark.changes.plans import PlanCache
from plugin_framework.spark.datasource.options import SourceOptionError, SourceOptions
from plugin_framework.spark.datasource.snapshot import Make, start_tables, wal_flushed

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Decoded", "advance_slot", "connect", "decode_slot", "flush_position",
           "slot_position"]


class _Collector(OutputPlugin):
    """Collects the rows of the committed transactions ending in (start, end]."""

    name = "pgoutput-source"

    def __init__(self, builder: ChangeBuilder, start: LSN, end: LSN | None,
                 limit: int | None) -> None:
        self.builder = builder
        self.start = start
        self.end = end
        self.limit = limit
        self.last_end: LSN | None = None
        self.full = False
        self.done = False  # the transaction ending at ``end`` was seen
        self.snapshot_taken = False  # a snapshot chunk is among the rows
        self._cur: tuple[int, Any] | None = None

    def begin(self, ctx: Any, txn: Any) -> None:
        if self._cur is not None:
            self.builder.rollback(self._cur[1])
        self._cur = self.builder.open_for(txn)
        starts = getattr(txn, "snapshot_starts", None)
        if starts is not None:  # a table's copy begins (start_tables): a TRUNCATE row
            self.builder.add_truncate(self._cur[0], [starts], txn.final_lsn)

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        assert self._cur is not None
        self.builder.add_change(self._cur[0], change)

    def fast_change(self, ctx: Any, relation: Any) -> Any:
        """The change callback's work on raw messages, in C where it is built."""
        cur = self._cur
        return None if cur is None else self.builder.raw_writer(cur[0], relation)

    def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        assert self._cur is not None
        self.builder.add_truncate(self._cur[0], relations, change.lsn)

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        assert self._cur is not None
        index, mark = self._cur
        self._cur = None
        # A snapshot chunk sits at its high watermark, a message: one past it, so that it is
        # after a transaction whose commit ends there, and before any that commits later
        snapshot = bool(txn.is_snapshot)
        # a table's start (start_tables), which every table to copy gets in this batch
        starts = getattr(txn, "snapshot_starts", None) is not None
        end = LSN(txn.end_lsn + snapshot)
        if self.end is not None and end >= self.end:
            self.done = True
        if (end <= self.start or (self.end is not None and end > self.end)
                or (self.full and not starts)
                or not (snapshot or self.builder.txn_rows(index))):
            self.builder.rollback(mark)
            return
        self.builder.close_txn(index, txn, commit_lsn)
        self.last_end = end
        self.snapshot_taken |= snapshot and not starts
        if self.limit is not None and not starts and self.builder.rows >= self.limit:
            self.full = True


@dataclass
class Decoded:
    table: pa.Table | None  # None: no rows
    rows: int
    end: LSN | None  # end of the last transaction with rows
    ack: LSN  # how far the slot may be advanced once these rows are processed
    idle_end: LSN | None  # no rows, nothing in flight: the WAL flush position read up to
    snapshot: IncrementalSnapshot | None = None  # the snapshot side of the peek
    snapshot_taken: bool = False  # its chunk is in the rows
    messages: int = 0  # the messages the server decoded for the rows, up to ``end``


def connect(opts: SourceOptions) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(opts.dsn)
    except psycopg.Error as exc:
        raise explain(exc, opts.dsn, opts.slot) from None


def slot_position(opts: SourceOptions) -> LSN:
    """The slot's confirmed position (creating the slot first if asked to)."""
    with connect(opts) as conn:
        conn.autocommit = True
        if opts.create_slot:
            create_slot(conn, opts.slot, two_phase=True, if_not_exists=True)
        query = sql_query(conn)
        found = lookup_slot(query, opts.slot, conn.info.server_version)
        if found is None:
            raise SourceOptionError(
                f'replication slot "{opts.slot}" does not exist: create it (pgdecode slot '
                f'create -S {opts.slot} --two-phase) or set .option("createSlot", "true")')
        # a slot of another plugin or database, physical, in use or lost: one message each
        info = check_usable(found, opts.slot, dbname=conn.info.dbname)
        return info.confirmed_flush_lsn or LSN(0)


def flush_position(opts: SourceOptions) -> LSN:
    with connect(opts) as conn:
        return wal_flushed(conn)


def decode_slot(opts: SourceOptions, start: LSN, *, end: LSN | None = None,
                limit: int | None = None, upto: LSN | None = None,
                snapshot: Make | None = None, window: int | None = None,
                starts: Sequence[str] = ()) -> Decoded:
    """Peek at the slot and collect the committed transactions ending after ``start``: up to
    and including ``end`` if given (a batch read again), else as many whole transactions as
    make ``limit`` rows, up to the WAL flushed at ``upto`` (default: now). ``snapshot``: the
    maker of a snapshot whose chunk the stream may deliver (snapshot.py).

    The server decodes every message of a peek's window before it returns any, and the next
    peek decodes again what this one did not take: ``window`` is how many messages to ask
    for (default: ample for ``limit``). When the window ends before ``limit`` rows, the
    transactions it holds are the batch; only a window without one whole transaction is
    asked for again, four times as large. ``starts``: tables whose copy begins with the
    batch (start_tables)."""
    nchanges = None if limit is None or end is not None else \
        _messages(window or max(4 * limit, 10_000))
    while True:
        decoded, truncated = _peek(opts, start, end, limit, upto, nchanges,
                                   None if snapshot is None else snapshot(), starts)
        if decoded is not None:
            return decoded
        assert truncated and nchanges is not None
        # a transaction larger than what was asked for: ask for more (all, past int4)
        nchanges = None if nchanges >= _INT4_MAX else _messages(nchanges * 4)


_INT4_MAX = 2**31 - 1


def _messages(count: int) -> int:
    """A peek's upto_nchanges: an int4 (a larger number would be sent as an int8, which no
    function takes)."""
    return max(1, min(count, _INT4_MAX))


def _peek(opts: SourceOptions, start: LSN, end: LSN | None, limit: int | None,
          upto: LSN | None, nchanges: int | None,
          snap: IncrementalSnapshot | None,
          starts: Sequence[str]) -> tuple[Decoded | None, bool]:
    with connect(opts) as conn:
        flush = wal_flushed(conn)
        if upto is not None:
            flush = min(flush, upto)
        stop_at = end if end is not None else flush
        version = conn.info.server_version
        proto = opts.proto_version or highest_proto_version(version)
        config = SourceConfig(conninfo=opts.dsn, slot=opts.slot, publications=opts.publications,
                              proto_version=proto, streaming=opts.streaming)
        options = pgoutput_options(config, proto, two_phase=False, server_version=version)
        flat = [x for kv in options.items() for x in kv]
        builder = ChangeBuilder(PlanCache())
        collector = _Collector(builder, start, end, limit)
        pipeline = Pipeline(proto_version=proto, slot_name=opts.slot)
        pipeline.add(collector, output=MemoryOutput())
        pipeline.startup()
        start_tables(conn, opts, pipeline, starts, start)
        if snap is not None:
            snap.pipeline = pipeline
            if snap.window is not None:
                snap.window.rewind()
        returned = used = 0  # messages read; up to the last transaction taken
        try:
            with conn.cursor(name="pgdecode_peek") as cur:
                cur.itersize = 2000
                cur.execute(
                    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
                    "%s, %s::pg_lsn, %s, VARIADIC %s::text[])",
                    (opts.slot, str(stop_at), nchanges, flat))
                taken = collector.last_end
                for lsn, data in cur:
                    returned += 1
                    raw, at = bytes(data), LSN(lsn)
                    if snap is None or not snap.intercept(raw, at):
                        pipeline.feed(raw, at)
                    if collector.last_end != taken:
                        taken, used = collector.last_end, returned
                    if collector.full or collector.done:
                        break
        except psycopg.Error as exc:
            raise explain(exc, opts.dsn, opts.slot, proto) from None
        finally:
            conn.rollback()
        ack = pipeline.flush()
        rows, last_end = builder.rows, collector.last_end
        if not (collector.full or collector.done) and nchanges is not None \
                and returned >= nchanges and last_end is None:
            return None, True
        if last_end is not None:
            return Decoded(builder.to_arrow() if rows else None, rows, last_end,
                           min(ack, last_end), None, snap, collector.snapshot_taken,
                           used), False
        idle = flush if not pipeline.in_flight and pipeline.at_boundary else None
        return Decoded(None, 0, None, ack, idle, snap), False


def advance_slot(opts: SourceOptions, lsn: LSN) -> None:
    """Move the slot's confirmed position to ``lsn`` (never back)."""
    with connect(opts) as conn:
        conn.autocommit = True
        slots = list_slots(conn, opts.slot)
        if not slots:
            return
        current = slots[0].confirmed_flush_lsn
        if current is not None and lsn <= current:
            return
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (opts.slot, str(lsn)))
