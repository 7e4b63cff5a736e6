"""What the snapshots read of the catalog: the published tables (their row filters,
column lists and partitions as the publications publish them), the key each is read in order
of, row estimates and split points, and the statements that read a table's rows by key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from plugin_framework.protocol import (
    Decoder,
    Insert,
    RelationColumn,
    RelationMessage,
    Type,
)
from plugin_framework.sources.errors import SourceError

Key = tuple[bytes | None, ...]  # a row's key columns, as pgoutput's text sends them


Range = tuple[Key | None, Key | None]  # the rows after a key up to a key (None: no bound)


_FIRST_NORMAL_OID = 16384  # types below are built in: pgoutput sends no Type message




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


def last_key(conn: psycopg.Connection[Any], table: TableCopy) -> Key | None:
    """The table's greatest key now (None: it has no rows). An incremental snapshot reads
    up to it: rows inserted later above it come from the stream, and a table that grows
    at its end as fast as the chunks are read is still read to an end."""
    keys = [sql.Identifier("t", k) for k in table.key]
    query = sql.SQL("SELECT {} FROM {} AS t ORDER BY {} LIMIT 1").format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(k) for k in keys), _relation(table),
        sql.SQL(", ").join(sql.SQL("{} DESC").format(k) for k in keys))
    row = conn.execute(query).fetchone()
    return None if row is None else tuple(None if v is None else v.encode() for v in row)


SAMPLE_BLOCKS = 100  # blocks of such a table sampled for the keys it is split at


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


def snapshot_table(conn: psycopg.Connection[Any], name: str,
                   publications: Sequence[str]) -> TableCopy:
    """The table as an incremental snapshot reads it, from the publications (their row
    filters and column lists); SourceError saying why it cannot be taken."""
    qualified = qualified_name(name)
    schema, _, rel = qualified.rpartition(".")
    found = published_tables(conn, publications, only=(schema, rel))
    copy = found[0] if found else None
    if copy is None:
        raise SourceError(
            f"incremental snapshot of {qualified}: the table is not in the publications "
            f"{', '.join(publications)}: add it (ALTER PUBLICATION ... ADD TABLE) first, so "
            "that the stream carries its changes")
    if not copy.key:  # (snapshot.describe: NOT NULL key columns only)
        raise SourceError(
            f"incremental snapshot of {qualified}: the table has {NO_KEY}, so it cannot be "
            "read in key order: add a primary key")
    missing = [k for k in copy.key if k not in copy.columns]
    if missing:
        raise SourceError(
            f"incremental snapshot of {qualified}: the publication's column list leaves out "
            f"key column {missing[0]}")
    return copy


def qualified_name(name: str) -> str:
    """schema.table, "public." when the schema is left out."""
    schema, _, rel = name.rpartition(".")
    return f"{schema or 'public'}.{rel}"


def key_from_text(values: Sequence[Any]) -> Key:
    """A key as a record or a request has it (key_text) in the form the stream sends it."""
    return tuple(None if v is None else str(v).encode() for v in values)

