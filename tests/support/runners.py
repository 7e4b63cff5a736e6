"""The scripts of tests/support/ that a test runs as a process of its own and kills with
SIGKILL (spark_fixtures.py for test_spark_recovery.py, merge_runner.py for
test_spark_mergeinto.py): started in a process group of their own (killed whole) with tests/
and the repository on PYTHONPATH, waited on until they touch a file of their work directory
(``killme``, ``done``), and their slot waited free after a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parents[1]
TIMEOUT = 420


def start_runner(args: list[str], work: Path) -> subprocess.Popen[bytes]:
    """A pipeline process of its own process group (killed whole), logging to work."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]))
    log = open(work / f"run-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def wait_runner(proc: subprocess.Popen[bytes], work: Path, what: str) -> None:
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


def wait_slot_free(db: Any, slot: str) -> None:
    deadline = time.monotonic() + 60
    while db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                     (slot,))[0][0]:
        assert time.monotonic() < deadline, "the killed pipeline's walsender did not go away"
        time.sleep(0.1)
