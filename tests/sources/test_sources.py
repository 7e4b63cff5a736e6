"""The live sources through their Python API (WalsenderSource, SqlSource, SourceConfig), and
the pieces they are made of: pgoutput options, protocol negotiation, error translation."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.streamkit import (
    BIG_ROWS,
    Probe,
    StreamProbe,
    TwoPhaseProbe,
    applied_ids,
    confirmed_flush,
    create_slot,
    create_tables,
    current_lsn,
    query,
    run_options_workload,
    slot_row,
    table_ids,
    wait_for,
)

from emitters.text import TestDecodingEmitter
from plugin_framework import LSN, FileOutput, MemoryOutput, Pipeline
from plugin_framework.framework import CallbackError
from plugin_framework.framework.outputs import OutputError
from plugin_framework.sources.errors import ConnectionLost, SlotUnusable, SourceError, explain
from plugin_framework.sources.replication import ReplicationError
from plugin_framework.sources.session import (
    SourceConfig,
    check_proto_version,
    only_local,
    pgoutput_options,
)
from plugin_framework.sources.sql import SqlSource
from plugin_framework.sources.walsender import WalsenderSource

# --- without a server ---------------------------------------------------------------------------


def config(**kwargs: Any) -> SourceConfig:
    return SourceConfig(conninfo="", slot="s", publications=kwargs.pop("publications", ["p"]),
                        **kwargs)


def test_pgoutput_options_per_protocol() -> None:
    assert pgoutput_options(config(), 4, False, 180000) == {
        "proto_version": "4", "publication_names": '"p"', "messages": "true",
        "streaming": "on"}
    assert pgoutput_options(config(), 3, True, 150000)["streaming"] == "true"
    assert pgoutput_options(config(), 3, True, 150000)["two_phase"] == "true"
    assert pgoutput_options(config(streaming="parallel"), 4, False, 160000)["streaming"] \
        == "parallel"
    off = pgoutput_options(config(streaming="off", messages=False, binary=True, origin="none",
                                  publications=["a", 'we"ird']), 1, False, 160000)
    assert off == {"proto_version": "1", "publication_names": '"a","we""ird"',
                   "binary": "true", "origin": "none"}


@pytest.mark.parametrize(("kwargs", "proto", "server", "words"), [
    ({"streaming": "on"}, 1, 180000, "--streaming on needs pgoutput protocol version 2"),
    ({"streaming": "parallel"}, 3, 150000, "--streaming parallel needs protocol version 4"),
    ({"streaming": "maybe"}, 4, 180000, "--streaming must be off, on or parallel"),
    ({"origin": "none"}, 3, 150000, "the origin option needs PostgreSQL 16 or later"),
    ({"publications": []}, 4, 180000, "at least one --publication"),
])
def test_pgoutput_options_refused(kwargs: dict[str, Any], proto: int, server: int,
                                  words: str) -> None:
    with pytest.raises(SourceError, match=words):
        pgoutput_options(config(**kwargs), proto, False, server)


def test_two_phase_needs_protocol_3() -> None:
    with pytest.raises(SourceError, match="needs pgoutput protocol version 3"):
        pgoutput_options(config(streaming="off"), 2, True, 150000)


def test_protocol_negotiation() -> None:
    assert check_proto_version(None, 180000) == 4
    assert check_proto_version(None, 150004) == 3
    assert check_proto_version(None, 140010) == 2
    assert check_proto_version(2, 180000) == 2
    with pytest.raises(SourceError, match="PostgreSQL 15 speaks pgoutput protocol up to "
                                          "version 3, not 4: use --proto-version 3"):
        check_proto_version(4, 150000)
    with pytest.raises(SourceError, match="not 0"):
        check_proto_version(0, 180000)
    with pytest.raises(SourceError, match="10 or later is needed"):
        check_proto_version(None, 90600)


CONNINFO = "host=db.example port=5433 user=app password=secret123 dbname=shop"


def test_explain_connection_errors() -> None:
    refused = explain(psycopg.OperationalError(
        'connection failed: connection to server at "10.0.0.1", port 5433 failed: '
        "Connection refused"), CONNINFO)
    assert isinstance(refused, ConnectionLost)
    assert str(refused).startswith("cannot connect to host=db.example port=5433 dbname=shop "
                                   "user=app:")
    lost = explain(psycopg.OperationalError(
        "consuming input failed: server closed the connection unexpectedly"), CONNINFO)
    assert isinstance(lost, ConnectionLost) and "lost" in str(lost)
    assert isinstance(explain(ReplicationError("the server ended the replication stream"),
                              CONNINFO), ConnectionLost)
    # Refused at login: no retry can fix these.
    for text, words in [
        ("FATAL:  permission denied to start WAL sender", "ALTER ROLE app REPLICATION"),
        ('FATAL:  password authentication failed for user "app" secret123', "PGPASSWORD"),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.2"', "pg_hba.conf line"),
        ('FATAL:  database "shop" does not exist', "Check the database and user names"),
    ]:
        error = explain(psycopg.OperationalError(
            f'connection failed: connection to server at "10.0.0.1", port 5433 failed: {text}'),
            CONNINFO)
        assert type(error) is SourceError, text
        assert words in str(error)
        assert "secret123" not in str(error)


def test_a_cancelled_statement_is_not_retried_as_a_lost_connection(db: Any) -> None:
    """SQLSTATE class 57 is mostly a server going away, but 57014 is a statement_timeout:
    retrying the same peek would time out forever."""
    with psycopg.connect(db.conninfo) as conn:
        conn.execute("SET statement_timeout = '10ms'")
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT pg_sleep(1)")
    error = explain(caught.value, db.conninfo)
    assert type(error) is SourceError
    assert "SET statement_timeout = 0" in str(error)


def test_explain_server_errors() -> None:
    shutdown = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert isinstance(explain(shutdown, CONNINFO), ConnectionLost)
    in_use = psycopg.errors.ObjectInUse('replication slot "s" is active for PID 42')
    error = explain(in_use, CONNINFO, "s")
    assert type(error) is SourceError and "Another consumer" in str(error)
    missing = psycopg.errors.UndefinedObject('replication slot "s" does not exist')
    assert "--create-slot" in str(explain(missing, CONNINFO, "s"))
    assert isinstance(explain(missing, CONNINFO, "s"), SlotUnusable)  # exit status 3
    denied = psycopg.errors.InsufficientPrivilege("permission denied to use replication slots")
    assert "ALTER ROLE app REPLICATION" in str(explain(denied, CONNINFO, "s"))
    gone = psycopg.errors.ObjectNotInPrerequisiteState(
        'can no longer access replication slot "s"\nDETAIL:  This replication slot has been '
        'invalidated due to "idle_timeout".')
    assert "idle_replication_slot_timeout" in str(explain(gone, CONNINFO, "s"))
    assert "pgdecode slot drop -S s" in str(explain(gone, CONNINFO, "s"))
    assert isinstance(explain(gone, CONNINFO, "s"), SlotUnusable)
    other = explain(psycopg.errors.SyntaxError("oops secret123"), CONNINFO)
    assert str(other) == "host=db.example port=5433 dbname=shop user=app: oops ********"


# --- against a server ----------------------------------------------------------------------------


def probe_pipeline(*plugins: Any, output: Any = None) -> tuple[Pipeline, list[MemoryOutput]]:
    pipeline = Pipeline()
    outputs = []
    for plugin in plugins or (Probe(),):
        out = output if output is not None else MemoryOutput()
        outputs.append(out)
        pipeline.add(plugin, output=out)
    return pipeline, outputs


def lines_of(output: MemoryOutput) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.lines]


def run(source: Any) -> None:
    try:
        source.run()
    finally:
        source.pipeline.shutdown()


def run_in_thread(source: Any) -> tuple[threading.Thread, list[BaseException]]:
    """``run`` in a thread, not started yet, and the list that gets what it raises."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run(source)
        except BaseException as exc:
            errors.append(exc)

    return threading.Thread(target=target), errors


