"""A workload that makes the server send every pgoutput message kind, and the facts the server
itself reports about it (xids, OIDs, LSNs), to check decoded messages against.

Used by the codec, framework and emitter tests; keep it deterministic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from plugin_framework.protocol import LSN

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), tags text[],
                    payload bytea, big text);
ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE parent (id serial PRIMARY KEY, note text);
CREATE TABLE child (id serial PRIMARY KEY, parent_id int REFERENCES parent);
CREATE TABLE fulltab (a int, b text);
ALTER TABLE fulltab REPLICA IDENTITY FULL;
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE moods (id int PRIMARY KEY, m mood);
CREATE TABLE bulk (id int PRIMARY KEY, v text);
CREATE PUBLICATION pub FOR ALL TABLES;
"""

STREAM_ROWS = 3000  # enough to exceed logical_decoding_work_mem = 64kB
END_PREFIX = "pgdecode-test-end"


@dataclass
class Facts:
    """What the server said while running the workload."""

    xids: dict[str, int] = field(default_factory=dict)  # label -> 32-bit xid
    subxids: dict[str, int] = field(default_factory=dict)
    oids: dict[str, int] = field(default_factory=dict)  # table or type name -> oid
    message_lsns: dict[str, LSN] = field(default_factory=dict)
    origin: str = ""
    origin_lsn: LSN = field(default_factory=LSN)
    end_lsn: LSN = field(default_factory=LSN)
    counts: dict[str, int] = field(default_factory=dict)  # table -> rows after the workload


def origin_name(conn: psycopg.Connection[Any]) -> str:
    """Replication origins are cluster-wide: one per test database, named after it."""
    return f"{conn.info.dbname}_origin"


def create_schema(conn: psycopg.Connection[Any]) -> None:
    conn.execute(SCHEMA)
    conn.execute("SELECT pg_replication_origin_create(%s)", (origin_name(conn),))


def _xid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT txid_current() & 4294967295").fetchone()
    assert row is not None
    return int(row[0])


def _subxid(conn: psycopg.Connection[Any], top: int) -> int:
    """The xid of the current subtransaction: the transactionid lock it holds besides top's."""
    rows = conn.execute(
        "SELECT transactionid::text::bigint FROM pg_locks WHERE locktype = 'transactionid' "
        "AND pid = pg_backend_pid() AND granted"
    ).fetchall()
    subs = [int(r[0]) for r in rows if int(r[0]) != top]
    assert len(subs) == 1, rows
    return subs[0]


