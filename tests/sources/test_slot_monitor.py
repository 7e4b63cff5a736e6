"""The slot's keeper beside a stream (sources/monitor.py), on each server version:
``--heartbeat`` writes messages into the slot's database that the stream swallows and
acknowledges past while another database is busy; a role that may not write them is told
so at once; and a slot near ``max_slot_wal_keep_size`` gets a warning in the log and a
metric."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
from support.pgtest import unique_dbname
from support.streamkit import (
    confirmed_flush,
    create_slot,
    free_port,
    query,
    run_cli,
    scrape,
    slot_row,
    start_cli,
    stop_process,
    wait_for,
)

from plugin_framework.cluster import LocalCluster
from plugin_framework.protocol import LSN


def _busy(conninfo: str, stop: threading.Event) -> threading.Thread:
    """A writer that keeps another database's WAL growing until ``stop``."""
    def write() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS busy (id bigserial PRIMARY KEY, v text)")
            while not stop.is_set():
                conn.execute("INSERT INTO busy (v) SELECT repeat('b', 100) "
                             "FROM generate_series(1, 200)")

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_heartbeats_move_an_idle_slot_and_never_reach_the_emitters(
        db: Any, tmp_path: Path, env: dict[str, str]) -> None:
    slot = f"{db.dbname}_beat"
    db.execute("CREATE TABLE idle (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION beat_pub FOR TABLE idle")
    create_slot(db.conninfo, slot)
    # test_decoding, on a slot of its own, shows what the heartbeats wrote into the WAL
    witness = f"{db.dbname}_witness"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (witness,))
    other = unique_dbname("busy")
    query(db.cluster.conninfo(), f"CREATE DATABASE {other}")
    stop = threading.Event()
    writer = _busy(db.cluster.conninfo(other), stop)
    out, log, port = tmp_path / "out.jsonl", tmp_path / "stream.log", free_port()
    proc = start_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "beat_pub",
                      "-f", str(out), "--heartbeat", "0.3", "--status-interval", "0.3",
                      "--metrics-port", str(port), "--metrics-address", "127.0.0.1"],
                     env=env, stderr_path=log)
    try:
        wait_for(lambda: scrape(port).get("pgdecode_heartbeats_total", 0) >= 4, timeout=60,
                 what="four heartbeats")

        def witnessed() -> list[tuple[str, str]]:
            # the SQL functions decode flushed WAL only, and the test cluster commits
            # asynchronously: the newest heartbeat may not be there yet
            rows = db.execute("SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, "
                              "NULL, NULL)", (witness,))
            return [(lsn, data) for lsn, data in rows if "prefix: pgdecode" in data]

        seen = wait_for(lambda: len(found := witnessed()) >= 4 and found, timeout=60,
                        what="four heartbeats in the WAL")
        assert all("transactional: 0" in data and f'"heartbeat": "{slot}"' in data
                   for _, data in seen), seen
        beats = [LSN(lsn) for lsn, _ in seen]
        wait_for(lambda: confirmed_flush(db.conninfo, slot) >= beats[-1], timeout=60,
                 what="the slot to pass the heartbeats")
    finally:
        stop.set()
        writer.join(timeout=30)
        assert stop_process(proc) == 0, log.read_text()[-2000:]
        query(db.cluster.conninfo(), f"DROP DATABASE {other} WITH (FORCE)")
    assert out.read_text() == ""  # the emitter never saw a heartbeat


def test_heartbeat_refused_to_a_role_that_may_not_write_it(
        db: Any, env: dict[str, str]) -> None:
    slot = f"{db.dbname}_nobeat"
    role = f"{db.dbname}_quiet"
    db.execute("CREATE TABLE idle (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION beat_pub FOR TABLE idle")
    create_slot(db.conninfo, slot)
    db.execute(f"CREATE ROLE {role} LOGIN REPLICATION")
    for (function,) in db.execute("SELECT oid::regprocedure::text FROM pg_proc "
                                  "WHERE proname = 'pg_logical_emit_message'"):
        db.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
    try:
        result = run_cli(["stream", "-d", db.cluster.conninfo(db.dbname, user=role), "-S", slot,
                          "--publication", "beat_pub", "--heartbeat", "1", "-E", "0/1"],
                         env=env)
        assert result.returncode == 1, result.stderr
        assert "--heartbeat: permission denied for function pg_logical_emit_message" \
            in result.stderr
        assert "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text" \
            in result.stderr
        assert slot_row(db.conninfo, slot)["active"] is False  # type: ignore[index]
    finally:
        db.execute(f"DROP OWNED BY {role}")
        db.execute(f"DROP ROLE {role}")


def test_a_slot_near_max_slot_wal_keep_size_is_warned_of(
        pg: LocalCluster, tmp_path: Path, env: dict[str, str]) -> None:
    limit = 160 * 2**20
    with LocalCluster(pg.bindir, settings={"max_slot_wal_keep_size": "160MB"}) as cluster:
        conninfo = cluster.conninfo()
        query(conninfo, "CREATE TABLE t (id int PRIMARY KEY, v text)")
        query(conninfo, "CREATE PUBLICATION near_pub FOR TABLE t")
        create_slot(conninfo, "near")
        # WAL the slot holds back, segment by segment, until under a fifth of the limit is left
        # (no CHECKPOINT: that would invalidate a slot past the limit)
        for i in range(20):
            safe = slot_row(conninfo, "near")["safe_wal_size"]  # type: ignore[index]
            if safe is not None and safe < 0.2 * limit:
                break
            query(conninfo, "INSERT INTO t VALUES (%s, 'x')", (i,))
            query(conninfo, "SELECT pg_switch_wal()")
        else:
            raise AssertionError("the slot never came near max_slot_wal_keep_size")
        log, port = tmp_path / "stream.log", free_port()
        proc = start_cli(["stream", "-d", conninfo, "-S", "near", "--publication", "near_pub",
                          "-f", str(tmp_path / "out.jsonl"), "--status-interval", "60",
                          "--metrics-port", str(port), "--metrics-address", "127.0.0.1"],
                         env=env, stderr_path=log)
        try:
            metrics = wait_for(lambda: "pgdecode_slot_near_limit" in (m := scrape(port)) and m,
                               timeout=60, what="the slot's metrics")
            assert metrics["pgdecode_slot_near_limit"] == 1
            assert metrics["pgdecode_slot_wal_keep_limit_bytes"] == limit
            assert metrics["pgdecode_slot_safe_wal_size_bytes"] < 0.2 * limit
            wait_for(lambda: "max_slot_wal_keep_size" in log.read_text(), timeout=30,
                     what="the warning")
        finally:
            assert stop_process(proc) == 0, log.read_text()[-2000:]
        text = log.read_text()
        assert 'slot "near":' in text and "MB of WAL left before max_slot_wal_keep_size " \
            "(160 MB) invalidates it" in text, text
        assert "Let the consumer catch up, or raise max_slot_wal_keep_size" in text
