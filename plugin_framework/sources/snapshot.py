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
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from plugin_framework._native import load_native
from plugin_framework.protocol import (
    Decoder,
    Insert,
    RelationColumn,
    RelationMessage,
    TupleData,
    Type,
    encode,
)
from plugin_framework.sources.errors import SourceError
from plugin_framework.sources.libpq import copy_out, copy_reader_bound

if TYPE_CHECKING:
    from plugin_framework.sources.native import _copyrow
else:
    _copyrow = load_native("plugin_framework.sources.native._copyrow")

log = logging.getLogger("pgdecode.snapshot")

CHUNK_ROWS = 5000  # rows per synthetic transaction
# A table this large (its heap, with its partitions') is split into one key range per worker
SPLIT_BYTES = 8 << 20
SAMPLE_BLOCKS = 100  # blocks of such a table sampled for the keys it is split at
Key = tuple[bytes | None, ...]  # a row's key columns, as pgoutput's text sends them
Range = tuple[Key | None, Key | None]  # the rows after a key up to a key (None: no bound)
_FIRST_NORMAL_OID = 16384  # types below are built in: pgoutput sends no Type message
_NULL, _TEXT = ord("n"), ord("t")


@dataclass
class TableCopy:
    """One published table to copy, and how pgoutput describes it."""

    relid: int
    schema: str
    name: str
    partitioned: bool  # copied with its partitions (published via the root)
    columns: list[str]  # the published columns, in attnum order
    row_filter: str | None  # the publications' filters, ORed; None: every row
    relation: RelationMessage | None = None
    types: list[Type] = field(default_factory=list)
    rows_estimate: int = 0  # pg_class.reltuples (of its partitions, for a root)
    size: int = 0  # bytes of its heap (of its partitions, for a root)
    # the key it is read in order of (_KEY_SQL), if all NOT NULL (none: read unordered, and
    # an interrupted copy cannot resume; nor if the column list leaves a key column out: see
    # ``ordered``)
    key: list[str] = field(default_factory=list)
    key_types: list[str] = field(default_factory=list)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def ordered(self) -> bool:
        """Whether it is copied in key order (so that a copy can go on after a key)."""
        return bool(self.key) and all(k in self.columns for k in self.key)


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
    table: TableCopy
    inserts: list[bytes]  # each row as the pgoutput Insert message the stream would send
    last: bool  # the last chunk of its range (of the table, for copy_chunks)
    part: int = 0  # the range's index (Part.index)


_TABLES_SQL = """
SELECT c.oid, pt.schemaname, pt.tablename, c.relkind = 'p', pt.pubname, {columns}
FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = ANY(%(pubs)s)
  AND (%(schema)s::name IS NULL OR (pt.schemaname, pt.tablename) = (%(schema)s, %(name)s))
ORDER BY pt.schemaname, pt.tablename, pt.pubname
"""

# The columns pgoutput describes (logicalrep_write_attrs): not dropped, not generated, the
# replica identity's flagged (every column for REPLICA IDENTITY FULL).
_COLUMNS_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod,
       c.relreplident = 'f' OR COALESCE(a.attnum = ANY(i.indkey), false)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_index i ON i.indrelid = c.oid
     AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

_ESTIMATE_SQL = """
SELECT COALESCE(sum(c.reltuples) FILTER (WHERE c.reltuples > 0), 0)::bigint,
       COALESCE(sum(pg_relation_size(c.oid)), 0)::bigint
FROM pg_class c
WHERE (c.oid = %(relid)s OR c.oid IN (SELECT relid FROM pg_partition_tree(%(relid)s::regclass)))
  AND c.relkind <> 'p'  -- (ANALYZE gives a partitioned table its partitions' count too)
"""

NO_KEY = "no primary key, replica identity index or unique index on NOT NULL columns"

