"""The codec on real streams: every message kind captured live from each server version, its
fields checked against what the server itself reports, and every message re-encoded byte for
byte."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.capture import Captured, peek, pgoutput_options
from support.streamkit import LiveCapture
from support.workload import STREAM_ROWS, Facts, create_schema, run_workload

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


@dataclass
class Workload:
    db: Any
    facts: Facts
    sql_slot: str
    live: list[Captured]  # START_REPLICATION, streaming on, decoded while the workload ran
    live_parallel: list[Captured] | None  # the same with streaming parallel (protocol 4)


@pytest.fixture(scope="module")
def workload(pg_module_db: Any) -> Iterator[Workload]:
    db = pg_module_db
    conn = db.connect(autocommit=True)
    create_schema(conn)
    slots = [f"{db.dbname}_{kind}" for kind in ("sql", "repl", "par")]
    for slot in slots:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (slot,))
    proto = max(versions(db))
    captures = [LiveCapture(db.conninfo, slots[1], pgoutput_options(proto, streaming="on"))]
    if proto >= 4:
        captures.append(LiveCapture(db.conninfo, slots[2],
                                    pgoutput_options(4, streaming="parallel")))
    for capture in captures:
        capture.start()
        capture.started_streaming.wait(30)
    facts = run_workload(conn, abort_pause=2.0)
    conn.close()
    live = [c.result() for c in captures]
    yield Workload(db, facts, slots[0], live[0], live[1] if len(live) > 1 else None)


def versions(db: Any) -> list[int]:
    return [1, 2, 3, 4] if db.major_version >= 16 else [1, 2, 3]


def decode_all(captured: list[Captured], proto_version: int) -> list[Message]:
    decoder = Decoder(proto_version)
    messages = []
    for item in captured:
        message = decoder.decode(item.data)
        assert encode(message) == item.data, message
        messages.append(message)
    assert not decoder.in_stream
    return messages


def check_stream(w: Workload, messages: list[Message], proto: int, streaming: bool,
                 binary: bool, live: bool = False) -> None:
    """Check every decoded field the server can vouch for."""
    f = w.facts
    db = w.db
    by_xid: dict[int, list[Message]] = {}
    current: int | None = None
    kinds = Counter(type(m).__name__ for m in messages)
    for m in messages:
        if isinstance(m, (Begin, BeginPrepare, StreamStart)):
            current = m.xid
        elif isinstance(m, (Commit, Prepare, StreamStop)):
            current = None
        if current is not None:
            by_xid.setdefault(current, []).append(m)

    # Begin / Commit and commit timestamps as the server recorded them.
    for i, m in enumerate(messages):
        if isinstance(m, Begin):
            commit = next(c for c in messages[i:] if isinstance(c, Commit))
            assert commit.commit_lsn == m.final_lsn
            assert commit.end_lsn > commit.commit_lsn
            ts = db.execute("SELECT pg_xact_commit_timestamp(%s::text::xid)", (m.xid,))[0][0]
            assert m.commit_time == commit.commit_time == ts

    # Relations: ids, names, columns, key flags and replica identity from the catalog.
    relations = {m.name: m for m in messages if isinstance(m, RelationMessage)}
    for name in ("items", "fulltab", "moods", "bulk", "parent", "child"):
        rel = relations[name]
        assert rel.relation_id == f.oids[name]
        assert rel.namespace == "public"
        cols = db.execute(
            "SELECT a.attname, a.atttypid::int, a.atttypmod, "
            "  coalesce(a.attnum = ANY(i.indkey), false) "
            "FROM pg_attribute a LEFT JOIN pg_index i "
            "  ON i.indrelid = a.attrelid AND i.indisprimary "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (f.oids[name],),
        )
        identity = db.execute("SELECT relreplident FROM pg_class WHERE oid = %s",
                              (f.oids[name],))[0][0]
        assert rel.replica_identity == identity
        expected = [(n, t, m, k or identity == "f") for n, t, m, k in cols]
        assert [(c.name, c.type_oid, c.type_modifier, c.is_key) for c in rel.columns] == expected

    # The enum type is described before the relation that uses it.
    types = [m for m in by_xid[f.xids["enum"]] if isinstance(m, Type)]
    assert [(t.type_oid, t.namespace, t.name) for t in types] == [(f.oids["mood"], "public",
                                                                  "mood")]

    # Inserts: text values, nulls, and binary mode's own encoding.
    inserts = [m for m in by_xid[f.xids["insert"]] if isinstance(m, Insert)]
    assert [m.relation_id for m in inserts] == [f.oids["items"]] * 3
    if binary:
        assert inserts[0].new.kinds[:2] == b"bb"
        assert inserts[0].new.values[0] == (1).to_bytes(4, "big")
        assert inserts[0].new.values[1] == b"one"
    else:
        assert inserts[0].new.decoded() == ["1", "one", "1.50", "{a,b}", "\\x00ff", "x" * 5000]
        assert inserts[2].new.decoded()[1] == "it's \"q\""
    assert inserts[1].new.kinds[1:] == b"nnnnn"

    # Updates: unchanged TOAST, key change with old key, delete with old key.
    changes = [m for m in by_xid[f.xids["update"]] if isinstance(m, (Update, Delete))]
    first, key_change, delete = changes
    assert isinstance(first, Update) and first.key is None and first.old is None
    assert first.new.kinds[5:] == b"u"
    assert isinstance(key_change, Update) and key_change.key is not None
    assert key_change.key.kinds[0] in b"tb" and key_change.key.kinds[1:] == b"nnnnn"
    assert isinstance(delete, Delete) and delete.key is not None and delete.old is None
    full = [m for m in by_xid[f.xids["full"]] if isinstance(m, (Update, Delete))]
    assert all(m.old is not None and m.key is None for m in full) and len(full) == 2

    # TRUNCATE ... RESTART IDENTITY CASCADE.
    (trunc,) = [m for m in by_xid[f.xids["truncate"]] if isinstance(m, Truncate)]
    assert set(trunc.relation_ids) == {f.oids["parent"], f.oids["child"]}
    assert trunc.cascade and trunc.restart_identity

    # Logical messages at the LSNs pg_logical_emit_message returned.
    (tx_msg,) = [m for m in by_xid[f.xids["messages"]] if isinstance(m, LogicalMessage)]
    assert (tx_msg.transactional, tx_msg.lsn, tx_msg.prefix) == (True, f.message_lsns["tx"],
                                                                 "pgdecode")
    assert tx_msg.content == "transactional €".encode()
    nontx = [m for m in messages if isinstance(m, LogicalMessage) and not m.transactional]
    assert (nontx[0].lsn, nontx[0].content) == (f.message_lsns["nontx"], b"at once")

    # Replication origin.
    (origin,) = [m for m in by_xid[f.xids["origin"]] if isinstance(m, Origin)]
    assert (origin.name, origin.origin_lsn) == (f.origin, f.origin_lsn)

    # The large transaction with a rolled-back savepoint, and the large aborted one.
    top, sub = f.xids["stream"], f.subxids["stream"]
    if streaming:
        starts = [m for m in messages if isinstance(m, StreamStart) and m.xid == top]
        assert starts[0].first_segment and not any(s.first_segment for s in starts[1:])
        per_xid = Counter(m.xid for m in by_xid[top] if isinstance(m, Insert))
        # Of the aborted subtransaction, only what was streamed before its abort was sent.
        assert set(per_xid) == {top, sub} and per_xid[top] == STREAM_ROWS + 1
        assert 0 < per_xid[sub] <= STREAM_ROWS
        aborts = [(m.xid, m.subxid) for m in messages if isinstance(m, StreamAbort)]
        assert (top, sub) in aborts
        aborted = f.xids["stream_abort"]
        streamed_aborted = any(isinstance(m, StreamStart) and m.xid == aborted for m in messages)
        # Decoded while it ran, the aborted transaction was streamed and then aborted; decoded
        # after the fact, it is streamed only by servers that do not check the commit log first.
        assert streamed_aborted or not live
        assert ((aborted, aborted) in aborts) == streamed_aborted
        assert not any(isinstance(m, Insert) and m.xid is None and m.new.values[1] == b"aborted"
                       for m in messages)
        assert any(isinstance(m, StreamCommit) and m.xid == top for m in messages)
        if proto >= 4:
            assert all(m.abort_lsn is None for m in messages if isinstance(m, StreamAbort))
    else:
        assert sum(isinstance(m, Insert) for m in by_xid[top]) == STREAM_ROWS + 1
        assert f.xids["stream_abort"] not in by_xid
        assert not any(isinstance(m, (StreamStart, StreamAbort)) for m in messages)

    # Two-phase commit and rollback, and a prepared transaction large enough to stream.
    prepares = {m.gid: m for m in messages if isinstance(m, (Prepare, StreamPrepare))}
    assert prepares["gid-commit"].xid == f.xids["2pc_commit"]
    assert prepares["gid-rollback"].xid == f.xids["2pc_rollback"]
    assert isinstance(prepares["gid-stream"], StreamPrepare if streaming else Prepare)
    (cp,) = [m for m in messages if isinstance(m, CommitPrepared) and m.gid == "gid-commit"]
    assert cp.xid == f.xids["2pc_commit"] and cp.commit_lsn >= prepares["gid-commit"].end_lsn
    (rp,) = [m for m in messages if isinstance(m, RollbackPrepared)]
    assert (rp.gid, rp.xid) == ("gid-rollback", f.xids["2pc_rollback"])
    assert rp.prepare_end_lsn == prepares["gid-rollback"].end_lsn
    assert rp.prepare_time == prepares["gid-rollback"].prepare_time
    begin_prepares = {m.gid for m in messages if isinstance(m, BeginPrepare)}
    assert {"gid-commit", "gid-rollback"} <= begin_prepares
    assert kinds["Insert"] > 0


def test_sql_interface_every_version_and_mode(workload: Workload) -> None:
    seen = set()
    for proto in versions(workload.db):
        for streaming in (False, True) if proto >= 2 else (False,):
            for binary in (False, True):
                options = pgoutput_options(proto, streaming="on" if streaming else "off",
                                           binary=binary)
                captured = peek(workload.db.connect(autocommit=True), workload.sql_slot,
                                options)
                messages = decode_all(captured, proto)
                check_stream(workload, messages, proto, streaming, binary)
                seen |= {type(m) for m in messages}
    assert len(seen) == 19  # every message type of the protocol


def test_walsender_live_stream(workload: Workload) -> None:
    proto = max(versions(workload.db))
    messages = decode_all(workload.live, proto)
    check_stream(workload, messages, proto, streaming=True, binary=False, live=True)
    # Decoded after the fact through the SQL interface, the same slot contents give the same
    # messages, except for what was streamed only because it was decoded while it ran.
    peeked = peek(workload.db.connect(autocommit=True), workload.sql_slot,
                  pgoutput_options(proto, streaming="on"))
    by_data = {c.data: c.lsn for c in peeked}
    commits = [c for c, m in zip(workload.live, messages, strict=True) if isinstance(m, Commit)]
    assert commits and all(c.data in by_data for c in commits)
    # A Commit's XLogData start LSN is the position the SQL interface reports for it. Relation
    # and Type, which have no WAL record of their own, carry 0/0; so may Begin, which pgoutput
    # sends only once the first published change is decoded.
    for message, got in zip(messages, workload.live, strict=True):
        if isinstance(message, (RelationMessage, Type)):
            assert got.lsn == LSN(0)
        elif isinstance(message, Commit):
            assert got.lsn == by_data[got.data] == message.end_lsn, message


def test_parallel_streaming_sends_abort_lsn_and_time(workload: Workload) -> None:
    if workload.live_parallel is None:
        pytest.skip("protocol version 4 and streaming = parallel need PostgreSQL 16 or later")
    messages = decode_all(workload.live_parallel, 4)
    aborts = [m for m in messages if isinstance(m, StreamAbort)]
    assert aborts and all(m.abort_lsn and m.abort_time for m in aborts)
    (abort,) = [m for m in aborts if m.xid == m.subxid == workload.facts.xids["stream_abort"]]
    assert abort.abort_lsn is not None and abort.abort_lsn < workload.facts.end_lsn
