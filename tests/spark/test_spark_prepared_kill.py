"""Prepared transactions into Spark batches, through SIGKILLs at every step of their way: a
two-phase slot streamed by ForeachBatchStream (tests/support/spark_prepared_runner.py), killed once
after the PREPAREs arrive, once after the COMMIT PREPAREDs, once inside fn, once after fn
returned, once after the checkpoint records the batch, once after the acknowledgement; each
round has an ordinary prepared transaction and one the server streams. Until the batch
holding a prepared transaction's rows is finished, the slot is never acknowledged past its
PREPARE (the server would not send its changes again); at the end every row is in the
batches exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.spark_prepared_runner import STEPS

from plugin_framework import LSN

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).parents[1] / "support" / "spark_prepared_runner.py"
TIMEOUT = 300
# rows of 4 kB of random text: some 240 kB, more than logical_decoding_work_mem (64kB)
STREAMED_ROWS = 60
RANDOM_TEXT = ("(SELECT string_agg(md5(random()::text || x || g), '') "
               "FROM generate_series(1, 128) x)")
BIG_ROWS = 600


def _lsn(db: Any, sql: str = "SELECT pg_current_wal_insert_lsn()::text") -> LSN:
    return LSN(db.execute(sql)[0][0])


def _confirmed(db: Any, slot: str) -> LSN:
    return _lsn(db, f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                    f"WHERE slot_name = '{slot}'")


def _round(db: Any, step: str, first: int) -> tuple[list[str], LSN, LSN, int]:
    """One round's transactions: a few inserts; two prepared transactions, one large enough
    for the server to stream it; a transaction of BIG_ROWS inserts, which fills a batch of
    its own while both are undecided; both committed. Returns the gids, the end of the
    first PREPARE, the end of the round and the next free id."""
    gids = [f"{step}_plain", f"{step}_streamed"]
    ids = iter(range(first, first + 5 + 5 + STREAMED_ROWS + BIG_ROWS + 1))
    insert = "INSERT INTO t SELECT g, %s, {} FROM generate_series(%s::int, %s::int) g"

    def rows(n: int, value: str = "'v'") -> None:
        taken = [next(ids) for _ in range(n)]
        conn.execute(insert.format(value), (step, taken[0], taken[-1]))

    with db.connect(autocommit=True) as conn:
        rows(5)
        conn.execute("BEGIN")
        rows(5)
        conn.execute(f"PREPARE TRANSACTION '{gids[0]}'")
        prepared = _lsn(db)  # past the PREPARE record
        conn.execute("BEGIN")
        rows(STREAMED_ROWS, RANDOM_TEXT)
        conn.execute(f"PREPARE TRANSACTION '{gids[1]}'")
        rows(BIG_ROWS)
        for gid in gids:
            conn.execute(f"COMMIT PREPARED '{gid}'")
    return gids, prepared, _lsn(db), next(ids)


def _start(db: Any, slot: str, work: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(RUNNER.parents[1]), str(RUNNER.parents[2]), os.environ.get("PYTHONPATH", "")]))
    log = open(work / f"run-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    return subprocess.Popen([sys.executable, str(RUNNER), "--dsn", db.conninfo, "--slot", slot,
                             "--work", str(work), *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _until(proc: subprocess.Popen[bytes], work: Path, what: str, done: Any) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not done():
        if proc.poll() is not None:
            logs = "\n".join(p.read_text(errors="replace")[-3000:]
                             for p in sorted(work.glob("run-*.log")))
            pytest.fail(f"the runner exited ({proc.returncode}) before {what}:\n{logs}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"not {what} within {TIMEOUT} s")
        time.sleep(0.1)


def _kill(db: Any, slot: str, proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                     (slot,))[0][0]:
        assert time.monotonic() < deadline, "the killed runner's walsender did not go away"
        time.sleep(0.1)


@pytest.mark.soak
def test_prepared_transactions_killed_at_every_step_reach_the_batches_once(
        db: Any, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, round text, v text);"
               "CREATE PUBLICATION p FOR TABLE t")
    slot = f"{db.dbname}_prep"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
               (slot,))
    first = 1
    for step in STEPS:
        gids, prepared, end, first = _round(db, step, first)
        (tmp_path / "killme").unlink(missing_ok=True)
        # at the first two steps the prepared transactions' rows wait in a batch after one
        # of BIG_ROWS went out; at the others each transaction makes a batch
        max_rows = str(BIG_ROWS) if step in ("prepared", "committed") else "1"
        proc = _start(db, slot, tmp_path, "--step", step, "--gids", ",".join(gids),
                      "--max-rows", max_rows)
        try:
            _until(proc, tmp_path, f"at step {step}", (tmp_path / "killme").exists)
            if step == "acknowledged":
                # acknowledgements do go out once the batch is finished
                _until(proc, tmp_path, "acknowledged",
                       lambda end=end: _confirmed(db, slot) >= end)
            else:
                time.sleep(1.0)  # ten status intervals: whatever the runner acknowledges, it has
                confirmed = _confirmed(db, slot)
                if step != "batch_committed":
                    assert confirmed < prepared, (
                        f"at {step}, the slot was acknowledged to {confirmed}, past the "
                        f"PREPARE ending at {prepared} of a transaction no finished batch "
                        "holds")
        finally:
            _kill(db, slot, proc)

    proc = _start(db, slot, tmp_path, "--endpos", str(_lsn(db)), "--max-rows", "1000")
    try:
        _until(proc, tmp_path, "done", (tmp_path / "done").exists)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            _kill(db, slot, proc)

    rows = [json.loads(line) for path in sorted((tmp_path / "out").glob("batch-*.jsonl"))
            for line in path.read_text().splitlines()]
    changes = [(r["commit_lsn"], r["seq"]) for r in rows]
    assert len(changes) == len(set(changes)), "a change delivered in two batches"
    ids = sorted(r["id"] for r in rows)
    assert ids == [i for (i,) in db.execute("SELECT id FROM t ORDER BY id")]
    assert ids == list(range(1, first))
    prepared = {r["gid"] for r in rows if r["gid"] is not None}
    assert prepared == {f"{step}_{kind}" for step in STEPS for kind in ("plain", "streamed")}
    streamed = db.execute("SELECT stream_txns FROM pg_stat_replication_slots "
                          "WHERE slot_name = %s", (slot,))[0][0]
    assert streamed >= len(STEPS), "the server streamed no transaction"
    batches = sorted(int(p.stem.removeprefix("batch-")) for p in (tmp_path / "out").iterdir())
    assert batches == list(range(len(batches)))
