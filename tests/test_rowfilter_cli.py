"""Row filters through `pgdecode stream`, end to end: the server's filtered publication and
pgdecode's client-side filter over an unfiltered one give the same output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any


def stream(db: Any, slot: str, publication: str, out: Path, end: str,
           *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plugin_framework.cli", "stream", "-d", db.conninfo, "-S", slot,
         "--publication", publication, "-E", end, "-q", "--emitter", "text",
         "-o", "include-xids=0", "-f", str(out), *extra],
        capture_output=True, text=True, timeout=300)


def test_cli_filters_match_the_servers(db: Any, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int, region text, n int, PRIMARY KEY (id, region))")
    db.execute("CREATE PUBLICATION everything FOR TABLE t")
    db.execute("CREATE PUBLICATION filtered FOR TABLE t (id, region) "
               "WHERE (region = 'NSW' AND id > 2)")
    for slot in ("server", "client"):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                   (f"{db.dbname}_{slot}",))
    with db.connect(autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("INSERT INTO t SELECT g, CASE WHEN g % 2 = 0 THEN 'NSW' ELSE 'VIC' END, g "
                     "FROM generate_series(1, 10) g")
        conn.execute("UPDATE t SET region = 'VIC' WHERE id = 4")  # leaves the filter: DELETE
        conn.execute("UPDATE t SET region = 'NSW' WHERE id = 5")  # enters it: INSERT
        conn.execute("UPDATE t SET n = 0 WHERE id = 6")  # stays in: UPDATE
        conn.execute("DELETE FROM t WHERE id IN (1, 8)")
        end = str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]
    server, client = tmp_path / "server.out", tmp_path / "client.out"
    done = stream(db, f"{db.dbname}_server", "filtered", server, end)
    assert done.returncode == 0, done.stderr
    done = stream(db, f"{db.dbname}_client", "everything", client, end,
                  "--filters-from-publication", "filtered")
    assert done.returncode == 0, done.stderr
    lines = client.read_text().splitlines()
    assert lines == server.read_text().splitlines()
    changes = [line.removeprefix("table public.t: ") for line in lines
               if line.startswith("table ")]
    # The UPDATE transformations: id 4 left the filter (a DELETE), 5 entered it (an INSERT),
    # 6 stayed (an UPDATE); 1 was never in it; and the n column is not in the column list.
    assert any(c.startswith("DELETE: id[integer]:4 ") for c in changes), changes
    assert "INSERT: id[integer]:5 region[text]:'NSW'" in changes
    assert any(c.startswith("UPDATE: ") and "id[integer]:6 " in c for c in changes)
    assert not any("id[integer]:1 " in c for c in changes)
    assert not any("n[integer]" in c for c in changes)


def test_bad_filter_fails_before_streaming(db: Any, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    db.execute("CREATE PUBLICATION p FOR TABLE t")
    slot = f"{db.dbname}_s"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    before = db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                        "WHERE slot_name = %s", (slot,))
    db.execute("INSERT INTO t VALUES (1, 1)")
    done = stream(db, slot, "p", tmp_path / "out", "1/0", "--row-filter",
                  "public.t:(random() > 0.5)")
    assert done.returncode == 1
    assert "invalid publication WHERE expression" in done.stderr
    assert "Traceback" not in done.stderr
    after = db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                       "WHERE slot_name = %s", (slot,))
    assert after == before  # nothing acknowledged