# The key a table is read in order of: its replica identity index (always in the stream's
# old tuples), else its primary key, else its smallest unique index on NOT NULL columns (not
# partial, no expressions); its key columns only (not INCLUDE's)
_KEY_SQL = """
WITH ix AS (
    SELECT (i.indkey::int2[])[0:i.indnkeyatts - 1] AS cols FROM pg_index i
    WHERE i.indrelid = %(relid)s AND i.indisunique AND i.indisvalid
      AND i.indpred IS NULL AND i.indexprs IS NULL
    ORDER BY i.indisreplident DESC, i.indisprimary DESC,
             (SELECT bool_and(a.attnotnull) FROM pg_attribute a
              WHERE a.attrelid = i.indrelid
                AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1])) DESC,
             i.indnkeyatts, i.indexrelid
    LIMIT 1)
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM ix CROSS JOIN LATERAL unnest(ix.cols) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = %(relid)s AND a.attnum = k.attnum
ORDER BY k.n
"""



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


_TYPES_SQL = """
SELECT t.oid, CASE WHEN n.nspname = 'pg_catalog' THEN '' ELSE n.nspname END, t.typname
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = ANY(%s)
"""


def published_tables(conn: psycopg.Connection[Any], publications: Sequence[str],
                     only: tuple[str, str] | None = None) -> list[TableCopy]:
    """The tables the publications publish (``only``: that one, schema and name, if they
    do), with their combined row filter and column list (PostgreSQL 15 and later have both;
    before, every row and column)."""
    modern = conn.info.server_version >= 150000
    columns = "pt.attnames, pt.rowfilter" if modern else "NULL::name[], NULL::text"
    only_schema, only_name = only or (None, None)
    rows = conn.execute(_TABLES_SQL.format(columns=columns), {
        "pubs": list(publications), "schema": only_schema, "name": only_name}).fetchall()
    tables: dict[int, TableCopy] = {}
    filters: dict[int, list[str | None]] = {}
    for relid, schema, name, partitioned, pubname, attnames, rowfilter in rows:
        table = tables.get(relid)
        if table is None:
            table = tables[relid] = TableCopy(relid, schema, name, partitioned,
                                              list(attnames or []), None)
        elif attnames is not None and list(attnames) != table.columns:
            raise SourceError(
                f"table {schema}.{name} is published with different column lists by "
                f'publication "{pubname}" and another of --publication: PostgreSQL refuses '
                "to copy it so too; give the publications the same column list")
        filters.setdefault(relid, []).append(rowfilter)
    for relid, table in tables.items():
        clauses = filters[relid]
        if all(c is not None for c in clauses):
            table.row_filter = " OR ".join(f"({c})" for c in dict.fromkeys(clauses))
        describe(conn, table)
    return list(tables.values())


def describe(conn: psycopg.Connection[Any], table: TableCopy) -> None:
    """The Relation (and Type) messages pgoutput would send for the table's copied columns."""
    rows = conn.execute(_COLUMNS_SQL, (table.relid,)).fetchall()
    wanted = set(table.columns) if table.columns else None
    cols = [RelationColumn(bool(key), name, typid, typmod)
            for name, typid, typmod, key in rows if wanted is None or name in wanted]
    table.columns = [c.name for c in cols]
    identity = conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s",
                            (table.relid,)).fetchone()
    assert identity is not None
    schema = "" if table.schema == "pg_catalog" else table.schema
    table.relation = RelationMessage(table.relid, schema, table.name, identity[0], tuple(cols))
    keys = conn.execute(_KEY_SQL, {"relid": table.relid}).fetchall()
    if keys and all(notnull for _, _, notnull in keys):
        table.key = [name for name, _, _ in keys]
        table.key_types = [type_ for _, type_, _ in keys]
    estimate = conn.execute(_ESTIMATE_SQL, {"relid": table.relid}).fetchone()
    if estimate:
        table.rows_estimate, table.size = int(estimate[0]), int(estimate[1])
    user_types = sorted({c.type_oid for c in cols if c.type_oid >= _FIRST_NORMAL_OID})
    if user_types:
        table.types = [Type(oid, ns, name) for oid, ns, name
                       in conn.execute(_TYPES_SQL, (user_types,)).fetchall()]