SOURCES = pytest.mark.parametrize("kind", ["walsender", "sql"])


def make_source(kind: str, cfg: SourceConfig, pipeline: Pipeline, **kwargs: Any) -> Any:
    if kind == "sql":
        return SqlSource(cfg, pipeline, poll_interval=0.2, **kwargs)
    return WalsenderSource(cfg, pipeline, **kwargs)


@SOURCES
def test_source_to_endpos(db: Any, kind: str) -> None:
    create_tables(db.conninfo)
    create_slot(db.conninfo, f"{db.dbname}_s")
    end = run_options_workload(db.conninfo)
    pipeline, (out,) = probe_pipeline()
    cfg = SourceConfig(db.conninfo, f"{db.dbname}_s", ["p1", "p2"], endpos=end,
                       status_interval=0.5)
    source = make_source(kind, cfg, pipeline)
    run(source)
    lines = lines_of(out)
    assert applied_ids(lines, "t1") == table_ids(db.conninfo, "t1")
    assert applied_ids(lines, "t2") == table_ids(db.conninfo, "t2")
    assert source.progress.acked >= LSN(lines[-1]["end_lsn"])
    assert confirmed_flush(db.conninfo, f"{db.dbname}_s") == source.progress.acked
    assert pipeline.transactions >= 5 and source.progress.messages > BIG_ROWS


