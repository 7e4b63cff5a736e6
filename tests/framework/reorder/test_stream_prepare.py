"""Streamed prepared transactions against contrib/test_decoding, on each server: every
combination the server can produce of streaming (stream-changes on or off), filter_prepare
(test_decoding declines gids containing "_nodecode") and outcome (COMMIT PREPARED,
ROLLBACK PREPARED, an ordinary commit or abort), with subtransactions, with blocks streamed
before the PREPARE (logical_decoding_work_mem = 64kB in the test clusters).

pgoutput takes every prepared transaction at PREPARE, so it streams the rest of a streamed
one there and sends Stream Prepare whatever test_decoding's filter would say; the framework
must turn that into what the server calls on test_decoding itself.

Both plugins read the same slot history twice: live through START_REPLICATION while the
workload runs, each PREPARE decoded before its outcome is written (as a consumer that keeps
up sees it), and afterwards in one ``peek`` (where PostgreSQL 18 no longer streams a
transaction it already knows to be rolled back, for either plugin). test_decoding's output
through a walsender has no xid column: lines and LSNs are compared.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.capture import Captured, pgoutput_options
from support.textparity import (
    Line,
    Source,
    assert_same,
    drop_empty_xacts,
    our_lines,
    paired_slots,
    server_lines,
)

from emitters.text import TestDecodingEmitter
from plugin_framework import LSN, MemoryOutput, Pipeline
from plugin_framework.protocol import XLogData
from plugin_framework.sources.replication import ReplicationStream

SCHEMA = """
CREATE TABLE stream_test (data text);
CREATE TABLE other (id integer);
CREATE PUBLICATION sp_pub FOR ALL TABLES;
"""
END = "stream-prepare-end"

# test_decoding's options, each on a slot of its own (a slot has one walsender at a time)
OPTIONS: dict[str, dict[str, str]] = {
    "stream": {"stream-changes": "1", "skip-empty-xacts": "1"},
    "stream_xids": {"stream-changes": "1"},
    "whole": {"skip-empty-xacts": "1", "include-xids": "0"},
}


def _big(letter: str, rows: int = 40) -> str:
    return (f"INSERT INTO stream_test SELECT repeat('{letter}', 2000) || g.i "
            f"FROM generate_series(1, {rows}) g(i)")


# Each: the statements of one transaction before its PREPARE (or its end), and its outcome.
TRANSACTIONS: list[tuple[str | None, list[str], str]] = [
    # the reproduction: streamed before PREPARE, declined, committed
    ("test1_nodecode", [_big("a")], "COMMIT"),
    # a subtransaction with changes in the streamed blocks, declined, committed / rolled back
    ("test2_nodecode", [_big("a"), "SAVEPOINT s1", _big("b"), "RELEASE s1",
                        "INSERT INTO stream_test VALUES ('tail')"], "COMMIT"),
    ("test3_nodecode", [_big("a"), "SAVEPOINT s1", _big("b"), "RELEASE s1",
                        "INSERT INTO stream_test VALUES ('tail')"], "ROLLBACK"),
    # a subtransaction rolled back after it was streamed (test_decoding's twophase_stream,
    # but for its transactional message: see "Known limits" in docs/framework.md)
    ("test4_nodecode", ["SAVEPOINT s1", _big("c", 35), "TRUNCATE stream_test", "ROLLBACK TO s1",
                        "INSERT INTO stream_test SELECT repeat('d', 10) || g.i "
                        "FROM generate_series(1, 20) g(i)"], "COMMIT"),
    # taken at PREPARE: stream_prepare, then its outcome
    ("test5", [_big("a"), "SAVEPOINT s1", _big("b"), "RELEASE s1"], "COMMIT"),
    ("test6", [_big("a"), "SAVEPOINT s1", _big("b"), "RELEASE s1"], "ROLLBACK"),
    # not streamed at all, declined
    ("test7_nodecode", ["INSERT INTO stream_test VALUES ('small')"], "COMMIT"),
    ("test8_nodecode", ["INSERT INTO stream_test VALUES ('small')"], "ROLLBACK"),
    # ordinary streamed transactions with a subtransaction
    (None, [_big("e"), "SAVEPOINT s1", _big("f"), "RELEASE s1"], "COMMIT"),
    (None, [_big("g"), "SAVEPOINT s1", _big("h"), "RELEASE s1"], "ROLLBACK"),
]


class Reader(threading.Thread):
    """A walsender session on one slot, collecting XLogData up to the END message."""

    def __init__(self, conninfo: str, slot: str, options: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.stream = ReplicationStream(conninfo)
        self.stream.start(slot, LSN(0), options)
        self.captured: list[Captured] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                msg = self.stream.read(1.0)
                if isinstance(msg, XLogData):
                    self.captured.append(Captured(msg.wal_start, bytes(msg.data)))
                    if END.encode() in msg.data:
                        return
            raise TimeoutError("no end message within 120 s")
        except BaseException as exc:
            self.error = exc

    def result(self) -> list[Captured]:
        self.join(130)
        self.stream.conn.close()
        if self.error is not None:
            raise self.error
        return self.captured


def _wait_sent(conn: psycopg.Connection[Any], slots: list[str], lsn: str) -> None:
    """Until the walsender of every slot has decoded the WAL up to ``lsn``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        behind = conn.execute(
            "SELECT count(*) FROM pg_replication_slots s LEFT JOIN pg_stat_replication r "
            "ON r.pid = s.active_pid WHERE s.slot_name = ANY(%s) "
            "AND (r.sent_lsn IS NULL OR r.sent_lsn < %s::pg_lsn)", (slots, lsn)).fetchone()
        if behind is not None and behind[0] == 0:
            return
        time.sleep(0.05)
    raise TimeoutError(f"walsenders did not reach {lsn}")