def copy_statement(table: TableCopy, after: Key | None = None, limit: int | None = None,
                   upto: Key | None = None, keys: Sequence[Key] = ()) -> sql.Composed:
    """COPY of the table's published columns and rows, in key order where it has one; with
    ``after`` and ``limit``, the next chunk of them (incremental.py); with ``upto``, those
    up to that key; with ``keys``, those under these keys."""
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in table.columns), _relation(table))
    columns = sql.SQL(", ").join(sql.Identifier(k) for k in table.key)
    where: list[sql.Composable] = []
    if table.row_filter is not None:
        where.append(sql.SQL("({})").format(sql.SQL(table.row_filter)))
    for bound, op in ((after, ">"), (upto, "<=")):
        if bound is not None:
            where.append(sql.SQL("({}) {} ({})").format(columns, sql.SQL(op),
                                                        _literal(table, bound)))
    if keys:
        where.append(sql.SQL("({}) IN ({})").format(columns, sql.SQL(", ").join(
            sql.SQL("({})").format(_literal(table, key)) for key in keys)))
    if where:
        query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(where))
    if table.ordered:
        query = sql.SQL("{} ORDER BY {}").format(query, columns)
    if limit is not None:
        query = sql.SQL("{} LIMIT {}").format(query, sql.Literal(limit))
    return sql.SQL("COPY ({}) TO STDOUT").format(query)


def _literal(table: TableCopy, key: Key) -> sql.Composed:
    """A key's values as literals cast to the key's types (COPY takes no parameters)."""
    return sql.SQL(", ").join(
        sql.SQL("{}::{}").format(sql.Literal(None if v is None else v.decode()), sql.SQL(t))
        for v, t in zip(key, table.key_types, strict=True))


def _relation(table: TableCopy) -> sql.Composed:
    """The table as a query reads its published rows: with its partitions when it is copied
    through its root, else ONLY it."""
    only = sql.SQL("") if table.partitioned else sql.SQL("ONLY ")
    return sql.SQL("{}{}").format(only, sql.Identifier(table.schema, table.name))