@SOURCES
def test_create_slot_is_init_and_temporary(db: Any, kind: str) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_tmp"
    pipeline, (out,) = probe_pipeline()
    seen: dict[str, Any] = {}

    def progress(_: Any) -> None:
        seen.setdefault("slot", slot_row(db.conninfo, slot))

    cfg = SourceConfig(db.conninfo, slot, ["p1"], create_slot=True, temporary_slot=True,
                       status_interval=0.2)
    source = make_source(kind, cfg, pipeline, on_progress=progress)
    thread = threading.Thread(target=run, args=(source,))
    thread.start()
    try:
        wait_for(lambda: "slot" in seen, what="a status update")
        query(db.conninfo, "INSERT INTO t1 VALUES (1, 'a', 1)")
        wait_for(lambda: out.records, what="the insert")
    finally:
        source.request_stop()
        thread.join(60)
    assert not thread.is_alive()
    assert seen["slot"]["temporary"]
    assert [ln["is_init"] for ln in lines_of(out) if ln["cb"] == "begin"] == [True]
    # Gone with the session: the server drops it as the session's backend exits, which it
    # does after the client has closed the connection (a moment later on a loaded machine).
    wait_for(lambda: slot_row(db.conninfo, slot) is None, timeout=30,
             what="the temporary slot's removal")


def test_temporary_slot_does_not_survive_a_reconnect(db: Any) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_tmp"
    pipeline, _ = probe_pipeline()
    cfg = SourceConfig(db.conninfo, slot, ["p1"], create_slot=True, temporary_slot=True,
                       status_interval=0.2, max_backoff=0.1)
    streaming = threading.Event()
    source = WalsenderSource(cfg, pipeline, on_progress=lambda _: streaming.set())
    thread, errors = run_in_thread(source)
    thread.start()
    try:
        assert streaming.wait(60)
        pid = slot_row(db.conninfo, slot)["active_pid"]  # type: ignore[index]
        query(db.conninfo, "SELECT pg_terminate_backend(%s)", (pid,))
        thread.join(60)
    finally:
        source.request_stop()
        thread.join(60)
    assert len(errors) == 1 and type(errors[0]) is SourceError
    assert "temporary slot" in str(errors[0]) and "persistent slot" in str(errors[0])


