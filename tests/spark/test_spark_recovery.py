"""The Spark ways in, end to end, with a crash: about 20,000 changes streamed into Parquet
(change log and table state) and Delta (table state and history) by a pipeline process that
is killed with SIGKILL in the middle of a batch (between two tables of the Delta state) and
started again. The states and the history's current versions must equal the tables, row for
row, and the change log must hold every change exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.runners import start_runner, wait_runner, wait_slot_free
from support.spark_fixtures import (
    assert_changelog_complete,
    assert_state_equals_tables,
    end_lsn,
    run_big_workload,
    setup_big,
    spark_session,  # noqa: F401  (the fixture "spark")
)

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).parents[1] / "support" / "spark_fixtures.py"


def _start(way: str, db: Any, slot: str, work: Path, *, endpos: str | None,
           kill_at: int | None, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(RUNNER), way, "--dsn", db.conninfo, "--slot", slot,
            "--work", str(work), *extra]
    if endpos is not None:
        args += ["--endpos", endpos]
    if kill_at is not None:
        args += ["--kill-at", str(kill_at)]
    return start_runner(args, work)


@pytest.mark.parametrize("way", ["emitter", "source"])
@pytest.mark.soak
def test_kill_mid_batch_then_restart_gives_the_tables(way: str, db: Any, spark: Any,
                                                      tmp_path: Path) -> None:
    slot, ref = f"{db.dbname}_{way}", f"{db.dbname}_ref"
    setup_big(db, (slot, ref))
    with db.connect(autocommit=True) as conn:
        run_big_workload(conn)
    endpos = end_lsn(db)
    work = tmp_path

    proc = _start(way, db, slot, work, endpos=endpos, kill_at=1)
    wait_runner(proc, work, "killme")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (work / "done").exists()
    wait_slot_free(db, slot)

    proc = _start(way, db, slot, work, endpos=endpos, kill_at=None)
    wait_runner(proc, work, "done")
    assert proc.wait(60) == 0

    batches = [int(x) for x in (work / "batches").read_text().split()]
    assert batches[:2] == [0, 1] and batches[2] == 1, batches  # batch 1 delivered again
    assert batches[2:] == list(range(1, batches[-1] + 1))
    assert_state_equals_tables(spark, db, str(work / "state"))
    assert_state_equals_tables(spark, db, str(work / "delta"), delta=True)
    assert_state_equals_tables(spark, db, str(work / "history"), history=True)
    assert_changelog_complete(spark, db, str(work / "log"), ref)


@pytest.mark.soak
def test_random_workload_with_kill_9s_gives_the_tables_and_their_history(
        db: Any, tmp_path: Path) -> None:
    """test_spark_mirror's random workload (key-change chains, TOAST kept, TRUNCATE, a FULL
    table, two-phase commits and rollbacks, streamed transactions, ALTER TABLEs) in batches
    of 25 changes, the pipeline killed with SIGKILL in three batches chosen at random
    (between two tables of the Delta state), started again each time: the Delta state equals
    the tables, and the history their states after each transaction; so do the Parquet
    state and the change log (each change once), written before the kills in each batch."""
    import random

    from support.mirror_workload import SCHEMA as MIRROR_SCHEMA
    from support.mirror_workload import (
        assert_history,
        assert_mirrored,
        assert_took_both_ways,
        run_workload,
    )
    from support.spark_fixtures import table_rows as rows_of

    with db.connect(autocommit=True) as conn:
        conn.execute(MIRROR_SCHEMA)
    slot, ref = f"{db.dbname}_rk", f"{db.dbname}_rk_ref"
    for name in (slot, ref):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (name,))
    points: list[tuple[int, Counter[Any], Counter[Any]]] = []

    def record() -> None:
        lsn = db.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0]
        points.append((int(lsn), rows_of(db, "public.m_pk"), rows_of(db, "public.m_full")))

    with db.connect(autocommit=True) as conn:
        made = run_workload(conn, seed=9, transactions=60, record=record)
    assert made.prepared and made.rolled_back and made.large, vars(made)
    endpos = end_lsn(db)
    extra = ["--publication", "mirror_pub", "--max-rows", "25"]
    kills = sorted(random.Random(db.major_version).sample(range(1, 6), 3))
    for kill_at in kills:
        (tmp_path / "killme").unlink(missing_ok=True)
        proc = _start("emitter", db, slot, tmp_path, endpos=endpos, kill_at=kill_at,
                      extra=extra)
        wait_runner(proc, tmp_path, "killme")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_slot_free(db, slot)
    proc = _start("emitter", db, slot, tmp_path, endpos=endpos, kill_at=None, extra=extra)
    wait_runner(proc, tmp_path, "done")
    assert proc.wait(60) == 0
    batches = [int(x) for x in (tmp_path / "batches").read_text().split()]
    assert all(k in batches for k in kills) and batches[-1] > kills[-1], (kills, batches)
    assert_took_both_ways(db, slot)
    assert_mirrored(None, db, str(tmp_path / "delta"), delta=True)
    assert_history(db, str(tmp_path / "history"), points)
    assert_mirrored(None, db, str(tmp_path / "state"))  # the Parquet state (read by pyarrow)
    assert_changelog_complete(None, db, str(tmp_path / "log"), ref, "mirror_pub")