def run_workload(conn: psycopg.Connection[Any], slots: list[str]) -> None:
    ex = conn.execute
    for gid, statements, outcome in TRANSACTIONS:
        ex("BEGIN")
        for statement in statements:
            ex(statement)
        if gid is None:
            ex(outcome)
            continue
        ex(f"PREPARE TRANSACTION '{gid}'")
        row = ex("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        _wait_sent(conn, slots, row[0])  # decoded before its outcome exists
        ex("INSERT INTO other VALUES (1)")  # something between PREPARE and its outcome
        ex(f"{outcome} PREPARED '{gid}'")
    ex("SELECT pg_logical_emit_message(false, %s, 'x')", (END,))


@pytest.fixture(scope="module")
def decoded(pg: Any) -> Iterator[tuple[Source, dict[str, list[Captured]]]]:
    with paired_slots(pg, SCHEMA, "sp", "sp_pub", two_phase=True) as source:
        conninfo = source.db.conninfo
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for name in OPTIONS:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', "
                             "false, true)", (f"sp_{name}",))
        proto = 4 if source.db.major_version >= 16 else 3
        readers = {name: Reader(conninfo, f"sp_{name}", options)
                   for name, options in OPTIONS.items()}
        readers["pgoutput"] = Reader(conninfo, source.pgoutput, pgoutput_options(
            proto, streaming="on", publication=source.publication))
        for reader in readers.values():
            reader.start()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            run_workload(conn, [f"sp_{name}" for name in OPTIONS] + [source.pgoutput])
        yield source, {name: reader.result() for name, reader in readers.items()}


def _ours(source: Source, captured: list[Captured], options: dict[str, str]) -> list[Line]:
    pipeline = Pipeline(proto_version=4 if source.db.major_version >= 16 else 3)
    out = MemoryOutput()
    pipeline.add(TestDecodingEmitter(), options=options, output=out)
    pipeline.startup()
    for item in captured:
        pipeline.feed(item.data, item.lsn)
    assert not pipeline.in_flight
    pipeline.shutdown()
    return [Line(r.lsn, 0, r.data.decode()) for r in out.records]


def _texts(lines: list[Line]) -> list[str]:
    return [x.data for x in lines]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_live(decoded: tuple[Source, dict[str, list[Captured]]], name: str) -> None:
    source, captured = decoded
    options = OPTIONS[name]
    theirs = [Line(c.lsn, 0, c.data.decode()) for c in captured[name]]
    ours = _ours(source, captured["pgoutput"], options)
    ours = [x for x in ours if END not in x.data]
    theirs = [x for x in theirs if END not in x.data]
    if options.get("skip-empty-xacts") != "1":
        theirs, _ = drop_empty_xacts(theirs)
    # a walsender sends 0/0 for a write that is not a callback's last (WalSndPrepareWrite):
    # test_decoding's BEGIN and block openings written at a first change, under skip-empty-xacts
    theirs = [Line(mine.lsn, 0, server.data) if server.lsn == 0 else server
              for mine, server in zip(ours, theirs, strict=False)] + theirs[len(ours):]
    assert_same(ours, theirs, begin_lsn=options.get("skip-empty-xacts") == "1")
    texts = _texts(theirs)
    assert not any("PREPARE TRANSACTION 'test1_nodecode'" in t for t in texts)
    if options.get("stream-changes") == "1":
        xid = "" if options.get("include-xids") == "0" else " TXN "
        # what the combinations must have produced for this to mean something: the
        # remainder and stream_commit at COMMIT PREPARED, subtransaction aborts at ROLLBACK
        # PREPARED, stream_prepare for the gids taken at PREPARE
        assert sum(t.startswith("committing streamed transaction") for t in texts) >= 4
        # ROLLBACK TO after a block (test4), and at ROLLBACK PREPARED of test3 its
        # subtransaction, then itself
        assert sum(t.startswith(f"aborting streamed (sub)transaction{xid}") for t in texts) >= 3
        assert sum(t.startswith("preparing streamed transaction") for t in texts) == 2
        assert any(t.startswith("ROLLBACK PREPARED 'test6'") for t in texts)
    else:
        assert texts.count("COMMIT") >= 4


@pytest.mark.parametrize("name", list(OPTIONS))
def test_peek(decoded: tuple[Source, dict[str, list[Captured]]], name: str) -> None:
    """The same history decoded after the fact, in one session of each plugin."""
    source, _ = decoded
    options = OPTIONS[name]
    slot = Source(source.db, f"sp_{name}", source.pgoutput, source.publication)
    theirs = [x for x in server_lines(slot, options) if END not in x.data]
    ours = [x for x in our_lines(slot, options, streaming=True).lines if END not in x.data]
    if options.get("skip-empty-xacts") != "1":
        theirs, _ = drop_empty_xacts(theirs)
    assert_same(ours, theirs, begin_lsn=options.get("skip-empty-xacts") == "1")
    if options.get("stream-changes") == "1":
        assert any(t.startswith("committing streamed transaction") for t in _texts(theirs))