def split_points(conn: psycopg.Connection[Any], table: TableCopy, parts: int) -> list[Key]:
    """Keys that cut the table into ``parts`` ranges of about as many rows: quantiles of the
    keys in a sample of its blocks (TABLESAMPLE SYSTEM). Any keys would cut it into ranges
    that hold each row once; these make them even. Fewer if the sample has too few keys."""
    # ordered by the columns (t.k), not by their text (the output columns are named k too)
    keys = [sql.Identifier("t", k) for k in table.key]
    blocks = max(1, table.size // 8192)
    query = sql.SQL("SELECT {} FROM {} AS t TABLESAMPLE SYSTEM (%s) ORDER BY {}").format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(k) for k in keys),
        _relation(table), sql.SQL(", ").join(keys))
    sample = conn.execute(query, (min(100.0, 100.0 * SAMPLE_BLOCKS / blocks),)).fetchall()
    points: list[Key] = []
    for n in range(1, parts):
        row = sample[len(sample) * n // parts] if sample else None
        key = None if row is None else tuple(v.encode() for v in row)
        if key is not None and key not in points:
            points.append(key)
    return points


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
    (the same bytes, tests/test_snapshot.py). ``statement``: a copy_statement of part of
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


class CopyLedger:
    """How far an initial copy was delivered, as its progress record says: the tables done,
    and of each table begun, the last key delivered of each of its ranges (the record
    ``IncrementalSnapshot.resume`` goes on from, each range after its key)."""

    def __init__(self, slot: str, parts: Sequence[Part], decoder: Decoder) -> None:
        self.slot, self.decoder = slot, decoder
        self.tables = list(dict.fromkeys(p.table.qualified for p in parts))
        # of each table, its ranges not done: index -> (last key delivered, upto)
        self.left: dict[str, dict[int, Range]] = {name: {} for name in self.tables}
        for p in parts:
            self.left[p.table.qualified][p.index] = (p.after, p.upto)
        self.split = {p.table.qualified for p in parts if p.index > 0}
        self.done: list[str] = []
        self.started: set[str] = set()

    def saved(self) -> tuple[Any, ...]:
        """Its state now, for ``restore``."""
        return ({name: dict(left) for name, left in self.left.items()}, list(self.done),
                set(self.started))

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Back to a ``saved`` state: a chunk taken as delivered was not (its transaction
        was cut short)."""
        self.left, self.done, self.started = saved

    def delivered(self, chunk: Chunk) -> tuple[bool, bool]:
        """Take a chunk as delivered: (whether it is its table's first, whether its table is
        now done)."""
        name = chunk.table.qualified
        first = name not in self.started
        self.started.add(name)
        ranges = self.left[name]
        if chunk.last:
            del ranges[chunk.part]
        elif chunk.inserts and chunk.table.ordered:  # (else it has no key to go on after)
            ranges[chunk.part] = (row_key(self.decoder, chunk.table, chunk.inserts[-1]),
                                  ranges[chunk.part][1])
        if not ranges:
            self.done.append(name)
        return first, not ranges

    def record(self) -> dict[str, Any]:
        """The progress record: a table not split under "after" (its last key), a split one
        under "ranges" (its ranges not done, each [last key or the range's lower bound,
        upto], None for none); a table not begun under neither."""
        after: dict[str, list[str | None]] = {}
        ranges: dict[str, list[list[list[str | None] | None]]] = {}
        for name in self.tables:
            if name not in self.started or name in self.done:
                continue
            left = [self.left[name][n] for n in sorted(self.left[name])]
            if name in self.split:
                ranges[name] = ranges_text(left)
            elif left[0][0] is not None:
                after[name] = key_text(left[0][0])
        state: dict[str, Any] = {
            "slot": self.slot, "initial": True, "done": list(self.done),
            "queue": [name for name in self.tables if name not in self.done],
            "after": after}
        if ranges:
            state["ranges"] = ranges
        return state


def check_snapshot_outputs(pipeline: Any) -> None:
    """Refuse, before the slot is made, outputs that cannot record an unfinished copy
    (``begin_snapshot``): a run after an interrupted copy could not tell that it must copy
    again, and their rows would be missing without a word."""
    for m in pipeline.members:
        if not callable(getattr(m.ctx.output, "begin_snapshot", None)):
            raise SourceError(
                f'--snapshot: output plugin "{m.plugin.name}" cannot take the initial '
                "snapshot yet (its output cannot record a copy that did not finish). "
                "Nothing was created or streamed. Write the copy with another emitter to "
                "a file or stdout, or stream without --snapshot")


def any_output_in(pipeline: Any, state: str) -> bool:
    """Whether an output of ``pipeline`` records its initial copy as ``state`` ("copying":
    it did not finish; "done")."""
    return any(getattr(m.ctx.output, "snapshot_state", None) == state
               for m in pipeline.members)


def recorded_progress(pipeline: Any) -> dict[str, Any] | None:
    """How far an output's snapshot was (FILE.progress, a Spark checkpoint), if one records
    it."""
    for m in pipeline.members:
        state = getattr(m.ctx.output, "resume_incremental", None)
        if state:
            return dict(state)
    return None


def row_key(decoder: Decoder, table: TableCopy, insert: bytes) -> Key:
    """The key of the row an Insert message of the table carries."""
    message = decoder.decode(insert)
    assert isinstance(message, Insert)
    values = message.new.values
    return tuple(values[table.columns.index(k)] for k in table.key)


def key_text(key: Key) -> list[str | None]:
    """A key as the progress file records it."""
    return [None if v is None else v.decode() for v in key]


def ranges_text(ranges: Sequence[Range]) -> list[list[list[str | None] | None]]:
    """Key ranges as the progress file records them (None: no bound)."""
    return [[None if k is None else key_text(k) for k in r] for r in ranges]