def run_workload(conn: psycopg.Connection[Any], *, prepared: bool = True,
                 abort_pause: float = 0.0) -> Facts:
    """Run every kind of transaction on ``conn`` (autocommit). Schema must exist.

    ``abort_pause`` keeps the large aborted transaction open that long before its ROLLBACK,
    so that a walsender decoding concurrently streams it and then sends a Stream Abort.
    (Decoding after the fact, PostgreSQL 17 and later never stream a transaction the commit
    log already shows as aborted.)
    """
    facts = Facts()
    ex = conn.execute
    # The SQL decoding functions read only flushed WAL; the test clusters commit
    # asynchronously, so commit synchronously here to have every transaction decodable.
    ex("SET synchronous_commit = on")
    for name in ("items", "parent", "child", "fulltab", "moods", "bulk"):
        facts.oids[name] = int(ex("SELECT %s::regclass::oid", (name,)).fetchone()[0])  # type: ignore[index]
    facts.oids["mood"] = int(ex("SELECT 'mood'::regtype::oid").fetchone()[0])  # type: ignore[index]
    big = "x" * 5000

    ex("BEGIN")
    facts.xids["insert"] = _xid(conn)
    ex("INSERT INTO items VALUES (1, 'one', 1.50, '{a,b}', '\\x00ff', %s), "
       "(2, NULL, NULL, NULL, NULL, NULL), (3, 'it''s \"q\"', -3.25, '{}', '\\x', 'small')",
       (big,))
    ex("COMMIT")

    ex("BEGIN")
    facts.xids["update"] = _xid(conn)
    ex("UPDATE items SET name = 'uno' WHERE id = 1")  # big stays TOASTed: 'u'
    ex("UPDATE items SET id = 10 WHERE id = 1")  # key change: old key 'K'
    ex("DELETE FROM items WHERE id = 2")
    ex("COMMIT")

    ex("BEGIN")
    facts.xids["full"] = _xid(conn)
    ex("INSERT INTO fulltab VALUES (1, 'a'), (2, NULL)")
    ex("UPDATE fulltab SET b = 'b' WHERE a = 1")  # old tuple 'O'
    ex("DELETE FROM fulltab WHERE a = 2")
    ex("COMMIT")

    ex("BEGIN")
    facts.xids["enum"] = _xid(conn)
    ex("INSERT INTO moods VALUES (1, 'happy')")
    ex("COMMIT")

    ex("INSERT INTO parent (note) VALUES ('p1'), ('p2')")
    ex("INSERT INTO child (parent_id) VALUES (1)")
    ex("BEGIN")
    facts.xids["truncate"] = _xid(conn)
    ex("TRUNCATE parent RESTART IDENTITY CASCADE")
    ex("COMMIT")

    ex("BEGIN")
    facts.xids["messages"] = _xid(conn)
    facts.message_lsns["tx"] = LSN(str(ex(
        "SELECT pg_logical_emit_message(true, 'pgdecode', %s::bytea)",
        ("transactional €".encode(),),
    ).fetchone()[0]))  # type: ignore[index]
    ex("COMMIT")
    facts.message_lsns["nontx"] = LSN(str(ex(
        "SELECT pg_logical_emit_message(false, 'pgdecode', 'at once')"
    ).fetchone()[0]))  # type: ignore[index]

    facts.origin_lsn = LSN("0/ABCDEF")
    facts.origin = origin_name(conn)
    ex("SELECT pg_replication_origin_session_setup(%s)", (facts.origin,))
    ex("BEGIN")
    facts.xids["origin"] = _xid(conn)
    ex("SELECT pg_replication_origin_xact_setup(%s, now())", (str(facts.origin_lsn),))
    ex("INSERT INTO moods VALUES (2, 'sad')")
    ex("COMMIT")
    ex("SELECT pg_replication_origin_session_reset()")

    ex("BEGIN")
    facts.xids["stream"] = top = _xid(conn)
    ex("INSERT INTO bulk SELECT g, repeat('v', 20) FROM generate_series(1, %s::int) g",
       (STREAM_ROWS,))
    ex("SAVEPOINT s1")
    ex("INSERT INTO bulk SELECT g, 'gone' FROM generate_series(%s::int, %s::int) g",
       (STREAM_ROWS + 1, 2 * STREAM_ROWS))
    facts.subxids["stream"] = _subxid(conn, top)
    ex("ROLLBACK TO SAVEPOINT s1")
    ex("RELEASE SAVEPOINT s1")  # so that what follows belongs to the top transaction again
    ex("INSERT INTO bulk VALUES (-1, 'after savepoint')")
    ex("COMMIT")

    ex("BEGIN")
    facts.xids["stream_abort"] = _xid(conn)
    ex("INSERT INTO bulk SELECT g, 'aborted' FROM generate_series(100001, %s::int) g",
       (100000 + STREAM_ROWS,))
    if abort_pause:
        time.sleep(abort_pause)
    ex("ROLLBACK")

    if prepared:
        ex("BEGIN")
        facts.xids["2pc_commit"] = _xid(conn)
        ex("INSERT INTO items VALUES (20, 'prepared')")
        ex("PREPARE TRANSACTION 'gid-commit'")
        ex("COMMIT PREPARED 'gid-commit'")

        ex("BEGIN")
        facts.xids["2pc_rollback"] = _xid(conn)
        ex("INSERT INTO items VALUES (21, 'rolled back')")
        ex("PREPARE TRANSACTION 'gid-rollback'")
        ex("ROLLBACK PREPARED 'gid-rollback'")

        ex("BEGIN")
        facts.xids["2pc_stream"] = _xid(conn)
        ex("INSERT INTO bulk SELECT g, 'prepared' FROM generate_series(200001, %s::int) g",
           (200000 + STREAM_ROWS,))
        ex("PREPARE TRANSACTION 'gid-stream'")
        ex("COMMIT PREPARED 'gid-stream'")

    facts.end_lsn = LSN(str(ex(
        "SELECT pg_logical_emit_message(false, %s, '')", (END_PREFIX,)
    ).fetchone()[0]))  # type: ignore[index]
    _wait_for_flush(conn, facts.end_lsn)
    for name in ("items", "fulltab", "moods", "parent", "child", "bulk"):
        facts.counts[name] = int(ex(f"SELECT count(*) FROM {name}").fetchone()[0])  # type: ignore[index]
    return facts


def _wait_for_flush(conn: psycopg.Connection[Any], lsn: LSN, timeout: float = 30.0) -> None:
    """Wait until the server has flushed WAL up to ``lsn``. A non-transactional message is not
    flushed by any commit after it: until the WAL writer gets to it, a slot peeked in between
    does not have it yet, and two peeks of the same workload could differ."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (str(lsn),)
                           ).fetchone()
        if row is not None and row[0]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not flush its WAL to {lsn} in {timeout} s")
        time.sleep(0.02)
