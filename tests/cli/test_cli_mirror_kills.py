"""``pgdecode mirror`` through SIGKILLs, on each server version, as a user runs it: tables
that hold rows already (one with out-of-line TOAST values that updates leave unchanged, one
REPLICA IDENTITY FULL keyed by a unique NOT NULL column, one partitioned and published
through its root), a random writer throughout (key-change chains, prepared transactions
committed and rolled back, transactions large enough for the server to stream, TRUNCATE
and insert again, and, now and then, an ALTER TABLE: a column added with a default, a
numeric column retyped to integer, a column renamed, one dropped and another added), the
mirror killed with SIGKILL during the copy and during the stream,
started again each time, then run up to an end position (the documented catch-up). Each
mirror (Parquet; Delta with its history) then equals ``SELECT *`` value by value, the
history's chains are whole, and the checkpoint says the mirror equals the source."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.mirror_workload import assert_chains
from support.spark_fixtures import delta_rows, state_rows, table_columns, table_rows
from support.streamkit import current_lsn, run_cli, start_cli, wait_for

from plugin_framework.spark import read_delta
from plugin_framework.spark.foreachbatch.checkpoint import Checkpoint
from plugin_framework.spark.mirrors.deltatables import delta_arrow

pytestmark = pytest.mark.slow

TABLES = ("public.k", "public.f", "public.part")
SCHEMA = """
CREATE TABLE k (id int PRIMARY KEY, v int, big text, note text);
ALTER TABLE k ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE f (u int NOT NULL UNIQUE, v text, big text);
ALTER TABLE f ALTER COLUMN big SET STORAGE EXTERNAL;
ALTER TABLE f REPLICA IDENTITY FULL;
CREATE TABLE part (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
CREATE TABLE part_lo PARTITION OF part FOR VALUES FROM (MINVALUE) TO (5000);
CREATE TABLE part_hi PARTITION OF part FOR VALUES FROM (5000) TO (MAXVALUE);
INSERT INTO k SELECT g, g, CASE WHEN g % 50 = 0 THEN (SELECT string_agg(md5(g::text || i),
    '') FROM generate_series(1, 100) i) END, 'n' || g FROM generate_series(1, 8000) g;
INSERT INTO f SELECT g, 'f' || g, CASE WHEN g % 10 = 0 THEN (SELECT string_agg(
    md5(g::text || i), '') FROM generate_series(1, 100) i) END FROM generate_series(1, 500) g;
INSERT INTO part SELECT g * 3, 'p' || g FROM generate_series(1, 3000) g;
CREATE PUBLICATION p FOR TABLE k, f, part WITH (publish_via_partition_root = true);
"""
ALTERS = (  # of k, by columns the writer's statements do not name
    "ALTER TABLE k ADD COLUMN d int DEFAULT 42",
    "ALTER TABLE k ADD COLUMN amount numeric(10,2) DEFAULT 2.5",
    "ALTER TABLE k ALTER COLUMN amount TYPE int",
    "ALTER TABLE k RENAME COLUMN d TO d2",
    "ALTER TABLE k DROP COLUMN d2",
    "ALTER TABLE k ADD COLUMN d3 text",
)
ALTER_EVERY = 150  # writer steps
BIG = "(SELECT string_agg(md5(random()::text || i), '') FROM generate_series(1, 100) i)"


class Writer(threading.Thread):
    """Random small transactions on the three tables until stopped."""

    def __init__(self, conninfo: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.random = conninfo, random.Random(seed)
        self.done = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.done.is_set():
                    self.step(conn.execute, self.ops)
                    self.ops += 1
                    if self.ops % ALTER_EVERY == 0 and self.ops // ALTER_EVERY <= len(ALTERS):
                        conn.execute(ALTERS[self.ops // ALTER_EVERY - 1])
                    time.sleep(0.01)
        except BaseException as exc:
            self.error = exc

    def step(self, ex: Any, n: int) -> None:
        r = self.random
        k = r.randint(1, 8000)
        choice = r.randrange(12)
        if choice == 0:  # TOAST left out
            ex("UPDATE k SET v = v + 1 WHERE id = %s", (50 * r.randint(1, 160),))
        elif choice == 1:  # key changes, chains by chance
            ex("UPDATE k SET id = id + 100000 WHERE id = %s", (k,))
        elif choice == 2:
            ex("UPDATE k SET id = id - 100000 WHERE id = %s "
               "AND NOT EXISTS (SELECT FROM k WHERE id = %s)", (k + 100000, k))
        elif choice == 3:
            ex("DELETE FROM k WHERE id = %s", (k,))
        elif choice == 4:
            ex(f"INSERT INTO k VALUES (%s, 0, {BIG}, 'i') ON CONFLICT DO NOTHING",
               (200000 + n,))
        elif choice == 5:  # FULL: TOAST left out (the old row has it)
            ex("UPDATE f SET v = v || 'x' WHERE u = %s", (r.randint(1, 500),))
        elif choice == 6:
            ex("UPDATE part SET id = id + 9000 WHERE id = %s", (3 * r.randint(1, 3000),))
        elif choice in (7, 8):  # prepared: committed or rolled back
            ex("BEGIN")
            ex("UPDATE k SET note = 'prepared' WHERE id = %s", (k,))
            ex("INSERT INTO part VALUES (%s, 'prep') ON CONFLICT DO NOTHING", (-n,))
            gid = f"kills_{n}"
            ex(f"PREPARE TRANSACTION '{gid}'")
            ex(f"{'COMMIT' if choice == 7 else 'ROLLBACK'} PREPARED '{gid}'")
        elif choice == 9 and r.random() < 0.2:  # large: streamed by the server
            with ex.__self__.transaction():
                ex("UPDATE k SET note = note || '+' WHERE id %% 10 = %s", (r.randrange(10),))
        elif choice == 10 and r.random() < 0.05:  # TRUNCATE and insert again
            with ex.__self__.transaction():
                ex("TRUNCATE part")
                ex("INSERT INTO part SELECT g * 7, 't' || g FROM generate_series(1, 200) g")
        else:
            ex("INSERT INTO f VALUES (%s, 'n', NULL) ON CONFLICT DO NOTHING", (1000 + n,))


def _commits(checkpoint: Path) -> int:
    return len(list((checkpoint / "commits").glob("[0-9]*"))) if checkpoint.exists() else 0


def _state(checkpoint: Path) -> str | None:
    try:
        state = json.loads((checkpoint / "snapshot").read_text())["state"]
    except (OSError, ValueError, KeyError):
        return None
    return str(state)


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
@pytest.mark.soak
def test_mirrors_killed_during_the_copy_and_the_stream_equal_the_tables(
        db: Any, env: dict[str, str], tmp_path: Path, fmt: str) -> None:
    db.execute(SCHEMA)
    lake, slot = tmp_path / "lake", f"{db.dbname}_kills"
    checkpoint = lake / "_pgdecode_checkpoint"
    command = ["mirror", "-d", db.conninfo, "-S", slot, "--publication", "p", "--to", str(lake),
               "--format", fmt, "--max-rows", "1000", "--max-delay", "0.5", "--master",
               "local[1]", "--spark-conf", "spark.ui.enabled=false"]
    if fmt == "delta":
        command.append("--history")
    first = [*command, "--create-slot", "--snapshot", "initial"]
    rng = random.Random(db.major_version)
    writer = Writer(db.conninfo, seed=db.major_version)
    log = tmp_path / "mirror.log"
    killed_during = []
    try:
        for attempt in range(3):
            proc = start_cli(first, env=env, stderr_path=log, new_session=True)
            try:
                if attempt == 0:
                    # killed once some batches of the copy are in the mirror
                    wait_for(lambda proc=proc: proc.poll() is not None
                             or _commits(checkpoint) >= 2,
                             timeout=300, interval=0.05, what="some of the copy delivered")
                    writer.start()
                else:
                    target = _commits(checkpoint) + rng.randint(1, 3)
                    wait_for(lambda proc=proc, target=target: proc.poll() is not None
                             or _commits(checkpoint) >= target,
                             timeout=300, interval=0.05, what="more batches")
                assert proc.poll() is None, log.read_text()[-3000:]
                killed_during.append(_state(checkpoint))
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            wait_for(lambda: not db.execute("SELECT active FROM pg_replication_slots "
                                            "WHERE slot_name = %s", (slot,))[0][0],
                     timeout=60, what="the killed mirror's walsender gone")
        wait_for(lambda: writer.ops >= ALTER_EVERY * len(ALTERS) or writer.error is not None,
                 timeout=600, what="every ALTER TABLE made")
        writer.done.set()
        writer.join(60)
        assert writer.error is None, writer.error
    finally:
        writer.done.set()
    assert killed_during[0] in ("copying", "incremental"), killed_during
    end = current_lsn(db.conninfo)
    # the documented catch-up: the same command, to an end position
    result = run_cli([*first, "-E", str(end)], env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]

    assert table_columns(db, "public.k") == ["id", "v", "big", "note", "amount", "d3"]
    for table in TABLES:
        columns = table_columns(db, table)
        expected = table_rows(db, table)
        mirrors = {"delta": delta_rows(str(lake), table, columns),
                   "history": delta_rows(str(lake / "_history"), table, columns, history=True)
                   } if fmt == "delta" else {"parquet": state_rows(None, str(lake), table,
                                                                     columns)}
        for name, got in mirrors.items():
            missing, extra = expected - Counter(got), Counter(got) - expected
            assert not missing and not extra, (
                f"{name} {table}: {len(missing)} rows missing (e.g. {sorted(missing)[:1]}), "
                f"{len(extra)} not in the table (e.g. {sorted(extra)[:1]})")
    if fmt == "delta":
        versions = delta_arrow(read_delta(str(lake / "_history"), "public.k")).to_pylist()
        assert_chains(versions, "id")
    done = Checkpoint(checkpoint)
    assert done.snapshot_state == "done"
    assert done.consistent is not None, "the mirror does not say it equals the source"
    streamed = db.execute("SELECT stream_txns FROM pg_stat_replication_slots "
                          "WHERE slot_name = %s", (slot,))[0][0]
    assert streamed > 0, "the server streamed no transaction"
