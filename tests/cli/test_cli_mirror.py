"""``pgdecode mirror`` as a user runs it, on each server version: a new slot with an initial
snapshot of tables that hold rows already, changes made while the copy runs (updates that
leave TOAST values unchanged, key changes, deletes, a prepared transaction, a REPLICA
IDENTITY FULL table), a stop with SIGTERM, more changes, a restart up to an end position.
The Delta tables then equal ``SELECT *``, read with deltalake (no Spark), and so do the
current versions of the history (``--history``). ``pgdecode demo
--spark`` shows its mirrored tables."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.spark_fixtures import ACCOUNT_ROWS, LEDGER_ROWS, SCHEMA, assert_state_equals_tables
from support.streamkit import cli_env, run_cli, start_cli, stop_process, wait_for

from plugin_framework.spark import read_delta

pytestmark = pytest.mark.slow


def _confirmed_past(db: Any, slot: str, lsn: str) -> bool:
    rows = db.execute("SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                      "WHERE slot_name = %s", (lsn, slot))
    return bool(rows and rows[0][0])


def test_mirror_copies_then_follows_the_tables_into_delta(db: Any, tmp_path: Path) -> None:
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
        # the copy goes on after a stop, so it copies in key order: fulltab needs a key
        conn.execute("ALTER TABLE fulltab ADD PRIMARY KEY (a)")
        conn.execute(ACCOUNT_ROWS, (1, 2000))
        conn.execute(LEDGER_ROWS, (1, 3000))
        conn.execute("INSERT INTO fulltab SELECT g, 'b' || g FROM generate_series(1, 50) g")
    lake, slot = tmp_path / "lake", "mirror_slot"
    common = ["mirror", "-d", db.conninfo, "-S", slot, "--publication", "spark_pub",
              "--to", str(lake), "--format", "delta", "--history", "--max-delay", "1", "--master",
              "local[1]", "--spark-conf", "spark.ui.enabled=false"]
    log = tmp_path / "mirror.log"
    proc = start_cli([*common, "--create-slot", "--snapshot", "initial"], stderr_path=log,
                     new_session=True)
    try:
        wait_for(lambda: db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                                    (slot,)), timeout=120, what="the mirror's slot")
        with db.connect(autocommit=True) as conn:  # while the copy runs
            ex = conn.execute
            ex("UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0")  # TOAST kept
            ex("UPDATE accounts SET id = id + 10000 WHERE id % 10 = 1")  # key changes
            ex("DELETE FROM ledger WHERE id % 4 = 0")
            ex(LEDGER_ROWS, (3001, 4000))
            ex("INSERT INTO scratch SELECT g, 'v' || g FROM generate_series(1, 100) g")
            ex("BEGIN")
            ex(ACCOUNT_ROWS, (4001, 4100))
            ex("PREPARE TRANSACTION 'mirror-1'")
            ex("UPDATE fulltab SET b = b || 'x' WHERE a <= 20")
            ex("COMMIT PREPARED 'mirror-1'")
            lsn = str(conn.execute("SELECT pg_current_wal_insert_lsn()::text")
                      .fetchall()[0][0])
        wait_for(lambda: _confirmed_past(db, slot, lsn) or proc.poll() is not None,
                 timeout=300, interval=0.5, what="the mirror to catch up")
    finally:
        status = stop_process(proc, signal.SIGTERM, timeout=120)
    assert status == 0, log.read_text()[-3000:]
    assert_state_equals_tables(None, db, str(lake), delta=True)

    with db.connect(autocommit=True) as conn:  # while it is stopped
        conn.execute("UPDATE accounts SET note = note || '{\"later\": 1}' WHERE id < 500")
        conn.execute("DELETE FROM fulltab WHERE a > 40")
        conn.execute("TRUNCATE scratch")
        end = str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchall()[0][0])
    result = run_cli([*common, "-E", end], env=cli_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_state_equals_tables(None, db, str(lake), delta=True)
    # --history: its current versions are the tables too; the snapshot's rows are versions
    assert_state_equals_tables(None, db, str(lake / "_history"), history=True)
    ops = {v["_op"] for v in read_delta(str(lake / "_history"), "public.accounts")
           .to_pyarrow_table().to_pylist()}
    assert ops == {"SNAPSHOT", "UPDATE", "INSERT"}, ops


def test_mirror_into_parquet_by_default_says_its_batches_on_a_terminal(
        db: Any, tmp_path: Path) -> None:
    """The default format (Parquet: TableStateWriter) from an existing slot, run on a
    terminal as a user would, stopped with SIGTERM once it has everything: the status line
    counts the batches (no log line per batch), and the state equals the tables (read by
    pyarrow, without Spark)."""
    import os
    import pty
    import re
    import select
    import subprocess
    import time

    from support.streamkit import cli_command

    slot = "mirror_parquet"
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
    result = run_cli(["slot", "create", "-d", db.conninfo, "-S", slot, "--two-phase"])
    assert result.returncode == 0, result.stderr
    with db.connect(autocommit=True) as conn:
        ex = conn.execute
        for start in range(1, 1200, 100):
            ex(ACCOUNT_ROWS, (start, start + 99))
            ex(LEDGER_ROWS, (start, start + 99))
        ex("UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0")  # TOAST kept
        ex("UPDATE accounts SET id = id + 10000 WHERE id % 10 = 1")  # key changes
        ex("DELETE FROM ledger WHERE id % 4 = 0")
        ex("INSERT INTO fulltab SELECT g % 7, 'b' || g FROM generate_series(1, 50) g")
        ex("INSERT INTO scratch SELECT g, 'v' || g FROM generate_series(1, 100) g")
        end = str(ex("SELECT pg_current_wal_insert_lsn()::text").fetchall()[0][0])
    lake = tmp_path / "lake"
    primary, terminal = pty.openpty()
    proc = subprocess.Popen(
        cli_command("mirror", "-d", db.conninfo, "-S", slot, "--publication", "spark_pub",
                    "--to", str(lake), "--max-rows", "200", "--max-delay", "1", "--master",
                    "local[1]", "--spark-conf", "spark.ui.enabled=false"),
        env=cli_env(), stdout=subprocess.DEVNULL, stderr=terminal, start_new_session=True)
    os.close(terminal)
    shown, counts, stopping = b"", [0], False
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([primary], [], [], 1.0)[0]:
                try:
                    shown += os.read(primary, 65536)
                except OSError:  # the terminal's other side closed: the process ended
                    break
            counts = [int(n) for n in re.findall(rb"changes/s  (\d+) batches \(", shown)]
            # once the status line shows the batches of everything up to the end: stop
            if not stopping and counts and counts[-1] > 1 and _confirmed_past(db, slot, end):
                os.killpg(proc.pid, signal.SIGTERM)
                stopping = True
        status = proc.wait(timeout=120)
    finally:
        os.close(primary)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = shown.decode(errors="replace")
    assert stopping and status == 0, text[-3000:]
    assert b"pgdecode: INFO: batch" not in shown, text[-3000:]  # the status line says it
    assert_state_equals_tables(None, db, str(lake))


def test_mirror_backfills_a_table_while_it_runs(db: Any, tmp_path: Path) -> None:
    """A running `pgdecode mirror` (Parquet) made without a snapshot holds none of the rows
    that predate its slot; `pgdecode snapshot` asks it for one table's, while a writer
    inserts, updates, changes keys and deletes them: once the snapshot is done and the
    mirror has every change, the table's state equals SELECT *, and so does that of a table
    emptied and refilled meanwhile."""
    import threading

    from support.snapshotkit import change_later
    from support.spark_fixtures import state_rows, table_columns, table_rows

    slot = "mirror_later"
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(ACCOUNT_ROWS, (1, 300))
        conn.execute("CREATE TABLE later (id int PRIMARY KEY, v text, n numeric); "
                     "INSERT INTO later SELECT g, 'v' || g, g FROM generate_series(1, 30000) g")
    lake, log = tmp_path / "lake", tmp_path / "mirror.log"
    proc = start_cli(["mirror", "-d", db.conninfo, "-S", slot, "--publication", "spark_pub",
                      "--to", str(lake), "--create-slot", "--max-delay", "1", "--master",
                      "local[1]", "--spark-conf", "spark.ui.enabled=false"], stderr_path=log,
                     new_session=True)
    stop = threading.Event()
    writer = threading.Thread(target=change_later, args=(db.conninfo, stop, 7, 30000),
                              daemon=True)
    try:
        wait_for(lambda: db.execute("SELECT active FROM pg_replication_slots WHERE "
                                    "slot_name = %s", (slot,)) == [(True,)],
                 timeout=180, what="the mirror streaming")
        writer.start()
        db.execute("TRUNCATE accounts")  # (the other table the mirror lacks rows of)
        db.execute(ACCOUNT_ROWS, (301, 400))
        asked = run_cli(["snapshot", "-d", db.conninfo, "-S", slot, "--table", "later"])
        assert asked.returncode == 0, asked.stderr
        wait_for(lambda: "incremental snapshot of public.later done" in log.read_text()
                 or proc.poll() is not None, timeout=300, what="the snapshot done")
        stop.set()
        writer.join(30)
        lsn = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
        wait_for(lambda: _confirmed_past(db, slot, lsn) or proc.poll() is not None,
                 timeout=300, interval=0.5, what="the mirror to catch up")
    finally:
        stop.set()
        status = stop_process(proc, signal.SIGTERM, timeout=120)
    assert status == 0, log.read_text()[-3000:]
    assert "incremental snapshot of public.later done" in log.read_text()
    for table in ("public.later", "public.accounts"):
        rows = state_rows(None, str(lake), table, table_columns(db, table))
        assert Counter(rows) == table_rows(db, table), table


def test_mirror_keys_full_tables_by_their_primary_key(db: Any) -> None:
    """The keys mirror gives the sinks (-o keys): each published table's primary key, none
    for a table without one."""
    import argparse

    from plugin_framework.cli.commands import mirror_keys

    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("ALTER TABLE fulltab ADD PRIMARY KEY (a)")
        conn.execute("CREATE TABLE nokey (x int, y text)")
    keys = mirror_keys(argparse.Namespace(dbname=db.conninfo, publication=["spark_pub"],
                                          slot="s"))
    assert keys == {"public.accounts": ["id"], "public.ledger": ["id"],
                    "public.scratch": ["id"], "public.fulltab": ["a"], "public.nokey": []}


def test_mirror_refuses_a_remote_target_without_a_checkpoint() -> None:
    result = run_cli(["mirror", "-d", "dbname=x", "-S", "s", "--publication", "p", "--to",
                      "s3://bucket/lake"], timeout=60)
    assert result.returncode != 0
    assert "--checkpoint" in result.stderr


def test_demo_spark_shows_the_mirrored_tables(tmp_path: Path) -> None:
    result = run_cli(["demo", "--spark"], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "public.customers, as mirrored" in out and "public.orders, as mirrored" in out
    # Ada stays; Grace was deleted; Edsger's key changed from 3 to 30
    assert "Ada" in out and "Grace" not in out
    assert any(line.startswith("| 30|Edsger") for line in out.splitlines()), out
