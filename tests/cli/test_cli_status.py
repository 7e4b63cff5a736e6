"""``pgdecode status`` against pg_replication_slots, on each server version: a slot behind
a workload, a two-phase slot with a prepared transaction pending, a failover slot (17+);
the JSON says what the server says, the table shows them, a missing slot exits 3."""

from __future__ import annotations

import json
from typing import Any

from support.streamkit import run_cli


def _lsn(db: Any) -> int:
    return int(db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def test_status_reports_what_pg_replication_slots_says(db: Any) -> None:
    plain, two_phase, failover = (f"{db.dbname}_{x}" for x in ("plain", "2pc", "failover"))
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (plain,))
    result = run_cli(["slot", "create", "-d", db.conninfo, "-S", two_phase, "--two-phase"])
    assert result.returncode == 0, result.stderr
    if db.major_version >= 17:
        result = run_cli(["slot", "create", "-d", db.conninfo, "-S", failover, "--failover"])
        assert result.returncode == 0, result.stderr
    db.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 5000) g")
    with db.connect() as conn:
        conn.execute("INSERT INTO t VALUES (-1, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'status-1'")
    try:
        before = _lsn(db)
        result = run_cli(["status", "-d", db.conninfo, "--json"])
        after = _lsn(db)
        assert result.returncode == 0, result.stderr
        reported = {s["slot"]: s for s in json.loads(result.stdout)}
        later = ", failover, inactive_since::text, invalidation_reason" \
            if db.major_version >= 17 else ", NULL, NULL, NULL"
        rows = db.execute(
            "SELECT slot_name, plugin, database, two_phase, active_pid, "
            "confirmed_flush_lsn::text, restart_lsn::text, wal_status, safe_wal_size, "
            f"confirmed_flush_lsn - '0/0'::pg_lsn, restart_lsn - '0/0'::pg_lsn{later} "
            "FROM pg_replication_slots WHERE database = current_database()")
        assert len(rows) == (3 if db.major_version >= 17 else 2)
        for (name, plugin, database, is_2pc, pid, confirmed, restart, wal_status, safe,
             confirmed_at, restart_at, is_failover, inactive, reason) in rows:
            s = reported[name]
            assert (s["plugin"], s["database"], s["two_phase"], s["active_pid"]) == (
                plugin, database, is_2pc, pid)
            assert (s["confirmed_flush_lsn"], s["restart_lsn"], s["wal_status"]) == (
                confirmed, restart, wal_status)
            assert s["safe_wal_size"] == safe  # NULL: no max_slot_wal_keep_size
            assert before - confirmed_at <= s["lag_bytes"] <= after - confirmed_at
            assert before - restart_at <= s["retained_bytes"] <= after - restart_at
            assert s["lag_bytes"] > 5000 * 100  # the workload is behind every slot
            assert (s["failover"], s["invalidation_reason"]) == (is_failover, reason)
            assert s["inactive_since"] == (None if inactive is None else
                                           str(db.execute("SELECT %s::timestamptz",
                                                          (inactive,))[0][0]))
            assert s["prepared"] == (1 if is_2pc else None)
        if db.major_version >= 17:
            assert reported[failover]["failover"] is True
            assert reported[plain]["inactive_since"] is not None

        text = run_cli(["status", "-d", db.conninfo])
        assert text.returncode == 0, text.stderr
        header, *lines = text.stdout.splitlines()
        assert header.split()[:3] == ["SLOT", "PLUGIN", "DATABASE"]
        mine = {line.split()[0]: line.split() for line in lines}
        assert mine[two_phase][-1] == "1" and mine[plain][-1] == "-"
    finally:
        db.execute("ROLLBACK PREPARED 'status-1'")

    missing = run_cli(["status", "-d", db.conninfo, "-S", f"{db.dbname}_nope"])
    assert missing.returncode == 3
    assert f'"{db.dbname}_nope" does not exist' in missing.stderr
