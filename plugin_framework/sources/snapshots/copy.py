"""The initial snapshot: the rows that existed before the slot, copied consistently with it.

CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export') returns the slot's consistent point and a
snapshot that sees exactly the transactions committed before it. Connections that import
that snapshot (``SET TRANSACTION SNAPSHOT``) and COPY the published tables read every row
the stream will not send, and none that it will: applying the copy, then the stream from the
consistent point, gives the table. This is PostgreSQL's own table synchronization
(tablesync.c) without the per-table slots, and its publication rules: each table's row
filter (ORed across publications, none if one publication has none) and column list, and
partitions copied through the root when the publication publishes via the root.

The replication connection must run no command between creating the slot and the last
import (the export ends with its next command): ``SnapshotCopy`` imports in its
constructor. The rows are copied by ``workers`` threads, one key range (``Part``) at a
time each, and handed to the caller in chunks, in the calling thread (the pipeline is not
thread-safe). A table is one range, unless it is large: then one per worker, so that the
workers share it (its rows are one ordered COPY per range). ``CopyLedger`` keeps the record
of how far each range was delivered, from which an interrupted copy goes on
(incremental.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from plugin_framework._native import load_native
from plugin_framework.protocol import (
    Insert,
    TupleData,
    encode,
)
from plugin_framework.sources.libpq import copy_out, copy_reader_bound
from plugin_framework.sources.snapshots.catalog import (
    Key,
    TableCopy,
    copy_statement,
    published_tables,
    split_points,
)

if TYPE_CHECKING:
    from plugin_framework.sources.native import _copyrow
else:
    _copyrow = load_native("plugin_framework.sources.native._copyrow")

log = logging.getLogger("pgdecode.snapshot")


CHUNK_ROWS = 5000  # rows per synthetic transaction
_NULL, _TEXT = ord("n"), ord("t")  # TupleData column kinds


# A table this large (its heap, with its partitions') is split into one key range per worker
SPLIT_BYTES = 8 << 20


@dataclass
class Part:
    """A key range of a table: its rows after ``after`` up to ``upto`` (None: from the first,
    to the last), copied in key order by one worker."""

    table: TableCopy
    index: int  # of the table's ranges, in key order
    after: Key | None = None
    upto: Key | None = None


@dataclass
class Chunk:
    """A run of one table's copied rows, handed to the pipeline at once."""

    table: TableCopy
    inserts: list[bytes]  # each row as the pgoutput Insert message the stream would send
    last: bool  # the last chunk of its range (of the table, for copy_chunks)
    part: int = 0  # the range's index (Part.index)


def no_timeouts(server_version: int) -> str:
    """SETs that turn the server's timeouts off for a connection of the copy, as pg_dump
    does: a copy may take hours, its transaction is idle while the plugins start and once
    its worker is done, and the replication connection waits idle throughout."""
    names = ["statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"]
    if server_version >= 140000:
        names.append("idle_session_timeout")
    if server_version >= 170000:
        names.append("transaction_timeout")
    return "; ".join(f"SET {name} = 0" for name in names)


