"""``pgdecode stream`` under faults, on each server version: the consumer killed with SIGKILL
in the middle of a large transaction and restarted, a prepared transaction pending across
that, the server restarted under it, an idle slot, signals, and the errors a real server
produces, each reading as promised (what went wrong, and what to do)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.streamkit import (
    Probe,
    StreamProbe,
    committed_xids,
    confirmed_flush,
    create_slot,
    current_lsn,
    query,
    read_lines,
    run_cli,
    slot_row,
    start_cli,
    stop_process,
    table_ids,
    wait_for,
    wait_slot_inactive,
)

from plugin_framework import LSN, FileOutput, Pipeline
from plugin_framework.cluster import LocalCluster
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.walsender import WalsenderSource

BIG = 50_000  # rows in the large transaction the consumer is killed in


@pytest.fixture
def own_cluster(pg: LocalCluster) -> Iterator[LocalCluster]:
    """A server of the same version as ``pg``, of this test's own, to restart or break."""
    cluster = LocalCluster(pg.bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


def make_table(conninfo: str) -> None:
    query(conninfo, "CREATE TABLE t (id int PRIMARY KEY, v text); "
                    "CREATE TABLE unpub (id int PRIMARY KEY); "
                    "CREATE PUBLICATION pub FOR TABLE t")


def insert(conninfo: str, first: int, last: int, tag: str = "x") -> None:
    query(conninfo, "INSERT INTO t SELECT g, %s || g FROM generate_series(%s::int, %s::int) g",
          (tag, first, last))


def small_transactions(conninfo: str, first: int, count: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for i in range(first, first + count):
            conn.execute("INSERT INTO t VALUES (%s, 'small')", (i,))


def check_exactly_once(conninfo: str, lines: list[dict[str, Any]]) -> None:
    xids = committed_xids(lines)
    twice = [x for x, n in Counter(xids).items() if n > 1]
    assert not twice, f"transactions delivered twice: {twice}"
    ids = [int(ln["new"]["id"]) for ln in lines if ln["cb"] == "change"]
    again = [i for i, n in Counter(ids).items() if n > 1]
    assert not again, f"{len(again)} rows delivered twice, e.g. {again[:5]}"
    assert sorted(ids) == table_ids(conninfo, "t")


def wait_for_ack(conninfo: str, slot: str, lsn: LSN, timeout: float = 120) -> None:
    wait_for(lambda: confirmed_flush(conninfo, slot) >= lsn, timeout,
             what=f"slot {slot} acknowledged to {lsn}")


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# --- 0: the connection lost in a large transaction -------------------------------------------


class CutsConnection(Probe):
    """Terminates its own walsender once, at the given change of the first transaction."""

    name = "cuts-connection"

    def __init__(self, conninfo: str, slot: str, at: int) -> None:
        self.conninfo, self.slot, self.at, self.seen = conninfo, slot, at, 0

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        super().change(ctx, txn, relation, change)
        self.seen += 1
        if self.seen == self.at:
            query(self.conninfo, "SELECT pg_terminate_backend(active_pid) "
                                 "FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))


def test_connection_lost_in_a_transaction_leaves_it_in_the_file_once(
        db: Any, tmp_path: Path) -> None:
    """The server sends the transaction again from its start after the reconnect: the
    lines already written of the first, partial copy are taken back from the file."""
    conninfo = db.conninfo
    make_table(conninfo)
    create_slot(conninfo, "s")
    # One transaction, not streamed (streaming off below), of more than the socket buffers
    # between server and client hold (~8 MB of pgoutput): the cut comes while it is sent.
    rows = 150_000
    insert(conninfo, 1, rows)
    small_transactions(conninfo, rows + 1, 3)
    end = current_lsn(conninfo)
    out = tmp_path / "out.jsonl"
    pipeline = Pipeline()
    cutter = CutsConnection(conninfo, "s", 1_000)
    pipeline.add(cutter, output=FileOutput(str(out)))
    source = WalsenderSource(SourceConfig(conninfo, "s", ["pub"], streaming="off",
                                          max_backoff=0.2, endpos=end), pipeline)
    try:
        source.run()
    finally:
        pipeline.shutdown()
    assert source.progress.reconnects >= 1
    assert cutter.seen > rows, "the whole transaction arrived before the connection was cut"
    check_exactly_once(conninfo, read_lines(out))


def applied_stream_ids(lines: list[dict[str, Any]]) -> list[int]:
    """The t ids a subscriber applying a stream probe's lines would have: stream blocks held
    per transaction, dropped at stream_abort, applied at stream_commit. Every stream in the
    file must end (a subscriber would hold an unended one forever)."""
    pending: dict[int, list[int]] = {}
    applied: list[int] = []
    for ln in lines:
        if ln["cb"] == "stream_change":
            pending.setdefault(ln["xid"], []).append(int(ln["new"]["id"]))
        elif ln["cb"] == "stream_abort" and ln["subxid"] == ln["xid"]:
            pending.pop(ln["xid"], None)
        elif ln["cb"] == "stream_commit":
            applied += pending.pop(ln["xid"], [])
        elif ln["cb"] == "change":
            applied.append(int(ln["new"]["id"]))
    assert not pending, f"streams without an end: {sorted(pending)}"
    return applied


def test_stream_left_open_by_a_stop_is_aborted_before_it_comes_again(
        db: Any, tmp_path: Path) -> None:
    """A run stops (here at --endpos) while a large transaction is still being streamed:
    its first blocks are in the file, made durable by a later commit. The next run gets the
    transaction again from its start (whole: the server streams nothing it decodes before
    the slot's confirmed position); the old blocks are aborted first, so the file ends every
    stream and applies the transaction once."""
    conninfo = db.conninfo
    make_table(conninfo)
    create_slot(conninfo, "s")
    out = tmp_path / "out.jsonl"

    def run_to(end: LSN) -> None:
        pipeline = Pipeline(slot_name="s")
        pipeline.add(StreamProbe(), output=FileOutput(str(out)))
        source = WalsenderSource(SourceConfig(conninfo, "s", ["pub"], endpos=end), pipeline)
        try:
            source.run()
        finally:
            pipeline.shutdown()

    with psycopg.connect(conninfo, autocommit=True) as big:
        big.execute("BEGIN")
        big.execute("INSERT INTO t SELECT g, 'big' FROM generate_series(1, 5000) g")
        small_transactions(conninfo, 10_001, 1)  # commits while the big one is open
        run_to(current_lsn(conninfo))
        assert any(ln["cb"] == "stream_change" for ln in read_lines(out)), "not streamed"
        big.execute("COMMIT")
    run_to(current_lsn(conninfo))
    applied = applied_stream_ids(read_lines(out))
    assert sorted(applied) == table_ids(conninfo, "t")


# --- 1, 2: SIGKILL of the consumer in a large transaction, and restart -------------------------


@pytest.mark.slow
@pytest.mark.parametrize("where", ["first", "after-others"])
@pytest.mark.parametrize("streaming", ["on", "off"])
@pytest.mark.soak
def test_kill9_in_large_transaction_then_restart(db: Any, env: dict[str, str], tmp_path: Path,
                                                 where: str, streaming: str) -> None:
    make_table(db.conninfo)
    slot = f"{db.dbname}_k"
    create_slot(db.conninfo, slot)
    out = tmp_path / "out"
    command = ["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub", "--emitter",
               "probe", "-f", str(out), "--status-interval", "0.2", "--streaming", streaming]
    stderr = tmp_path / "stderr"
    if where == "after-others":
        small_transactions(db.conninfo, 1, 50)
    insert(db.conninfo, 1000, 1000 + BIG - 1, "big")
    small_transactions(db.conninfo, 100, 50)

    proc = start_cli(command, env=env, stderr_path=stderr)
    try:
        before = 5000 if where == "after-others" else 0
        # Killed while it writes the large transaction: past what came before, short of all.
        wait_for(lambda: size(out) > before + 200_000 or proc.poll() is not None, timeout=120,
                 interval=0.01, what="output of the large transaction")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    acked_at_kill = confirmed_flush(db.conninfo, slot)
    killed_size = size(out)
    durable = json.loads(Path(f"{out}.progress").read_text())
    # It died in the middle of a transaction's output: the file has a torn tail.
    assert killed_size > durable["size"]
    wait_slot_inactive(db.conninfo, slot)

    # Restarted: it carries on, with more coming in while it runs.
    proc = start_cli(command, env=env, stderr_path=stderr)
    try:
        small_transactions(db.conninfo, 200, 20)
        wait_for_ack(db.conninfo, slot, current_lsn(db.conninfo))
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    lines = read_lines(out)
    check_exactly_once(db.conninfo, lines)
    # What the server had been told was durable is in the file, before anything after it.
    acked = [ln for ln in lines if ln["cb"] == "commit" and LSN(ln["end_lsn"]) <= acked_at_kill]
    assert len(acked) == len({ln["xid"] for ln in acked})


def prepared_across_kill9(db: Any, env: dict[str, str], tmp_path: Path,
                          two_phase_slot: bool) -> Path:
    """PREPARE before the consumer is killed in a large transaction, COMMIT PREPARED after it
    was restarted; returns the output file (FILE.EMITTER each when there are two)."""
    make_table(db.conninfo)
    slot = f"{db.dbname}_p"
    out = tmp_path / "out"
    emitters = ["--emitter", "probe"]
    if two_phase_slot:
        emitters += ["--emitter", "probe-2pc"]  # asks the server for two-phase decoding
    command = ["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub", *emitters,
               "-f", str(out), "--status-interval", "0.2", "--create-slot"]
    if two_phase_slot:
        command.append("--two-phase")
    plain = Path(f"{out}.probe") if two_phase_slot else out
    stderr = tmp_path / "stderr"

    proc = start_cli(command, env=env, stderr_path=stderr)
    try:
        wait_for(lambda: slot_row(db.conninfo, slot), what="slot created")
        small_transactions(db.conninfo, 1, 10)
        with db.connect(autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t SELECT g, 'prepared' FROM generate_series(-100, -1) g")
            conn.execute("PREPARE TRANSACTION 'pending'")
        after_prepare = current_lsn(db.conninfo)
        if two_phase_slot:
            # The two-phase plugin has the PREPARE, durably.
            progress = Path(f"{out}.probe-2pc.progress")  # written at its first flush
            wait_for(lambda: progress.exists()
                     and LSN(json.loads(progress.read_text())["lsn"]) >= after_prepare,
                     what="the PREPARE in the two-phase plugin's file")
        insert(db.conninfo, 1000, 1000 + BIG - 1, "big")
        wait_for(lambda: size(plain) > 300_000, timeout=120, interval=0.01,
                 what="output of the large transaction")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if two_phase_slot:
        # The plain plugin waits for the COMMIT PREPARED: its file holds the transaction
        # (FILE.hold), so the slot could be acknowledged past the PREPARE.
        assert list(Path(f"{plain}.hold").glob("*.hold"))
    wait_slot_inactive(db.conninfo, slot)

    proc = start_cli(command, env=env, stderr_path=stderr)
    try:
        wait_for(lambda: (slot_row(db.conninfo, slot) or {}).get("active"), what="restart")
        small_transactions(db.conninfo, 100, 10)
        query(db.conninfo, "COMMIT PREPARED 'pending'")
        small_transactions(db.conninfo, 200, 10)
        wait_for_ack(db.conninfo, slot, current_lsn(db.conninfo))
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("two_phase_slot", [True, False], ids=["two-phase-slot", "plain-slot"])
@pytest.mark.soak
def test_prepared_transaction_pending_across_kill9(db: Any, env: dict[str, str],
                                                   tmp_path: Path, two_phase_slot: bool) -> None:
    """A plugin without two-phase callbacks gets the transaction once, at COMMIT PREPARED;
    with a two-phase slot the server sends the PREPARE, and the plugin's file holds the
    transaction across the restart (FILE.hold)."""
    out = prepared_across_kill9(db, env, tmp_path, two_phase_slot)
    lines = read_lines(f"{out}.probe" if two_phase_slot else out)
    check_exactly_once(db.conninfo, lines)
    prepared_xids = {ln["xid"] for ln in lines
                     if ln["cb"] == "change" and ln["new"]["v"] == "prepared"}
    assert len(prepared_xids) == 1
    (xid,) = prepared_xids
    # Delivered at COMMIT PREPARED: after the transactions committed before that.
    order = committed_xids(lines)
    committed_before = {ln["xid"] for ln in lines if ln["cb"] == "change"
                        and 100 <= int(ln["new"]["id"]) < 110}
    assert committed_before
    assert all(order.index(x) < order.index(xid) for x in committed_before)


@pytest.mark.slow
def test_two_phase_plugin_gets_commit_prepared_after_restart(db: Any, env: dict[str, str],
                                                             tmp_path: Path) -> None:
    """Beside the plain plugin, a two-phase plugin got the PREPARE before the kill; after
    the restart (whether or not the server sends the PREPARE again, as it does when the
    acknowledgement had not passed it yet) it gets the COMMIT PREPARED, each once."""
    out = prepared_across_kill9(db, env, tmp_path, two_phase_slot=True)
    two_phase = read_lines(f"{out}.probe-2pc")
    events = [(ln["cb"], ln.get("gid")) for ln in two_phase
              if ln["cb"] in ("begin_prepare", "prepare", "commit_prepared")]
    assert events == [("begin_prepare", "pending"), ("prepare", "pending"),
                      ("commit_prepared", "pending")]


@pytest.mark.slow
@pytest.mark.parametrize("before,after", [("probe", "probe-2pc"), ("probe-2pc", "probe")],
                         ids=["two-phase-switched-on", "two-phase-switched-off"])
def test_switching_two_phase_for_a_file_is_refused(db: Any, env: dict[str, str],
                                                   tmp_path: Path, before: str,
                                                   after: str) -> None:
    """A file written with prepared transactions taken one way, resumed with a plugin that
    takes them the other way, while one is pending: switched on, the PREPARE
    the earlier run held back lies before the file's resume LSN and was dropped; switched
    off, the server sends only the COMMIT PREPARED of one the file has at PREPARE. Refused
    before anything is touched; the earlier setting then finishes it exactly once."""
    make_table(db.conninfo)
    slot = f"{db.dbname}_sw"
    out = tmp_path / "out"
    progress = Path(f"{out}.progress")
    stderr = tmp_path / "stderr"

    def command(emitter: str) -> list[str]:
        return ["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub",
                "--emitter", emitter, "-f", str(out), "--status-interval", "0.2"]

    proc = start_cli([*command(before), "--create-slot", "--two-phase"], env=env,
                     stderr_path=stderr)
    try:
        wait_for(lambda: slot_row(db.conninfo, slot), what="slot created")
        small_transactions(db.conninfo, 1, 5)
        with db.connect(autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t SELECT g, 'prepared' FROM generate_series(-10, -1) g")
            conn.execute("PREPARE TRANSACTION 'pending'")
        small_transactions(db.conninfo, 10, 5)
        end = current_lsn(db.conninfo)
        wait_for(lambda: progress.exists()
                 and LSN(json.loads(progress.read_text())["lsn"]) >= end,
                 what="the later transactions in the file")
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    wait_slot_inactive(db.conninfo, slot)
    kept = (out.read_bytes(), progress.read_text())

    result = run_cli(command(after), env=env, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "was written with prepared transactions delivered" in result.stderr
    assert "Nothing was written" in result.stderr
    assert (out.read_bytes(), progress.read_text()) == kept

    wait_slot_inactive(db.conninfo, slot)
    proc = start_cli(command(before), env=env, stderr_path=stderr)
    try:
        wait_for(lambda: (slot_row(db.conninfo, slot) or {}).get("active"), what="restart")
        query(db.conninfo, "COMMIT PREPARED 'pending'")
        small_transactions(db.conninfo, 20, 5)
        wait_for_ack(db.conninfo, slot, current_lsn(db.conninfo))
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    check_exactly_once(db.conninfo, read_lines(out))


# --- a prepared transaction held while the server stops ---------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("emitter", ["probe", "json"])
def test_a_held_prepared_transaction_lets_the_server_stop_fast(own_cluster: LocalCluster,
                                                                env: dict[str, str],
                                                                tmp_path: Path,
                                                                emitter: str) -> None:
    """A slot created --two-phase, an emitter that takes prepared transactions at COMMIT
    PREPARED (the default json emitter among them), one transaction prepared and left
    pending: the slot is acknowledged past it, so `pg_ctl stop -m fast` returns (it waited
    until it gave up while pgdecode could not confirm what it was sent). pgdecode is killed
    while the server is down; the next run, which the server sends only the COMMIT
    PREPARED, writes the transaction from FILE.hold, once."""
    conninfo = own_cluster.conninfo()
    make_table(conninfo)
    slot = "held"
    out = tmp_path / "out"
    stderr = tmp_path / "stderr"
    command = ["stream", "-d", conninfo, "-S", slot, "--publication", "pub", "--emitter",
               emitter, "-f", str(out), "--status-interval", "0.2"]
    proc = start_cli([*command, "--create-slot", "--two-phase"], env=env, stderr_path=stderr)
    try:
        wait_for(lambda: slot_row(conninfo, slot), what="slot created")
        small_transactions(conninfo, 1, 5)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t SELECT g, 'prepared' FROM generate_series(-10, -1) g")
            conn.execute("PREPARE TRANSACTION 'pending'")
        small_transactions(conninfo, 10, 5)
        wait_for_ack(conninfo, slot, current_lsn(conninfo), timeout=60)  # past the PREPARE
        own_cluster.stop("fast", timeout=30)  # ClusterError if it does not stop
        assert proc.poll() is None, stderr.read_text()  # it waits for the server to return
    finally:
        proc.kill()
        proc.wait()
    assert list(Path(f"{out}.hold").glob("*.hold")), "nothing held"
    own_cluster.start()
    proc = start_cli(command, env=env, stderr_path=stderr)
    try:
        wait_for(lambda: (slot_row(conninfo, slot) or {}).get("active"), what="restart")
        query(conninfo, "COMMIT PREPARED 'pending'")
        small_transactions(conninfo, 20, 5)
        wait_for_ack(conninfo, slot, current_lsn(conninfo))
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    if emitter == "probe":
        check_exactly_once(conninfo, read_lines(out))
    else:
        ids = [int(line["new"]["id"]) for line in read_lines(out)]
        assert sorted(ids) == table_ids(conninfo, "t")  # each row once, the prepared ones too
    assert not list(Path(f"{out}.hold").glob("*.hold"))


# --- 3: the server restarted under the stream --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
def test_server_restart_mid_stream(own_cluster: LocalCluster, env: dict[str, str],
                                   tmp_path: Path, source_kind: str) -> None:
    conninfo = own_cluster.conninfo()
    make_table(conninfo)
    slot = "restarted"
    create_slot(conninfo, slot)
    out = tmp_path / "out"
    stderr = tmp_path / "stderr"
    small_transactions(conninfo, 1, 200)
    insert(conninfo, 1000, 1000 + BIG - 1, "big")
    proc = start_cli(["stream", "-d", conninfo, "-S", slot, "--publication", "pub",
                      "--emitter", "probe", "-f", str(out), "--status-interval", "0.2",
                      "--source", source_kind], env=env, stderr_path=stderr)
    try:
        wait_for(lambda: size(out) > 20_000, timeout=120, interval=0.01, what="some output")
        own_cluster.restart()
        small_transactions(conninfo, 300, 100)
        insert(conninfo, 100_000, 100_000 + 9_999, "after")
        wait_for_ack(conninfo, slot, current_lsn(conninfo))
        assert proc.poll() is None
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    log = stderr.read_text()
    assert "reconnecting in" in log
    check_exactly_once(conninfo, read_lines(out))


# --- 4: an idle slot does not hold WAL back ----------------------------------------------------


@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
def test_idle_slot_advances(db: Any, env: dict[str, str], tmp_path: Path,
                            source_kind: str) -> None:
    make_table(db.conninfo)
    slot = f"{db.dbname}_idle"
    create_slot(db.conninfo, slot)
    proc = start_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub",
                      "--emitter", "probe", "-f", str(tmp_path / "out"),
                      "--status-interval", "0.2", "--source", source_kind], env=env,
                     stderr_path=tmp_path / "stderr")
    try:
        start = confirmed_flush(db.conninfo, slot)
        # Only an unpublished table changes...
        query(db.conninfo, "INSERT INTO unpub SELECT generate_series(1, 1000)")
        target = current_lsn(db.conninfo)
        wait_for_ack(db.conninfo, slot, target, timeout=60)
        # ... then only another database.
        query(db.cluster.conninfo(), "CREATE TABLE IF NOT EXISTS idle_elsewhere (id int)")
        query(db.cluster.conninfo(), "INSERT INTO idle_elsewhere SELECT generate_series(1, 1000)")
        target = current_lsn(db.conninfo)
        wait_for_ack(db.conninfo, slot, target, timeout=60)
        assert confirmed_flush(db.conninfo, slot) > start
    finally:
        assert stop_process(proc) == 0
        query(db.cluster.conninfo(), "DROP TABLE IF EXISTS idle_elsewhere")
    assert (tmp_path / "out").read_text() == ""


# --- signals -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("streaming", ["on", "off"])
def test_signal_finishes_transaction_and_acknowledges(db: Any, env: dict[str, str],
                                                      tmp_path: Path, sig: signal.Signals,
                                                      streaming: str) -> None:
    make_table(db.conninfo)
    slot = f"{db.dbname}_sig"
    create_slot(db.conninfo, slot)
    small_transactions(db.conninfo, 1, 5)
    insert(db.conninfo, 1000, 1000 + BIG - 1, "big")
    insert(db.conninfo, 100_000, 100_000 + BIG - 1, "big2")
    out = tmp_path / "out"
    command = ["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub", "--emitter",
               "probe", "-f", str(out), "--streaming", streaming, "--status-interval", "60"]
    proc = start_cli(command, env=env, stderr_path=tmp_path / "stderr")
    try:
        wait_for(lambda: size(out) > 100_000 or proc.poll() is not None, timeout=120,
                 interval=0.01, what="output of the large transaction")
    finally:
        assert stop_process(proc, sig) == 0, (tmp_path / "stderr").read_text()
    lines = read_lines(out)
    xids = committed_xids(lines)  # whole transactions only
    assert len(xids) >= 6  # it was writing the first large one: that one was finished
    last_end = LSN([ln["end_lsn"] for ln in lines if ln["cb"] == "commit"][-1])
    progress = LSN(json.loads(Path(f"{out}.progress").read_text())["lsn"])
    assert progress == last_end
    # Acknowledged up to the last transaction's end at exit (not only every 60 s).
    assert confirmed_flush(db.conninfo, slot) >= last_end
    # And the rest is still there, once.
    result = run_cli([*command, "-E", str(current_lsn(db.conninfo))], env=env)
    assert result.returncode == 0, result.stderr
    check_exactly_once(db.conninfo, read_lines(out))


# --- 5: errors from a real server ----------------------------------------------------------------


def stream_error(conninfo: str, env: dict[str, str], *args: str, slot: str = "s",
                 publication: str = "pub", source_kind: str = "walsender",
                 status: int = 1) -> str:
    result = run_cli(["stream", "-d", conninfo, "-S", slot, "--publication", publication,
                      "--emitter", "probe", "--no-reconnect", "--source", source_kind,
                      "-E", "0/1", *args], env=env, timeout=60)
    assert result.returncode == status, result.stderr
    # the error ends the output (perhaps after a line of INFO about the start)
    assert "pgdecode: error: " in result.stderr, result.stderr
    error = result.stderr[result.stderr.index("pgdecode: error: "):]
    assert "Traceback" not in error
    return error


SOURCES = pytest.mark.parametrize("source_kind", ["walsender", "sql"])


@SOURCES
def test_error_wal_level_not_logical(pg: LocalCluster, env: dict[str, str],
                                     source_kind: str) -> None:
    with LocalCluster(pg.bindir, settings={"wal_level": "replica"}) as cluster:
        conninfo = cluster.conninfo()
        make_table(conninfo)
        for extra in ([], ["--create-slot"]):
            message = stream_error(conninfo, env, *extra, source_kind=source_kind)
            assert 'wal_level is "replica"' in message
            assert "ALTER SYSTEM SET wal_level = logical" in message
            assert "restart the server" in message
        result = run_cli(["slot", "create", "-d", conninfo, "-S", "s"], env=env)
        assert result.returncode == 1
        assert "wal_level" in result.stderr and "ALTER SYSTEM SET wal_level" in result.stderr


@SOURCES
def test_error_slot_missing(db: Any, env: dict[str, str], source_kind: str) -> None:
    make_table(db.conninfo)
    message = stream_error(db.conninfo, env, slot="nowhere", source_kind=source_kind,
                           status=3)
    assert 'replication slot "nowhere" does not exist' in message
    assert "pgdecode slot create" in message and "--create-slot" in message


@SOURCES
def test_error_slot_active_in_another_process(db: Any, env: dict[str, str], tmp_path: Path,
                                              source_kind: str) -> None:
    make_table(db.conninfo)
    slot = f"{db.dbname}_busy"
    create_slot(db.conninfo, slot)
    first = start_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub",
                       "--emitter", "probe", "-f", str(tmp_path / "first")], env=env)
    try:
        wait_for(lambda: (slot_row(db.conninfo, slot) or {}).get("active"), what="first")
        pid = slot_row(db.conninfo, slot)["active_pid"]  # type: ignore[index]
        message = stream_error(db.conninfo, env, slot=slot, source_kind=source_kind)
        assert f'replication slot "{slot}" is active for PID {pid}' in message
        assert "Another consumer" in message or "another consumer" in message
        assert "use another slot" in message
        assert first.poll() is None  # the first consumer is undisturbed
    finally:
        assert stop_process(first) == 0


@SOURCES
def test_error_slot_invalidated(pg: LocalCluster, env: dict[str, str],
                                source_kind: str) -> None:
    with LocalCluster(pg.bindir, settings={"max_slot_wal_keep_size": "1MB"}) as cluster:
        conninfo = cluster.conninfo()
        make_table(conninfo)
        create_slot(conninfo, "lost")
        for i in range(100):
            if slot_row(conninfo, "lost")["wal_status"] == "lost":  # type: ignore[index]
                break
            insert(conninfo, i * 10_000, i * 10_000 + 9_999)
            query(conninfo, "SELECT pg_switch_wal()")
            query(conninfo, "CHECKPOINT")
        else:
            pytest.fail("the slot was never invalidated")
        message = stream_error(conninfo, env, slot="lost", source_kind=source_kind, status=3)
        assert '"lost"' in message and "invalidated" in message
        assert "cannot be used again" in message
        assert "pgdecode slot drop -S lost" in message and "max_slot_wal_keep_size" in message
        listed = run_cli(["slot", "list", "-d", conninfo], env=env)
        assert listed.stdout.splitlines()[1].split()[-1] == "lost"


@SOURCES
def test_error_slot_invalidated_for_idleness(pg: LocalCluster, env: dict[str, str],
                                            source_kind: str) -> None:
    """PostgreSQL 18 invalidates a slot idle longer than idle_replication_slot_timeout."""
    if pg.major_version < 18:
        pytest.skip("idle_replication_slot_timeout is new in PostgreSQL 18")
    with LocalCluster(pg.bindir, settings={"idle_replication_slot_timeout": "1s"}) as cluster:
        conninfo = cluster.conninfo()
        make_table(conninfo)
        create_slot(conninfo, "idle")
        insert(conninfo, 1, 10)
        wait_for(lambda: query(conninfo, "CHECKPOINT") is not None and (
            slot_row(conninfo, "idle") or {}).get("wal_status") == "lost",
            timeout=30, interval=0.5, what="the idle slot to be invalidated")
        message = stream_error(conninfo, env, slot="idle", source_kind=source_kind, status=3)
        assert '"idle"' in message and "invalidated" in message
        assert "pgdecode slot drop -S idle" in message
        assert "raise idle_replication_slot_timeout" in message


@SOURCES
def test_error_publication_missing(db: Any, env: dict[str, str], source_kind: str) -> None:
    make_table(db.conninfo)
    create_slot(db.conninfo, f"{db.dbname}_pub")
    message = stream_error(db.conninfo, env, "--publication", "pub", slot=f"{db.dbname}_pub",
                           publication="nopub", source_kind=source_kind)
    assert f'publication "nopub" does not exist in database "{db.dbname}"' in message
    assert "CREATE PUBLICATION" in message and "--publication" in message


@SOURCES
def test_error_permission_denied(db: Any, env: dict[str, str], source_kind: str) -> None:
    make_table(db.conninfo)
    slot = f"{db.dbname}_perm"
    create_slot(db.conninfo, slot)
    role = f"{db.dbname}_nobody"
    query(db.conninfo, f"CREATE ROLE {role} LOGIN")
    try:
        conninfo = db.cluster.conninfo(db.dbname, user=role)
        message = stream_error(conninfo, env, slot=slot, source_kind=source_kind)
        assert "REPLICATION attribute" in message
        assert f"ALTER ROLE {role} REPLICATION" in message
        # Not a connection problem to retry: it fails the same without --no-reconnect.
        result = run_cli(["stream", "-d", conninfo, "-S", slot, "--publication", "pub",
                          "--emitter", "probe", "--source", source_kind, "-E", "0/1"],
                         env=env, timeout=60)
        assert result.returncode == 1 and "reconnecting" not in result.stderr
    finally:
        query(db.conninfo, f"DROP ROLE {role}")


@SOURCES
def test_error_protocol_version_not_supported(db: Any, env: dict[str, str],
                                              source_kind: str) -> None:
    if db.major_version >= 16:
        pytest.skip("every --proto-version is supported from PostgreSQL 16 on")
    make_table(db.conninfo)
    create_slot(db.conninfo, f"{db.dbname}_proto")
    message = stream_error(db.conninfo, env, "--proto-version", "4", slot=f"{db.dbname}_proto",
                           source_kind=source_kind)
    assert (f"PostgreSQL {db.major_version} speaks pgoutput protocol up to version 3, not 4"
            in message)
    assert "--proto-version 3 or leave it out" in message
