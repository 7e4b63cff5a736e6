"""The ``pgoutput`` data source for Spark (PySpark's Python Data Source API).

    spark.dataSource.register(PgoutputDataSource)
    changes = (spark.readStream.format("pgoutput")
               .option("dsn", "host=db dbname=app").option("slot", "lake")
               .option("publication", "lake_pub").load())
    changes.writeStream.foreachBatch(fn).option("checkpointLocation", ...).start()

Rows have the change schema (``plugin_framework.spark.changes.schema``). Offsets are LSNs,
``{"lsn": "X/X", "ack": "X/X"}``: a batch holds the committed transactions whose commit
record ends in (start.lsn, end.lsn]; ``commit(end)`` advances the slot to ``end.ack`` (the
batch's end, or the PREPARE of an older prepared transaction still undecided, which the slot
must send again). Nothing is consumed before Spark commits a batch, so a batch planned again
after a failure is read again from the slot, the same transactions.

Everything that talks to the server runs in the reader's driver-side methods: the reader
peeks at the slot through the SQL interface (``pg_logical_slot_peek_binary_changes``,
peek.py), runs the stream through a pgdecode Pipeline (prepared transactions are held until COMMIT
PREPARED, streamed ones reassembled, rolled back ones dropped), and ships each batch's rows
to the executors inside its input partitions, as Arrow IPC.

Options: ``dsn``, ``slot``, ``publication`` (comma-separated), ``createSlot`` (false; creates
a two-phase slot, so that prepared transactions keep their gid), ``maxChangesPerBatch``
(100000; Spark's read limit, see ``latestOffset``), ``rowsPerPartition`` (50000; fewer
where the rows are wide: a partition holds about 768 KiB at most),
``idleAdvanceBytes`` (16 MB: how much WAL without changes for us lets an empty batch move
the slot on), ``protoVersion``,
``streaming`` (on), ``snapshot`` (``never``, or ``initial``: a query that starts without a
checkpoint first copies the published tables into the stream, see snapshot.py),
``snapshotTables`` (comma-separated: the tables to copy, default all published),
``snapshotChunkRows`` (10000: rows per chunk, one chunk per batch), ``metricsPort`` and
``metricsAddress`` (Prometheus metrics of the stream while it runs, metrics.py).

``spark.read.format("pgoutput")`` reads what the slot holds now without consuming it (a
peek), with the same options.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

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

from plugin_framework import LSN
from plugin_framework.spark.changes.schema import change_schema
from plugin_framework.spark.datasource.metrics import SourceMetrics
from plugin_framework.spark.datasource.options import SourceOptions
from plugin_framework.spark.datasource.peek import (
    advance_slot,
    connect,
    decode_slot,
    flush_position,
    slot_position,
)
from plugin_framework.spark.datasource.snapshot import (
    SourceSnapshot,
    has_work,
    initial_progress,
    starts_of,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["PgoutputDataSource"]


# --- partitions carry the rows -----------------------------------------------------------------


class ArrowPartition(InputPartition):
    """Rows of a batch, as an Arrow IPC stream."""

    def __init__(self, data: bytes) -> None:
        super().__init__(None)
        self.data = data

    def __repr__(self) -> str:
        return f"ArrowPartition({len(self.data)} bytes)"


# The most a partition's rows take: a task carries its partition, and Spark warns of every
# task over 1000 KiB ("Stage N contains a task of very large size"), which a snapshot chunk
# of wide rows made once per batch. Below it, with room for the task's own fields.
PARTITION_BYTES = 768 << 10


def _partitions(table: pa.Table | None, rows_per_partition: int,
                max_bytes: int = PARTITION_BYTES) -> list[ArrowPartition]:
    """A batch's rows in order, in partitions of at most ``rows_per_partition`` rows and
    about ``max_bytes`` of Arrow data (a partition holds at least one row, however wide)."""
    import pyarrow as pa

    if table is None or table.num_rows == 0:
        return []
    out = []
    offset = 0
    while offset < table.num_rows:
        rows = min(rows_per_partition, table.num_rows - offset)
        chunk = table.slice(offset, rows)
        while rows > 1 and chunk.nbytes > max_bytes:
            rows = max(1, rows * max_bytes // chunk.nbytes)
            chunk = table.slice(offset, rows)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, chunk.schema) as writer:
            writer.write_table(chunk)
        out.append(ArrowPartition(sink.getvalue().to_pybytes()))
        offset += rows
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
            with connect(self.opts) as conn:
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
