"""The ``pgoutput`` data source for Spark (PySpark's Python Data Source API).

    spark.dataSource.register(PgoutputDataSource)
    changes = (spark.readStream.format("pgoutput")
               .option("dsn", "host=db dbname=app").option("slot", "lake")
               .option("publication", "lake_pub").load())
    changes.writeStream.foreachBatch(fn).option("checkpointLocation", ...).start()

Rows have the change schema of ``plugin_framework.spark.changes.schema``. Offsets are LSNs,
``{"lsn": "X/X", "ack": "X/X"}``: a batch holds the committed transactions whose commit
record ends in (start.lsn, end.lsn]; ``commit(end)`` advances the slot to ``end.ack`` (the
batch's end, or the PREPARE of an older prepared transaction still undecided, which the slot
must send again). Nothing is consumed before Spark commits a batch, so a batch planned again
after a failure is read again from the slot, the same transactions.

Everything that talks to the server runs in the reader's driver-side methods: the reader
peeks at the slot through the SQL interface (``pg_logical_slot_peek_binary_changes``), runs
the stream through a pgdecode Pipeline (prepared transactions are held until COMMIT
PREPARED, streamed ones reassembled, rolled back ones dropped), and ships each batch's rows
to the executors inside its input partitions, as Arrow IPC.

Options: ``dsn``, ``slot``, ``publication`` (comma-separated), ``createSlot`` (false; creates
a two-phase slot, so that prepared transactions keep their gid), ``maxChangesPerBatch``
(100000; Spark's read limit, see ``latestOffset``), ``rowsPerPartition`` (50000),
``idleAdvanceBytes`` (16 MB: how much WAL without changes for us lets an empty batch move
the slot on), ``protoVersion``,
``streaming`` (on), ``snapshot`` (``never``, or ``initial``: a query that starts without a
checkpoint first copies the published tables into the stream, see source_snapshot.py),
``snapshotTables`` (comma-separated: the tables to copy, default all published),
``snapshotChunkRows`` (10000: rows per chunk, one chunk per batch), ``metricsPort`` and
``metricsAddress`` (Prometheus metrics of the stream while it runs, source_metrics.py).

``spark.read.format("pgoutput")`` reads what the slot holds now without consuming it (a
peek), with the same options.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from plugin_framework import LSN, MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.sources.errors import explain
from plugin_framework.sources.incremental import IncrementalSnapshot
from plugin_framework.sources.session import (
    SourceConfig,
    highest_proto_version,
    pgoutput_options,
)
from plugin_framework.sources.slots import create_slot, list_slots
from plugin_framework.spark.changes.builder import ChangeBuilder
from plugin_framework.spark.changes.plans import PlanCache
from plugin_framework.spark.changes.schema import change_schema
from plugin_framework.spark.source_metrics import SourceMetrics
from plugin_framework.spark.source_options import SourceOptionError, SourceOptions
from plugin_framework.spark.source_snapshot import (
    Make,
    SourceSnapshot,
    has_work,
    initial_progress,
    start_tables,
    starts_of,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["PgoutputDataSource", "SourceOptionError", "SourceOptions", "decode_slot"]


# --- decoding a range of the slot ------------------------------------------------------------


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


def _connect(opts: SourceOptions) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(opts.dsn)
    except psycopg.Error as exc:
        raise explain(exc, opts.dsn, opts.slot) from None


def slot_position(opts: SourceOptions) -> LSN:
    """The slot's confirmed position (creating the slot first if asked to)."""
    with _connect(opts) as conn:
        conn.autocommit = True
        if opts.create_slot:
            create_slot(conn, opts.slot, two_phase=True, if_not_exists=True)
        slots = list_slots(conn, opts.slot)
        if not slots:
            raise SourceOptionError(
                f'replication slot "{opts.slot}" does not exist: create it (pgdecode slot '
                f'create -S {opts.slot} --two-phase) or set .option("createSlot", "true")')
        return slots[0].confirmed_flush_lsn or LSN(0)


