"""The throwaway clusters the server tests and ``pgdecode demo`` run on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest
from support.pgtest import TestDatabase

from plugin_framework.cluster import ClusterError, LocalCluster


def postmaster_pid(cluster: LocalCluster) -> int:
    return int((cluster.datadir / "postmaster.pid").read_text().splitlines()[0])


def process_state(pid: int) -> str | None:
    """The state letter of a process (R, S, Z, ...), or None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_configured_for_logical_decoding(db: TestDatabase) -> None:
    def show(name: str) -> str:
        return str(db.execute(f"SHOW {name}")[0][0])

    assert show("wal_level") == "logical"
    assert show("max_prepared_transactions") == "10"
    assert show("logical_decoding_work_mem") == "64kB"
    assert show("TimeZone") == "UTC"
    assert show("listen_addresses") == "127.0.0.1"
    assert show("port") == str(db.cluster.port)
    assert show("server_encoding") == "UTF8"


def test_server_version_matches_the_binaries(db: TestDatabase) -> None:
    version_num = int(db.execute("SHOW server_version_num")[0][0])
    assert version_num // 10000 == db.major_version == db.cluster.major_version


def test_replication_connection(db: TestDatabase) -> None:
    with psycopg.connect(db.conninfo, replication="database", autocommit=True) as conn:
        row = conn.execute("IDENTIFY_SYSTEM").fetchone()
    assert row is not None
    systemid, timeline, _xlogpos, dbname = row
    assert int(systemid) > 0
    assert int(timeline) == 1
    assert dbname == db.dbname


def test_conninfo_adds_parameters(pg: LocalCluster) -> None:
    conninfo = pg.conninfo("postgres", application_name="it's me")
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SHOW application_name").fetchone() == ("it's me",)


def test_postmaster_is_not_root(pg: LocalCluster) -> None:
    pid = postmaster_pid(pg)
    uid = os.stat(f"/proc/{pid}").st_uid
    assert uid != 0
    assert pg.datadir.stat().st_uid == uid


def test_restart_keeps_data(pg: LocalCluster) -> None:
    with LocalCluster(pg.bindir) as cluster:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (42)")
        before = postmaster_pid(cluster)
        cluster.restart()
        assert cluster.is_running()
        assert postmaster_pid(cluster) != before
        with psycopg.connect(cluster.conninfo()) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]


def test_kill_then_start_recovers_committed_data(pg: LocalCluster) -> None:
    with LocalCluster(pg.bindir) as cluster:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")  # the cluster default is off
            conn.execute("CREATE TABLE kept AS SELECT 7 AS x")
        cluster.kill()
        assert not cluster.is_running()
        cluster.start()
        with psycopg.connect(cluster.conninfo()) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(7,)]


def test_cleanup_stops_the_server_and_removes_the_files(pg: LocalCluster) -> None:
    cluster = LocalCluster(pg.bindir)
    cluster.start()
    pid = postmaster_pid(cluster)
    assert Path(f"/proc/{pid}").exists()
    cluster.cleanup()
    assert process_state(pid) in (None, "Z", "X")  # exited; perhaps not yet reaped
    assert not cluster.basedir.exists()
    assert not cluster.is_running()
    cluster.stop()  # stopping again is harmless
    cluster.cleanup()
    # pg_ctl leaves the postmaster to init, which reaps it; here that can take a second or two.
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


def test_failed_start_reports_the_server_log(pg: LocalCluster) -> None:
    cluster = LocalCluster(pg.bindir, settings={"no_such_setting": "1"})
    try:
        with pytest.raises(ClusterError, match="no_such_setting"):
            cluster.start()
        assert not cluster.is_running()
    finally:
        cluster.cleanup()
    assert not cluster.basedir.exists()


def test_caller_settings_override_the_defaults(pg: LocalCluster, tmp_path: Path) -> None:
    settings = {"max_prepared_transactions": "3"}
    with (
        LocalCluster(pg.bindir, tmp_path / "c", settings=settings) as c,
        psycopg.connect(c.conninfo()) as conn,
    ):
        assert conn.execute("SHOW max_prepared_transactions").fetchone() == ("3",)
    # A caller's base directory is kept; only the server is gone.
    assert (tmp_path / "c" / "data" / "PG_VERSION").exists()
    assert not c.is_running()