@SOURCES
def test_request_stop_finishes_and_acknowledges(db: Any, kind: str) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_stop"
    create_slot(db.conninfo, slot)
    pipeline, (out,) = probe_pipeline()
    cfg = SourceConfig(db.conninfo, slot, ["p1", "p2"], status_interval=60)
    source = make_source(kind, cfg, pipeline)
    thread = threading.Thread(target=run, args=(source,))
    thread.start()
    try:
        end = run_options_workload(db.conninfo)
        wait_for(lambda: source.pipeline.position >= end or any(
            json.loads(line).get("new", {}) == {"id": "3", "v": "tres"}
            for line in out.lines), what="the whole workload")
    finally:
        source.request_stop()
        thread.join(60)
    assert not thread.is_alive()
    last_end = LSN(lines_of(out)[-1]["end_lsn"])
    # Acknowledged at the stop, although the status interval is a minute.
    assert confirmed_flush(db.conninfo, slot) >= last_end


def test_walsender_reconnects_after_termination(db: Any) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_rc"
    create_slot(db.conninfo, slot)
    pipeline, (out,) = probe_pipeline()
    cfg = SourceConfig(db.conninfo, slot, ["p1", "p2"], status_interval=0.2, max_backoff=0.2)
    source = WalsenderSource(cfg, pipeline)
    thread = threading.Thread(target=run, args=(source,))
    thread.start()
    try:
        pid = wait_for(lambda: (slot_row(db.conninfo, slot) or {}).get("active_pid"))
        run_options_workload(db.conninfo)
        query(db.conninfo, "SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: source.progress.reconnects >= 1, what="a reconnect")
        query(db.conninfo, "INSERT INTO t2 VALUES (100, 'after')")
        end = current_lsn(db.conninfo)
        wait_for(lambda: confirmed_flush(db.conninfo, slot) >= end, timeout=60)
    finally:
        source.request_stop()
        thread.join(60)
    lines = lines_of(out)
    assert applied_ids(lines, "t1") == table_ids(db.conninfo, "t1")
    assert applied_ids(lines, "t2") == table_ids(db.conninfo, "t2")


class _StopsItsWalsenderThenFails(Probe):
    """On its first change: stops the walsender sending it (SIGSTOP), then fails, so that
    the walsender outlives the connection the failed run closes."""

    def __init__(self, conninfo: str, slot: str) -> None:
        self.conninfo, self.slot = conninfo, slot
        self.stopped: int | None = None

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        pid = int(slot_row(self.conninfo, self.slot)["active_pid"])  # type: ignore[index]
        os.kill(pid, signal.SIGSTOP)
        self.stopped = pid
        raise RuntimeError("the batch failed")


def test_a_stream_started_after_a_failed_one_waits_for_its_walsender_to_go(db: Any) -> None:
    """ForeachBatchStream run again after its batch function failed, a notebook's next
    query: the failed run's walsender can hold the slot a moment after its connection is
    closed. The next run of the same process waits for it to go, instead of refusing the
    slot as another consumer's. (SIGSTOP keeps the walsender there until the next run is
    seen waiting.)"""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_again"
    create_slot(db.conninfo, slot)
    query(db.conninfo, "INSERT INTO t1 VALUES (1, 'a', 1)")
    cfg = SourceConfig(db.conninfo, slot, ["p1"], endpos=current_lsn(db.conninfo),
                       max_backoff=0.2)
    failing = _StopsItsWalsenderThenFails(db.conninfo, slot)
    pipeline, (out,) = probe_pipeline()
    again = WalsenderSource(cfg, pipeline)
    thread, errors = run_in_thread(again)
    try:
        with pytest.raises(CallbackError, match="the batch failed"):
            run(WalsenderSource(cfg, probe_pipeline(failing)[0]))
        assert slot_row(db.conninfo, slot)["active_pid"] == failing.stopped  # type: ignore[index]
        thread.start()
        wait_for(lambda: again.progress.reconnects >= 2 or errors, what="the run to wait")
        assert not errors, errors
    finally:
        if failing.stopped is not None:
            os.kill(failing.stopped, signal.SIGCONT)
        if thread.is_alive():
            thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert applied_ids(lines_of(out), "t1") == [1]  # the failed run's change, delivered once
    assert confirmed_flush(db.conninfo, slot) >= cfg.endpos  # type: ignore[operator]


def run_within(source: Any, seconds: float) -> None:
    """``run``, failing (and stopping the source) if it is still running after ``seconds``."""
    thread = threading.Thread(target=run, args=(source,))
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        source.request_stop()
        thread.join(60)
        pytest.fail(f"the source did not stop at --endpos within {seconds} s")


def prepare_row(conninfo: str, gid: str) -> None:
    """PREPARE TRANSACTION gid, of one insert into t1 (id 1)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t1 VALUES (1, 'prepared', 1)")
        conn.execute(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(gid))


@SOURCES
def test_endpos_stops_with_a_prepared_transaction_held(db: Any, kind: str,
                                                       tmp_path: Path) -> None:
    """As pg_recvlogical does, --endpos stops once everything committed before it is
    delivered, even while a prepared transaction (committed later, if ever) is held for an
    ordinary plugin; the next run into the same file gets that transaction when it commits,
    and nothing twice."""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_held"
    create_slot(db.conninfo, slot, two_phase=True)
    prepare_row(db.conninfo, "held")
    query(db.conninfo, "INSERT INTO t1 VALUES (2, 'after', 2)")
    path = tmp_path / "out"

    def run_to_end() -> list[dict[str, Any]]:
        # --endpos past the last published change: reached by the server's keepalives
        query(db.conninfo, "INSERT INTO unpub SELECT generate_series(1, 10)")
        query(db.conninfo, "DELETE FROM unpub")
        end = current_lsn(db.conninfo)
        pipeline, _ = probe_pipeline(output=FileOutput(path))
        run_within(make_source(kind, SourceConfig(db.conninfo, slot, ["p1"], endpos=end),
                               pipeline), 30)
        return [json.loads(line) for line in path.read_text().splitlines()]

    assert [ln["new"]["id"] for ln in run_to_end() if ln["cb"] == "change"] == ["2"]
    query(db.conninfo, "COMMIT PREPARED 'held'")
    assert [ln["new"]["id"] for ln in run_to_end() if ln["cb"] == "change"] == ["2", "1"]


def test_a_file_resumes_only_from_the_slot_that_wrote_it(db: Any, tmp_path: Path) -> None:
    """A file skips, on resuming, what it holds by LSN: another slot's changes at lower LSNs
    would be skipped unseen (and acknowledged). The second slot is refused instead, before
    anything of it is acknowledged."""
    create_tables(db.conninfo)
    first, second = f"{db.dbname}_one", f"{db.dbname}_two"
    create_slot(db.conninfo, first)
    create_slot(db.conninfo, second)
    end = run_options_workload(db.conninfo)
    path = tmp_path / "out"
    pipeline, _ = probe_pipeline(output=FileOutput(path))
    pipeline.slot_name = first
    run(WalsenderSource(SourceConfig(db.conninfo, first, ["p1"], endpos=end), pipeline))
    before = confirmed_flush(db.conninfo, second)
    pipeline, _ = probe_pipeline(output=FileOutput(path))
    pipeline.slot_name = second
    with pytest.raises(OutputError, match=f'holds the changes of replication slot "{first}"'):
        run(WalsenderSource(SourceConfig(db.conninfo, second, ["p1"], endpos=end), pipeline))
    assert confirmed_flush(db.conninfo, second) == before


@SOURCES
def test_a_slot_created_for_plugins_that_cannot_start_is_dropped_again(db: Any,
                                                                        kind: str) -> None:
    """--create-slot, then a plugin refuses its options: the new slot would hold WAL back
    for nothing, and a rerun would tell the plugin is_init = false for it."""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_refused"
    pipeline = Pipeline(slot_name=slot)
    pipeline.add(Probe(), options={"fail": "bad option"}, output=MemoryOutput())
    with pytest.raises(Exception, match="asked to fail: bad option"):
        run(make_source(kind, SourceConfig(db.conninfo, slot, ["p1"], create_slot=True),
                        pipeline))
    assert slot_row(db.conninfo, slot) is None


def test_streaming_leaves_a_slot_without_two_phase_as_it_is(db: Any) -> None:
    """Two-phase decoding is the slot's property, chosen when it is created; asking for it
    at START_REPLICATION would turn it on for good (PostgreSQL 15 and later). A plugin with
    two-phase callbacks then gets prepared transactions at COMMIT PREPARED."""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_plain"
    create_slot(db.conninfo, slot, two_phase=False)
    prepare_row(db.conninfo, "plain")
    query(db.conninfo, "COMMIT PREPARED 'plain'")
    end = current_lsn(db.conninfo)
    pipeline, (out,) = probe_pipeline(TwoPhaseProbe())
    run(WalsenderSource(SourceConfig(db.conninfo, slot, ["p1"], endpos=end), pipeline))
    assert [ln["cb"] for ln in lines_of(out)] == ["begin", "change", "commit"]
    row = slot_row(db.conninfo, slot)
    assert row is not None and row["two_phase"] is False


def test_both_sources_deliver_the_same(db: Any) -> None:
    create_tables(db.conninfo)
    for name in ("a", "b"):
        create_slot(db.conninfo, f"{db.dbname}_{name}")
    end = run_options_workload(db.conninfo)
    results = []
    for kind, name in (("walsender", "a"), ("sql", "b")):
        pipeline, (out,) = probe_pipeline(StreamProbe())
        run(make_source(kind, SourceConfig(db.conninfo, f"{db.dbname}_{name}", ["p1", "p2"],
                                           endpos=end), pipeline))
        results.append([{k: v for k, v in ln.items() if k != "lsn" or ln["cb"] == "commit"}
                        for ln in lines_of(out)])
    assert results[0] == results[1]


def test_sql_source_gets_past_a_transaction_larger_than_its_batch(db: Any) -> None:
    """Streamed, a transaction larger than a peek's batch ends every peek unfinished; the
    source reads further each time rather than peeking the same batch forever."""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_big"
    create_slot(db.conninfo, slot)
    end = run_options_workload(db.conninfo)
    pipeline, (out,) = probe_pipeline()
    source = SqlSource(SourceConfig(db.conninfo, slot, ["p1", "p2"], endpos=end), pipeline,
                       batch_changes=100, poll_interval=0.1)
    run(source)
    assert applied_ids(lines_of(out), "t1") == table_ids(db.conninfo, "t1")


def test_sql_source_never_moves_the_slot_back(db: Any, tmp_path: Path) -> None:
    """The slot's confirmed position passed what the output file holds (idle WAL was
    acknowledged); the SQL source must not try to advance it to the file's position."""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_back"
    create_slot(db.conninfo, slot)
    path = tmp_path / "out"
    query(db.conninfo, "INSERT INTO t1 VALUES (100, 'a', 1)")
    first = current_lsn(db.conninfo)
    pipeline, _ = probe_pipeline(output=FileOutput(path))
    run(WalsenderSource(SourceConfig(db.conninfo, slot, ["p1"], endpos=first), pipeline))
    # (few rows: a large transaction would be streamed, and its empty Stream Commit
    # recorded in the file)
    query(db.conninfo, "INSERT INTO unpub SELECT generate_series(10, 20)")
    idle = current_lsn(db.conninfo)
    pipeline, _ = probe_pipeline(output=FileOutput(path))
    run(WalsenderSource(SourceConfig(db.conninfo, slot, ["p1"], endpos=idle), pipeline))
    assert confirmed_flush(db.conninfo, slot) >= idle
    assert LSN(json.loads(Path(f"{path}.progress").read_text())["lsn"]) < idle
    end = run_options_workload(db.conninfo)
    pipeline, _ = probe_pipeline(output=FileOutput(path))
    run(SqlSource(SourceConfig(db.conninfo, slot, ["p1"], endpos=end), pipeline,
                  batch_changes=100, poll_interval=0.1))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert applied_ids(lines, "t1") == table_ids(db.conninfo, "t1")