class SnapshotCopy:
    """Connections that see the exported snapshot, and the copy of the tables through them."""

    def __init__(self, conninfo: str, snapshot_name: str, workers: int) -> None:
        self.connections: list[psycopg.Connection[Any]] = []
        try:
            for _ in range(max(1, workers)):
                conn = psycopg.connect(conninfo, autocommit=True, client_encoding="UTF8")
                self.connections.append(conn)
                conn.execute(no_timeouts(conn.info.server_version))
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                    sql.Literal(snapshot_name)))
        except BaseException:
            self.close()
            raise
        self.read_time = self.connections[0].execute("SELECT now()").fetchone()[0]  # type: ignore[index]

    def close(self) -> None:
        for conn in self.connections:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        self.connections = []

    def tables(self, publications: Sequence[str]) -> list[TableCopy]:
        """The published tables, as the snapshot sees them."""
        return published_tables(self.connections[0], publications)

    def parts(self, tables: Sequence[TableCopy]) -> list[Part]:
        """The key ranges to copy the tables in, the largest tables' first (so that the
        workers end together): one per table, or, for a table of SPLIT_BYTES or more copied
        in key order, up to one per worker (split_points)."""
        workers = len(self.connections)
        parts: list[Part] = []
        for table in sorted(tables, key=lambda t: -t.size):
            points: list[Key] = []
            if workers > 1 and table.ordered and table.size >= SPLIT_BYTES:
                points = split_points(self.connections[0], table, workers)
            bounds = [None, *points, None]
            parts += [Part(table, n, after, upto)
                      for n, (after, upto) in enumerate(itertools.pairwise(bounds))]
        return parts

    def chunks(self, parts: Sequence[Part], stop: Callable[[], bool],
               chunk_rows: int = CHUNK_ROWS) -> Iterator[Chunk]:
        """Every range's rows, in chunks; each range's in key order, ranges in parallel
        across the connections."""
        todo: queue.SimpleQueue[Part | None] = queue.SimpleQueue()
        for part in parts:
            todo.put(part)
        done: queue.Queue[Chunk | BaseException | None] = queue.Queue(
            maxsize=2 * len(self.connections))
        cancelled = threading.Event()

        def work(conn: psycopg.Connection[Any]) -> None:
            try:
                while not cancelled.is_set():
                    try:
                        part = todo.get_nowait()
                    except queue.Empty:
                        break
                    if part is None:
                        break
                    statement = copy_statement(part.table, after=part.after, upto=part.upto)
                    for chunk in copy_chunks(conn, part.table, chunk_rows, statement=statement):
                        chunk.part = part.index
                        while not cancelled.is_set():
                            try:
                                done.put(chunk, timeout=0.5)
                                break
                            except queue.Full:
                                continue
                        if cancelled.is_set():
                            return
            except BaseException as exc:  # handed to the consuming thread
                done.put(exc)
            finally:
                done.put(None)

        threads = [threading.Thread(target=work, args=(conn,), daemon=True,
                                    name=f"pgdecode-snapshot-{n}")
                   for n, conn in enumerate(self.connections)]
        for t in threads:
            t.start()
        running = len(threads)
        try:
            while running:
                if stop():
                    raise InterruptedError("stop requested")
                try:
                    item = done.get(timeout=0.5)
                except queue.Empty:
                    continue
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            cancelled.set()
            for t in threads:
                while t.is_alive():
                    try:  # let a blocked worker finish its put and see the cancel
                        done.get_nowait()
                    except queue.Empty:
                        t.join(0.1)


def copy_chunks(conn: psycopg.Connection[Any], table: TableCopy, chunk_rows: int,
                fast: bool = True, statement: sql.Composed | None = None) -> Iterator[Chunk]:
    """A table's rows, as COPY reads them in ``conn``'s transaction, in chunks. ``fast``:
    through the C module where it is built, and libpq (``copy_out``); else psycopg's Copy
    (the same bytes, tests/sources/test_snapshot.py). ``statement``: a copy_statement of part of
    them (incremental.py's chunk)."""
    relid, ncols = table.relid, len(table.columns)
    statement = statement or copy_statement(table)
    if fast and _copyrow is not None:
        head = b"I" + relid.to_bytes(4, "big") + b"N" + ncols.to_bytes(2, "big")
        read = partial(_copyrow.read_messages, head, ncols) if copy_reader_bound() else None
        for rows in copy_out(conn, statement, partial(_copyrow.insert_message, head, ncols),
                             chunk_rows, read):
            yield Chunk(table, rows, len(rows) < chunk_rows)  # only the last is short
        return
    inserts: list[bytes] = []
    with conn.cursor().copy(statement) as copy:
        for row in copy.rows():
            inserts.append(encode(Insert(relid, TupleData(
                bytes(_NULL if v is None else _TEXT for v in row),
                tuple(None if v is None else v.encode() for v in row)))))
            if len(inserts) >= chunk_rows:
                yield Chunk(table, inserts, False)
                inserts = []
    yield Chunk(table, inserts, True)
