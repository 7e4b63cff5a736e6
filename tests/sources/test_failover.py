"""A failover slot on a real standby (PostgreSQL 17 and later), set up as docs/operations.md
says: the slot created with ``pgdecode slot create --failover`` is synchronized to a
streaming standby; after the primary crashes and the standby is promoted, ``pgdecode
stream`` goes on from the promoted server's copy of the slot, into the same file, and the
file holds every row exactly once: those streamed before, those committed but not yet
streamed before the crash, those written after the promotion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.pgtest import BINDIRS, TEST_SETTINGS
from support.streamkit import cli_env, current_lsn, query, read_lines, run_cli, run_stream, wait_for

from plugin_framework.cluster import LocalCluster, server_major_version
from plugin_framework.protocol import LSN

pytestmark = pytest.mark.server


@pytest.fixture(params=BINDIRS, ids=[f"pg{server_major_version(b)}" for b in BINDIRS])
def primary_and_standby(request: pytest.FixtureRequest) -> Any:
    bindir = request.param
    if server_major_version(bindir) < 17:
        pytest.skip("failover slots need PostgreSQL 17 or later")
    primary = LocalCluster(bindir, settings={**TEST_SETTINGS,
                                             "synchronized_standby_slots": "'standby1'"})
    standby = LocalCluster(bindir, settings={**TEST_SETTINGS, "sync_replication_slots": "on",
                                             "hot_standby_feedback": "on",
                                             "primary_slot_name": "'standby1'"})
    try:
        primary.start()
        standby.clone_from(primary, slot="standby1")
        standby.start()
        yield primary, standby
    finally:
        standby.cleanup()
        primary.cleanup()


def _synced(standby: str, slot: str, upto: LSN) -> bool:
    rows = query(standby, "SELECT synced, temporary, confirmed_flush_lsn::text "
                 "FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return bool(rows) and rows[0][0] and not rows[0][1] and rows[0][2] is not None \
        and LSN(rows[0][2]) >= upto


def test_the_stream_goes_on_from_the_promoted_standby(primary_and_standby: Any,
                                                      tmp_path: Path) -> None:
    primary, standby = primary_and_standby
    p, s, env = primary.conninfo(), standby.conninfo(), cli_env()
    out = tmp_path / "out.jsonl"

    def stream(conninfo: str, upto: LSN) -> None:
        result = run_stream(conninfo, "lake", out, "--publication", "pub", "-E", str(upto),
                            "--status-interval", "0.5", env=env)
        assert result.returncode == 0, result.stderr

    query(p, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    query(p, "CREATE PUBLICATION pub FOR TABLE t")
    created = run_cli(["slot", "create", "-d", p, "-S", "lake", "--failover"], env=env)
    assert created.returncode == 0, created.stderr
    query(p, "INSERT INTO t SELECT g, 'before' FROM generate_series(1, 10) g")
    streamed = current_lsn(p)
    stream(p, streamed)

    # The standby keeps the slot once the primary's copy has moved past where the standby
    # began: the consumer acknowledges again after a snapshot of running transactions.
    def synced() -> bool:
        if _synced(s, "lake", streamed):
            return True
        query(p, "SELECT pg_log_standby_snapshot()")
        stream(p, current_lsn(p))
        return False

    wait_for(synced, timeout=120, interval=1, what="the slot to be synchronized")
    status = run_cli(["status", "-d", s, "-S", "lake", "--json"], env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)[0]["failover"] is True

    # committed on the primary, replayed by the standby, never streamed: then the crash
    query(p, "INSERT INTO t SELECT g, 'unstreamed' FROM generate_series(11, 20) g")
    written = current_lsn(p)
    wait_for(lambda: query(s, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                           (str(written),))[0][0], timeout=60, what="the standby to replay")
    primary.stop("immediate")
    query(s, "SELECT pg_promote(true, 60)")
    query(s, "INSERT INTO t SELECT g, 'after' FROM generate_series(21, 25) g")
    stream(s, current_lsn(s))

    lines = read_lines(out)
    assert [(ln["new"]["id"], ln["new"]["v"]) for ln in lines] == \
        [(i, "before") for i in range(1, 11)] + [(i, "unstreamed") for i in range(11, 21)] \
        + [(i, "after") for i in range(21, 26)]
    # the promoted server's slot is an ordinary one now, and it moved on
    assert LSN(query(s, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                     "WHERE slot_name = 'lake'")[0][0]) >= written