def test_unsupported_protocol_version_through_the_api(db: Any) -> None:
    create_tables(db.conninfo)
    create_slot(db.conninfo, f"{db.dbname}_v")
    highest = 4 if db.major_version >= 16 else 3
    for kind in ("walsender", "sql"):
        pipeline, _ = probe_pipeline()
        source = make_source(kind, SourceConfig(db.conninfo, f"{db.dbname}_v", ["p1"],
                                                proto_version=highest + 1), pipeline)
        with pytest.raises(SourceError, match=f"up to version {highest}, not {highest + 1}"):
            run(source)


# --- a long replay from the spool keeps the connection alive -----------------------

REPLICATION_TIMEOUT_LOG = "terminating walsender process due to replication timeout"


class SlowProbe(Probe):
    """A plugin that takes its time over every row (the fault injected): a transaction the
    pipeline replays to it from the spool takes several times wal_sender_timeout."""

    name = "probe-slow"

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        time.sleep(0.004)
        super().change(ctx, txn, relation, change)


def test_a_replay_longer_than_wal_sender_timeout_keeps_the_connection(db: Any) -> None:
    """A streamed transaction held for a plugin without stream callbacks is replayed at its
    Stream Commit; with wal_sender_timeout = 2 s and a replay of about 5 s, the server keeps
    the connection (the source answers during the replay) and sends nothing twice."""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_slow"
    create_slot(db.conninfo, slot)
    rows = 1200
    query(db.conninfo, "INSERT INTO t1 SELECT g, repeat('x', 100), g "
                       "FROM generate_series(1, %s) g", (rows,))
    end = current_lsn(db.conninfo)
    conninfo = (f"{db.conninfo} options='-c wal_sender_timeout=2s "
                "-c logical_decoding_work_mem=64kB'")
    pipeline, (out,) = probe_pipeline(SlowProbe())
    source = WalsenderSource(SourceConfig(conninfo, slot, ["p1"], endpos=end, reconnect=False),
                             pipeline)
    log_path = db.cluster.log_path
    timeouts_before = log_path.read_text(errors="replace").count(REPLICATION_TIMEOUT_LOG)
    run_within(source, 120)
    lines = lines_of(out)
    assert [ln["cb"] for ln in lines].count("begin") == 1
    assert len([ln for ln in lines if ln["cb"] == "change"]) == rows
    assert source.progress.reconnects == 0
    assert log_path.read_text(errors="replace").count(REPLICATION_TIMEOUT_LOG) == timeouts_before
    # The final acknowledgement reached the server: the connection was still there.
    assert confirmed_flush(db.conninfo, slot) >= LSN(lines[-1]["end_lsn"])


# --- origin 'none' when every plugin filters all origins ----------------------------


def test_origin_none_asked_when_every_plugin_filters_all_origins() -> None:
    def pipeline_of(*only: str) -> Pipeline:
        pipeline = Pipeline()
        for value in only:
            pipeline.add(TestDecodingEmitter(), options={"only-local": value},
                         output=MemoryOutput())
        pipeline.startup()
        return pipeline

    assert only_local(pipeline_of("1", "1"))
    assert not only_local(pipeline_of("1", "0"))  # one plugin keeps origins: the server may not
    assert not only_local(pipeline_of())
    assert pgoutput_options(config(), 4, False, 160000, local_only=True)["origin"] == "none"
    assert "origin" not in pgoutput_options(config(), 3, False, 150000, local_only=True)
    assert "origin" not in pgoutput_options(config(), 4, False, 180000, local_only=False)
    # --origin given wins
    assert pgoutput_options(config(origin="any"), 4, False, 160000,
                            local_only=True)["origin"] == "any"