def flush_position(opts: SourceOptions) -> LSN:
    with _connect(opts) as conn:
        row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        return LSN(row[0])


def decode_slot(opts: SourceOptions, start: LSN, *, end: LSN | None = None,
                limit: int | None = None, upto: LSN | None = None,
                snapshot: Make | None = None, window: int | None = None,
                starts: Sequence[str] = ()) -> Decoded:
    """Peek at the slot and collect the committed transactions ending after ``start``: up to
    and including ``end`` if given (a batch read again), else as many whole transactions as
    make ``limit`` rows, up to the WAL flushed at ``upto`` (default: now). ``snapshot``: the
    maker of a snapshot whose chunk the stream may deliver (source_snapshot.py).

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
    with _connect(opts) as conn:
        flush_row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert flush_row is not None
        flush = LSN(flush_row[0])
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
    with _connect(opts) as conn:
        conn.autocommit = True
        slots = list_slots(conn, opts.slot)
        if not slots:
            return
        current = slots[0].confirmed_flush_lsn
        if current is not None and lsn <= current:
            return
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (opts.slot, str(lsn)))


# --- partitions carry the rows -----------------------------------------------------------------


class ArrowPartition(InputPartition):
    """Rows of a batch, as an Arrow IPC stream."""

    def __init__(self, data: bytes) -> None:
        super().__init__(None)
        self.data = data

    def __repr__(self) -> str:
        return f"ArrowPartition({len(self.data)} bytes)"


def _partitions(table: pa.Table | None, rows_per_partition: int) -> list[ArrowPartition]:
    import pyarrow as pa

    if table is None or table.num_rows == 0:
        return []
    out = []
    for offset in range(0, table.num_rows, rows_per_partition):
        chunk = table.slice(offset, rows_per_partition)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, chunk.schema) as writer:
            writer.write_table(chunk)
        out.append(ArrowPartition(sink.getvalue().to_pybytes()))
    return out


def _read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    assert isinstance(partition, ArrowPartition)
    reader = pa.ipc.open_stream(partition.data)
    yield from reader


# --- Spark's side ----------------------------------------------------------------------------


def _offset(lsn: LSN, ack: LSN) -> dict[str, str]:
    return {"lsn": str(lsn), "ack": str(ack)}


class PgoutputStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.opts = options
        self._cache: dict[tuple[str, str], pa.Table | None] = {}
        self._target: LSN | None = None
        self._snapshot = SourceSnapshot(options)
        self._metrics: SourceMetrics | None = None
        # messages per row, as the last batch's peek had them (at first: a row a message)
        self._per_row = 1.0
        self._advanced: LSN | None = None  # where latestOffset last moved the slot to

    def __getstate__(self) -> dict[str, Any]:
        # Spark ships the reader to its executors for read(): the metrics stay here
        return {**self.__dict__, "_metrics": None}

    def _metered(self) -> SourceMetrics | None:
        """The metrics, served from the first batch planned on: Spark makes readers that
        never stream (to analyze the query), and those must not hold the port."""
        if self._metrics is None and self.opts.metrics_port is not None:
            self._metrics = SourceMetrics.serve(self.opts)
        return self._metrics

    def initialOffset(self) -> dict[str, Any]:
        position = slot_position(self.opts)
        offset: dict[str, Any] = _offset(position, position)
        if self.opts.snapshot == "initial":  # a query without a checkpoint: copy the tables
            with _connect(self.opts) as conn:
                offset["snapshot"] = initial_progress(conn, self.opts)
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_changes is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_changes)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = flush_position(self.opts)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark runs one batch at a time: it asks for the next batch's end only once the
        # batch ending at ``start`` is done and in its commit log. It calls commit() for
        # that batch later, after planning the next one; moving the slot now spares the
        # server decoding that batch again in this peek.
        if LSN(start.get("ack", start["lsn"])) != self._advanced:  # (not at each idle poll)
            self._acknowledge(start)
        begin = LSN(start["lsn"])
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        progress = start.get("snapshot")
        make = self._snapshot.plan(progress)
        starts = starts_of(progress)
        upto, high = self._target, self._snapshot.high
        if upto is not None and high is not None:
            upto = max(upto, high)  # availableNow: the snapshot is available now too
        # a window of the messages of max_rows rows (as many per row as in the last batch):
        # the server stops at the commit that reaches it, so the batch takes what it
        # decoded, and the next peek decodes nothing of it again
        window = None if max_rows is None else math.ceil(max_rows * self._per_row)
        decoded = decode_slot(self.opts, begin, limit=max_rows, upto=upto, snapshot=make,
                              window=window, starts=starts)
        if decoded.rows and not decoded.snapshot_taken:  # a chunk's rows are no messages
            self._per_row = decoded.messages / decoded.rows
        entries = self._snapshot.settle(decoded.snapshot, decoded.snapshot_taken)
        # a chunk still waiting: the slot stays before its low watermark (read again)
        waiting = self._snapshot.low
        if decoded.end is None:
            idle = decoded.idle_end
            if idle is not None and waiting is None \
                    and idle - begin >= self.opts.idle_advance_bytes:
                # an empty batch, so that commit() moves the slot
                self._cache[(start["lsn"], str(idle))] = None
                return self._with_snapshot(_offset(idle, idle), progress, None)
            return start
        end = _offset(decoded.end, decoded.ack if waiting is None else min(decoded.ack, waiting))
        self._cache = {(start["lsn"], end["lsn"]): decoded.table}
        return self._with_snapshot(end, progress, entries)

    @staticmethod
    def _with_snapshot(end: dict[str, Any], progress: dict[str, Any] | None,
                       entries: dict[str, Any] | None) -> dict[str, Any]:
        """The end offset of a batch, with the snapshot's record: as the start's, or as the
        batch's chunk leaves it (``entries``); none once the snapshot is over."""
        if entries is not None:
            end.update(entries)
        elif progress is not None:  # (the tables it starts are started by this batch)
            end["snapshot"] = {k: v for k, v in progress.items() if k != "starts"}
        if not has_work(end.get("snapshot")):
            end.pop("snapshot", None)
        return end

    def partitions(self, start: dict[str, Any],
                   end: dict[str, Any]) -> Sequence[InputPartition]:
        key = (start["lsn"], end["lsn"])
        if key[0] == key[1]:
            return []
        if key in self._cache:
            table = self._cache.pop(key)
        else:  # planned again after a restart: read the same range again
            chunk = end.get("chunk")
            make = None if chunk is None else self._snapshot.replay(chunk)
            starts = starts_of(start.get("snapshot"))
            table = decode_slot(self.opts, LSN(start["lsn"]), end=LSN(end["lsn"]),
                                snapshot=make, starts=starts).table
        metrics = self._metered()
        if metrics is not None:
            metrics.batch(end["lsn"], table)
        return _partitions(table, self.opts.rows_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._acknowledge(end)

    def _acknowledge(self, end: dict[str, Any]) -> None:
        """The batch ending at ``end`` is done: the slot moves to its ``ack``."""
        done = LSN(end.get("ack", end["lsn"]))
        advance_slot(self.opts, done)
        self._advanced = done
        metrics = self._metered()
        if metrics is not None:
            metrics.committed(end)

    def stop(self) -> None:
        self._cache.clear()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


class PgoutputBatchReader(DataSourceReader):
    """What the slot holds now, without consuming it."""

    def __init__(self, options: SourceOptions) -> None:
        self.opts = options

    def partitions(self) -> Sequence[InputPartition]:
        start = slot_position(self.opts)
        decoded = decode_slot(self.opts, start)
        return _partitions(decoded.table, self.opts.rows_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)


class PgoutputDataSource(DataSource):
    """``format("pgoutput")``: a replication slot's changes (see the module's docs)."""

    @classmethod
    def name(cls) -> str:
        return "pgoutput"

    def schema(self) -> StructType:
        return change_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return PgoutputBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PgoutputStreamReader(SourceOptions.parse(self.options))
