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
import time
from pathlib import Path
from typing import Any

import pytest
from spark_fixtures import (
    assert_changelog_complete,
    assert_state_equals_tables,
    end_lsn,
    run_big_workload,
    setup_big,
    spark_session,  # noqa: F401  (the fixture "spark")
)

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("spark_fixtures.py")
TIMEOUT = 420


def _start(way: str, db: Any, slot: str, work: Path, *, endpos: str | None,
           kill_at: int | None) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(RUNNER), way, "--dsn", db.conninfo, "--slot", slot,
            "--work", str(work)]
    if endpos is not None:
        args += ["--endpos", endpos]
    if kill_at is not None:
        args += ["--kill-at", str(kill_at)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(RUNNER.parent), str(RUNNER.parent.parent), os.environ.get("PYTHONPATH", "")]))
    log = open(work / f"run-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _wait(proc: subprocess.Popen[bytes], work: Path, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not (work / what).exists():
        if proc.poll() is not None:
            logs = "\n".join(p.read_text(errors="replace")[-3000:]
                             for p in sorted(work.glob("run-*.log")))
            pytest.fail(f"the pipeline exited ({proc.returncode}) before {what}:\n{logs}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {TIMEOUT} s")
        time.sleep(0.2)


def _wait_slot_free(db: Any, slot: str) -> None:
    deadline = time.monotonic() + 60
    while db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                     (slot,))[0][0]:
        assert time.monotonic() < deadline, "the killed pipeline's walsender did not go away"
        time.sleep(0.1)


@pytest.mark.parametrize("way", ["emitter", "source"])
def test_kill_mid_batch_then_restart_gives_the_tables(way: str, db: Any, spark: Any,
                                                      tmp_path: Path) -> None:
    slot, ref = f"{db.dbname}_{way}", f"{db.dbname}_ref"
    setup_big(db, (slot, ref))
    with db.connect(autocommit=True) as conn:
        run_big_workload(conn)
    endpos = end_lsn(db)
    work = tmp_path

    proc = _start(way, db, slot, work, endpos=endpos, kill_at=1)
    _wait(proc, work, "killme")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (work / "done").exists()
    _wait_slot_free(db, slot)

    proc = _start(way, db, slot, work, endpos=endpos, kill_at=None)
    _wait(proc, work, "done")
    assert proc.wait(60) == 0

    batches = [int(x) for x in (work / "batches").read_text().split()]
    assert batches[:2] == [0, 1] and batches[2] == 1, batches  # batch 1 delivered again
    assert batches[2:] == list(range(1, batches[-1] + 1))
    assert_state_equals_tables(spark, db, str(work / "state"))
    assert_state_equals_tables(spark, db, str(work / "delta"), delta=True)
    assert_state_equals_tables(spark, db, str(work / "history"), history=True)
    assert_changelog_complete(spark, db, str(work / "log"), ref)
