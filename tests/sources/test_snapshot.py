"""The initial snapshot on each server version: `pgdecode stream --create-slot
--snapshot initial` copies the published tables as of the new slot, then streams from its
consistent point. Applying the copy, then the stream, to empty tables gives exactly what
the server's tables hold, while a writer changes them throughout (inserts, updates, key
changes, deletes, rows moving between partitions), and however often the consumer is
killed during the copy."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from psycopg import sql
from support.jsonmirror import apply, ordered, server_tables
from support.pgtest import create_database, drop_database
from support.recorders import with_fast_path
from support.snapshotkit import (
    TABLES,
    Writer,
    apply_upserts,
    assert_copied_once,
    change_later,
    check_upserted,
    copy_left,
    copy_status,
    kill_during,
    make_tables,
    wait_acknowledged_slot,
)
from support.streamkit import (
    current_lsn,
    query,
    read_lines,
    run_cli,
    slot_row,
    start_cli,
    stop_process,
    wait_for,
)

from emitters.json import JsonEmitter
from emitters.text import TestDecodingEmitter
from emitters.wal2json import Wal2JsonEmitter
from plugin_framework import LSN, FileOutput, MemoryOutput, Pipeline
from plugin_framework.cli.status import StatusLine
from plugin_framework.protocol import Decoder
from plugin_framework.sources.errors import SourceError
from plugin_framework.sources.libpq import copy_reader_bound
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.snapshots import copy as snapshot
from plugin_framework.sources.snapshots.catalog import (
    TableCopy,
    published_tables,
    ranges_text,
    row_key,
)
from plugin_framework.sources.snapshots.copy import _copyrow, copy_chunks
from plugin_framework.sources.snapshots.ledger import CopyLedger
from plugin_framework.sources.snapshots.requests import request_snapshot
from plugin_framework.sources.walsender import WalsenderSource

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "json-change.schema.json").read_text())


def command(conninfo: str, out: Path, *extra: str) -> list[str]:
    return ["stream", "-d", conninfo, "-S", "snap", "--publication", "pub", "-f", str(out),
            "--status-interval", "0.2", "--create-slot", "--snapshot", "initial", *extra]


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def progress_of(out: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(Path(f"{out}.progress").read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def check_mirror(db: Any, lines: list[dict[str, Any]]) -> None:
    """The copy, then the stream, applied to empty tables gives the server's tables; no row
    was copied twice, and the lines are valid."""
    assert_copied_once(lines)
    assert any(ln["op"] != "snapshot" for ln in lines), "nothing streamed"
    first_stream = next(i for i, ln in enumerate(lines) if ln["op"] != "snapshot")
    assert all(ln["op"] != "snapshot" for ln in lines[first_stream:]), "copy after the stream"
    validator = Draft202012Validator(SCHEMA)
    for line in lines[:2000] + lines[first_stream:first_stream + 2000]:
        validator.validate(line)
    rebuilt = apply(lines)
    expected = server_tables(db, TABLES, {})
    for table in TABLES:
        assert ordered(list(rebuilt[table].values())) == ordered(expected[table]), table
    assert ("public", "unpublished") not in rebuilt


def wait_acknowledged(conninfo: str, lsn: LSN) -> None:
    wait_for(lambda: LSN((slot_row(conninfo, "snap") or {}).get("confirmed_flush_lsn") or 0)
             >= lsn, timeout=300, what="the slot acknowledged past the writer's last change")


@pytest.mark.slow
def test_initial_snapshot_then_stream_equals_the_tables(db: Any, env: dict[str, str],
                                                         tmp_path: Path) -> None:
    make_tables(db.conninfo)
    out = tmp_path / "out"
    stderr = tmp_path / "stderr"
    proc = start_cli(command(db.conninfo, out), env=env, stderr_path=stderr)
    writer = Writer(db.conninfo, seed=1, pause=0.002)
    try:
        wait_for(lambda: slot_row(db.conninfo, "snap"), what="slot created")
        writer.start()  # from the slot's creation on: during the copy
        wait_for(lambda: progress_of(out).get("snapshot") == "done", timeout=600,
                 what="the copy done")
        during = writer.ops
        n = during
        wait_for(lambda: writer.ops > n + 200, what="more changes after the copy")
        writer.stop()
        wait_acknowledged(db.conninfo, current_lsn(db.conninfo))
    finally:
        writer.done.set()
        assert stop_process(proc) == 0, stderr.read_text()
    assert during > 0, "the writer changed nothing during the copy"
    log = stderr.read_text()
    assert "initial snapshot done" in log and "snapshot: 2/2 tables, " in log, log
    lines = read_lines(out)
    check_mirror(db, lines)
    # the hard values were there: copied out of line, and left out of updates not setting them
    assert any(len(ln["new"].get("t") or "") == 9600 for ln in lines if ln["op"] == "snapshot")
    assert any(ln.get("unchanged_toast") == ["t"] for ln in lines if ln["op"] == "update")


def finish_copy(conninfo: str, out: Path, writer: Writer) -> None:
    """Once the copy into ``out`` is done and the writer has made 200 more changes: stop it,
    and wait for the stream to have every change."""
    wait_for(lambda: snapshot_state(out)[1], timeout=600, what="the copy done")
    n = writer.ops
    wait_for(lambda: writer.ops > n + 200, what="more changes after the copy")
    writer.stop()
    wait_acknowledged(conninfo, current_lsn(conninfo))


def snapshot_state(out: Path) -> tuple[bool, bool]:
    """``copy_status`` of a file output, from its FILE.progress."""
    progress = progress_of(out)
    return copy_status(progress.get("snapshot"), progress.get("incremental"))


@pytest.mark.slow
@pytest.mark.soak
def test_kill_9_during_the_copy_goes_on_without_doubles(db: Any, env: dict[str, str],
                                                        tmp_path: Path) -> None:
    """Killed at random points of the copy (5 times): a run that finds it unfinished goes on
    after the last chunk its file holds (the tables left, as an incremental snapshot from
    the slot's consistent point), or, before the first chunk was durable, cuts the file back
    and copies again from a new slot. The file ends with each row copied once, and upserting
    its lines gives the server's tables."""
    make_tables(db.conninfo)
    out = tmp_path / "out"
    stderr = tmp_path / "stderr"
    rng = random.Random(15)
    writer = Writer(db.conninfo, seed=2)
    writer.start()
    try:
        def grown(attempt: int) -> Callable[[], bool]:
            # Killed once the file has grown by a random amount, small beside the copy
            # (70 MB), so that a run seldom finishes it; every other kill also waits for a
            # durable record of the copy (about a second in), so that both ways on are
            # taken however fast the machine is.
            threshold = size(out) + rng.randint(10_000, 5_000_000)

            def reached() -> bool:
                if snapshot_state(out)[1]:
                    return True
                if attempt % 2 == 1 and not copy_left(progress_of(out).get("incremental")):
                    return False
                return size(out) > threshold

            return reached

        split_at_kill = []  # whether a kill found a record of a table copied in ranges

        def under_way() -> bool:
            split_at_kill.append(bool(progress_of(out).get("incremental", {}).get("ranges")))
            return snapshot_state(out)[0]

        kill_during(command(db.conninfo, out), env, stderr, kills=5, attempts=20,
                    until=grown, under_way=under_way)
        # big (20 MB) is split across the two workers; resumed, each range goes on after its
        # own last key
        assert any(split_at_kill), split_at_kill
        proc = start_cli(command(db.conninfo, out), env=env, stderr_path=stderr)
        try:
            finish_copy(db.conninfo, out, writer)
        finally:
            assert stop_process(proc) == 0, stderr.read_text()
    finally:
        writer.done.set()
    assert "going on with the tables left as an incremental snapshot" in stderr.read_text()
    check_upserted(db, read_lines(out), TABLES)


def cut_the_copy(conninfo: str, out: Path) -> None:
    """Terminate the COPYs of a copy under way (a network cut), once 8 MB are in ``out``."""
    wait_for(lambda: size(out) > 8_000_000 and query(
                 conninfo, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                           "FROM pg_stat_activity WHERE query LIKE 'COPY (SELECT %%'"
             )[0][0] > 0, timeout=300, interval=0.01, what="a COPY of the copy cut")


class Drained(threading.Thread):
    """A named pipe, read into ``out`` until its writer closes it; reading stops once 8 MB
    are in (so that the copy waits, under way, whatever the machine's speed) until
    ``release`` is set."""

    def __init__(self, fifo: Path, out: Path) -> None:
        super().__init__(daemon=True)
        os.mkfifo(fifo)
        self.fifo, self.out = fifo, out
        self.release = threading.Event()
        self.start()

    def run(self) -> None:
        with self.fifo.open("rb") as src, self.out.open("wb") as dst:
            while data := src.read(65536):
                dst.write(data)
                dst.flush()
                if dst.tell() > 8_000_000:
                    self.release.wait()


def resumed_copy_done(log: str) -> bool:
    """Whether the tables an interrupted copy left are copied (its incremental snapshot)."""
    left = re.findall(r"incremental snapshot of (\S+): resumed after key", log)
    return bool(left) and all(f"incremental snapshot of {t} done" in log for t in left)


@pytest.mark.slow
@pytest.mark.parametrize("into", ["file", "pipe"])
@pytest.mark.soak
def test_a_lost_connection_during_the_copy_goes_on_in_the_same_run(
        db: Any, env: dict[str, str], tmp_path: Path, into: str) -> None:
    """The copy's connections are terminated during the copy (a network cut): the run
    reconnects and goes on after the last chunk it delivered, as a restart would, instead
    of dropping the slot and copying everything again; also into a pipe, which records
    nothing of the copy. Each row once, and upserting the lines gives the tables."""
    make_tables(db.conninfo)
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    reader = Drained(tmp_path / "pipe", out) if into == "pipe" else None
    writer = Writer(db.conninfo, seed=3)
    proc = start_cli(command(db.conninfo, tmp_path / into if reader else out), env=env,
                     stderr_path=stderr)
    try:
        wait_for(lambda: slot_row(db.conninfo, "snap"), what="slot created")
        writer.start()
        cut_the_copy(db.conninfo, out)
        if reader is not None:
            reader.release.set()
        wait_for(lambda: resumed_copy_done(stderr.read_text()), timeout=600,
                 what="the copy done")
        n = writer.ops
        wait_for(lambda: writer.ops > n + 200, what="more changes after the copy")
        writer.stop()
        wait_acknowledged(db.conninfo, current_lsn(db.conninfo))
    finally:
        writer.done.set()
        assert stop_process(proc) == 0, stderr.read_text()
        if reader is not None:
            reader.release.set()
            reader.join(30)
    log = stderr.read_text()
    assert log.count("going on with the tables left as an incremental snapshot") == 1, log
    assert log.count("reconnecting in") == 1 and "copying again" not in log, log
    check_upserted(db, read_lines(out), TABLES)


@pytest.mark.slow
def test_a_lost_connection_during_a_copy_that_cannot_go_on_into_a_pipe_is_refused(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """--snapshot only into a pipe, cut: the copy can neither go on (only) nor be taken back
    from the pipe and copied again. The run stops saying so, rather than stream on with the
    copy cut short."""
    make_tables(db.conninfo)
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    reader = Drained(tmp_path / "pipe", out)
    proc = start_cli([*command(db.conninfo, tmp_path / "pipe")[:-1], "only"], env=env,
                     stderr_path=stderr)
    try:
        cut_the_copy(db.conninfo, out)
        reader.release.set()
        assert proc.wait(300) == 1, stderr.read_text()
    finally:
        reader.release.set()
        stop_process(proc)
        reader.join(30)
    assert "cannot go on from where it was" in stderr.read_text()


def paused_at(proc: Any, reached: Callable[[], bool], what: str) -> None:
    """Pause the command (SIGSTOP) once ``reached()``: it can then be signalled at that
    point of its work, whatever the machine's pace."""
    wait_for(lambda: proc.poll() is not None or reached(), timeout=600, interval=0.01,
             what=what)
    assert proc.poll() is None, f"the command exited ({proc.returncode}) before {what}"
    proc.send_signal(signal.SIGSTOP)


def terminated(proc: Any) -> int:
    """SIGTERM to a paused command, which goes on to handle it."""
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    return proc.wait(120)


@pytest.mark.slow
def test_a_copy_stopped_before_it_is_complete_says_so_and_endpos_finishes_it(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM during the copy, and again while the next run goes on with the tables left
    (as an incremental snapshot): each run exits with status 4, saying that the snapshot is
    not complete, and the file never records the copy done with tables left. A run with -E
    then finishes the copy before it stops, past -E (never exit 0 at -E with tables not
    copied, or record the copy done): each row once, and upserting the lines gives the
    tables."""
    make_tables(db.conninfo)
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    writer = Writer(db.conninfo, seed=4, pause=0.01)
    writer.start()
    try:
        proc = start_cli(command(db.conninfo, out), env=env, stderr_path=stderr)
        paused_at(proc, lambda: size(out) > 8_000_000, "8 MB of the copy written")
        assert terminated(proc) == 4, stderr.read_text()
        assert "stopped before the snapshot was complete" in stderr.read_text()
        assert snapshot_state(out) == (True, False)
        assert progress_of(out)["snapshot"] == "copying"

        proc = start_cli(command(db.conninfo, out), env=env, stderr_path=stderr)
        paused_at(proc, lambda: "resumed after key" in stderr.read_text(),
                  "the copy going on")
        assert terminated(proc) == 4, stderr.read_text()
        progress = progress_of(out)
        assert progress["snapshot"] == "incremental" and copy_left(progress["incremental"])

        endpos = current_lsn(db.conninfo)
        result = run_cli([*command(db.conninfo, out), "-E", str(endpos)], env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "going on until it is complete" in result.stderr, result.stderr[-3000:]
        assert snapshot_state(out) == (False, True)
        assert progress_of(out)["snapshot"] == "done"
        proc = start_cli(command(db.conninfo, out), env=env, stderr_path=stderr)
        try:
            finish_copy(db.conninfo, out, writer)  # the rest of the writer's changes
        finally:
            assert stop_process(proc) == 0, stderr.read_text()[-3000:]
    finally:
        writer.done.set()
    check_upserted(db, read_lines(out), TABLES)


@pytest.mark.slow
def test_snapshot_only_cut_short_says_how_to_finish_the_copy(db: Any, env: dict[str, str],
                                                             tmp_path: Path) -> None:
    """``--snapshot only`` killed once its file records tables left: its snapshot is gone,
    and the rest can only be copied from the slot's stream. Run again, it fails saying to
    run ``--snapshot initial``, and changes nothing (not an exit 0 with the tables left
    missing and the copy recorded done). That run finishes the copy: each row once, and
    upserting the lines gives the tables."""
    make_tables(db.conninfo)
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    only = [arg if arg != "initial" else "only" for arg in command(db.conninfo, out)]
    proc = start_cli(only, env=env, stderr_path=stderr)
    try:
        wait_for(lambda: proc.poll() is not None
                 or copy_left(progress_of(out).get("incremental")),
                 timeout=600, interval=0.01, what="a durable record of the copy")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert snapshot_state(out) == (True, False), "the copy was over before the kill"
    recorded, written = progress_of(out), size(out)
    result = run_cli(only, env=env, timeout=120)
    assert result.returncode != 0, result.stderr
    assert "did not finish" in result.stderr and "--snapshot initial" in result.stderr
    assert progress_of(out) == recorded and size(out) <= written
    proc = start_cli(command(db.conninfo, out), env=env, stderr_path=stderr)
    try:
        wait_for(lambda: snapshot_state(out)[1], timeout=600, what="the copy done")
    finally:
        assert stop_process(proc) == 0, stderr.read_text()[-3000:]
    assert "going on with the tables left as an incremental snapshot" in stderr.read_text()
    check_upserted(db, read_lines(out), TABLES)


def test_snapshot_needs_a_new_slot(db: Any, env: dict[str, str], tmp_path: Path) -> None:
    result = run_cli(["stream", "-d", db.conninfo, "-S", "s", "--publication", "pub",
                      "--snapshot", "initial"], env=env, timeout=60)
    assert result.returncode != 0
    assert "--snapshot needs --create-slot" in result.stderr


def test_a_column_list_without_the_key_is_copied_whole_in_several_chunks(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """A column list that leaves out the key: the table cannot be copied in key order (nor
    go on after an interruption), and its copy of more rows than a chunk takes all of
    them once."""
    if db.cluster.major_version < 15:
        pytest.skip("column lists need PostgreSQL 15")
    query(db.conninfo, """
        CREATE TABLE k (id int PRIMARY KEY, v text);
        INSERT INTO k SELECT g, 'v' || (g % 4000) FROM generate_series(1, 12000) g;
        CREATE PUBLICATION nokey FOR TABLE k (v);""")
    out = tmp_path / "out"
    result = run_cli(["stream", "-d", db.conninfo, "-S", "nokey", "--publication", "nokey",
                      "-f", str(out), "--create-slot", "--snapshot", "only"], env=env,
                     timeout=300)
    assert result.returncode == 0, result.stderr
    copied = Counter(ln["new"]["v"] for ln in read_lines(out))
    with psycopg.connect(db.conninfo) as conn:
        assert copied == Counter(v for v, in conn.execute("SELECT v FROM k"))


SYNCED = """
    CREATE TABLE f (id int PRIMARY KEY, owner text, amount numeric);
    CREATE TABLE c (id int PRIMARY KEY, secret text, shown int);
    CREATE TABLE part_lo (id int PRIMARY KEY, v text);
    CREATE TABLE part_hi (id int PRIMARY KEY, v text);
    CREATE TABLE pr (id int PRIMARY KEY, v text);
"""


def test_the_copy_equals_what_a_subscriber_s_table_sync_copies(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """A real subscription (another database of the same server, copy_data) to three
    publications: one table filtered by two of them, one of which publishes only UPDATE
    (table sync copies whatever ``publish`` says); a column list; a partitioned table
    published as its partitions, another through its root. Our copy of the same
    publications equals what the subscriber's table sync wrote; so does the copy of an
    unfiltered publication under the same filters read by --filters-from-publication
    (client-side); and one under --row-filter and --column-list equals SELECT with them.
    `--snapshot only` stops after the copy."""
    if db.cluster.major_version < 15:
        pytest.skip("row filters and column lists need PostgreSQL 15")
    query(db.conninfo, """
        CREATE TABLE f (id int PRIMARY KEY, owner text, amount numeric);
        INSERT INTO f SELECT g, CASE WHEN g % 2 = 0 THEN 'alice' ELSE 'bob' END, g / 3.0
          FROM generate_series(1, 1000) g;
        CREATE TABLE c (id int PRIMARY KEY, secret text, shown int);
        INSERT INTO c SELECT g, 'pw' || g, g FROM generate_series(1, 300) g;
        CREATE TABLE part (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
        CREATE TABLE part_lo PARTITION OF part FOR VALUES FROM (MINVALUE) TO (100);
        CREATE TABLE part_hi PARTITION OF part FOR VALUES FROM (100) TO (MAXVALUE);
        INSERT INTO part SELECT g, 'p' || g FROM generate_series(1, 250) g;
        CREATE TABLE pr (id int PRIMARY KEY, v text) PARTITION BY LIST (id);
        CREATE TABLE pr_odd PARTITION OF pr FOR VALUES IN (1, 3, 5, 7);
        CREATE TABLE pr_even PARTITION OF pr FOR VALUES IN (2, 4, 6, 8);
        INSERT INTO pr SELECT g, 'r' || g FROM generate_series(1, 8) g;
        CREATE PUBLICATION p1 FOR TABLE f WHERE (owner = 'alice' AND id < 500), c (id, shown),
          part;
        CREATE PUBLICATION p2 FOR TABLE f WHERE (amount > 300) WITH (publish = 'update');
        CREATE PUBLICATION p3 FOR TABLE pr WITH (publish_via_partition_root = true);
        CREATE PUBLICATION everything FOR TABLE f, c;
    """)
    subscriber = create_database(db.cluster)
    try:
        query(subscriber.conninfo, SYNCED)
        query(db.conninfo, "SELECT pg_create_logical_replication_slot('sync', 'pgoutput')")
        # (its slot made apart: a subscription to its own server cannot make it)
        query(subscriber.conninfo, sql.SQL(
            "CREATE SUBSCRIPTION sync CONNECTION {} PUBLICATION p1, p2, p3 "
            "WITH (create_slot = false, slot_name = 'sync')").format(
                sql.Literal(db.conninfo)).as_string(None))
        try:
            wait_for(lambda: query(subscriber.conninfo, "SELECT count(*) FILTER (WHERE "
                                   "srsubstate NOT IN ('r', 's')), count(*) "
                                   "FROM pg_subscription_rel") == [(0, 5)],
                     timeout=120, what="the subscriber's table sync")
        finally:
            query(subscriber.conninfo, "ALTER SUBSCRIPTION sync DISABLE; "
                                       "ALTER SUBSCRIPTION sync SET (slot_name = NONE); "
                                       "DROP SUBSCRIPTION sync")
        synced = server_tables(subscriber, [("public", t) for t in
                                            ("f", "c", "part_lo", "part_hi", "pr")], {})
        synced["public", "c"] = [{"id": r["id"], "shown": r["shown"]}
                                 for r in synced["public", "c"]]
    finally:
        drop_database(subscriber)

    def copy(name: str, *options: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
        out = tmp_path / name
        result = run_cli(["stream", "-d", db.conninfo, "-S", name, "-f", str(out),
                          "--create-slot", "--snapshot", "only", *options], env=env,
                         timeout=300)
        assert result.returncode == 0, result.stderr
        assert (slot_row(db.conninfo, name) or {}).get("active") is False  # it stopped
        lines = read_lines(out)
        assert lines and {ln["op"] for ln in lines} == {"snapshot"}
        return {table: ordered(list(rows.values())) for table, rows in apply(lines).items()}

    expected = {table: ordered(rows) for table, rows in synced.items()}
    assert copy("server", "--publication", "p1", "--publication", "p2",
                "--publication", "p3") == expected
    assert copy("client", "--publication", "everything", "--filters-from-publication", "p1",
                "--filters-from-publication", "p2") == {
        t: rows for t, rows in expected.items() if t[1] in ("f", "c")}
    by_hand = copy("by_hand", "--publication", "everything",
                   "--row-filter", "public.f:(id % 3 = 0 OR id = 7)",
                   "--column-list", "public.c:id,shown")
    rows = server_tables(db, [("public", "f")], {})["public", "f"]
    assert by_hand == {
        ("public", "f"): ordered([r for r in rows if r["id"] % 3 == 0 or r["id"] == 7]),
        ("public", "c"): expected["public", "c"]}


@pytest.mark.parametrize("emitter", ["text", "wal2json"])
def test_other_emitters_write_the_copy_as_inserts(db: Any, env: dict[str, str],
                                                  tmp_path: Path, emitter: str) -> None:
    """The text and wal2json emitters print copied rows as the inserts their users load:
    the same lines as for the rows inserted in one transaction (the stream's own inserts,
    the reference), but for the transaction's xid and LSNs."""
    query(db.conninfo, """
        CREATE TABLE ins (id int PRIMARY KEY, v text, n numeric, a text[]);
        INSERT INTO ins SELECT g, CASE WHEN g % 5 = 0 THEN NULL ELSE 'v' || g END, g * 0.25,
            ARRAY['x', NULL] FROM generate_series(1, 50) g;
        CREATE TABLE ins_copy (LIKE ins INCLUDING ALL);
        CREATE PUBLICATION pubins FOR TABLE ins, ins_copy;
    """)
    out = tmp_path / "out"
    options = ["-o", "format-version=2"] if emitter == "wal2json" else []
    proc = start_cli(["stream", "-d", db.conninfo, "-S", "ins", "--publication", "pubins",
                      "--emitter", emitter, *options, "-f", str(out), "--create-slot",
                      "--snapshot", "initial", "--status-interval", "0.2"], env=env,
                     stderr_path=tmp_path / "stderr")
    try:
        wait_for(lambda: progress_of(out).get("snapshot") == "done", timeout=120,
                 what="the copy done")
        query(db.conninfo, "INSERT INTO ins_copy SELECT * FROM ins ORDER BY id")
        wait_acknowledged_slot(db.conninfo, "ins", current_lsn(db.conninfo))
    finally:
        assert stop_process(proc) == 0, (tmp_path / "stderr").read_text()
    text = out.read_text().splitlines()
    if emitter == "text":
        copied = [ln for ln in text if ln.startswith("table public.ins:")]
        inserted = [ln.replace("public.ins_copy:", "public.ins:", 1) for ln in text
                    if ln.startswith("table public.ins_copy:")]
    else:
        rows = [json.loads(ln) for ln in text]
        copied = [_without_positions(r) for r in rows if r.get("table") == "ins"]
        inserted = [_without_positions({**r, "table": "ins"}) for r in rows
                    if r.get("table") == "ins_copy"]
    assert len(copied) == 50
    assert copied == inserted


def _without_positions(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("xid", "lsn", "nextlsn", "timestamp")}


SNAPSHOT_EMITTERS: dict[str, tuple[Callable[[], Any], dict[str, str | None]]] = {
    "json": (JsonEmitter, {}),
    # skip-empty-xacts: each chunk's first row goes to the callback (it prints the BEGIN)
    "text": (TestDecodingEmitter, {"skip-empty-xacts": None}),
    "wal2json": (Wal2JsonEmitter, {"format-version": "2"}),
}


@pytest.mark.native  # it counts the changes the C formatters took
@pytest.mark.parametrize("emitter", list(SNAPSHOT_EMITTERS))
def test_the_fast_path_writes_the_copy_as_the_change_callback_does(
        db: Any, emitter: str, tmp_path: Path) -> None:
    """The emitters' C formatters write the copied rows exactly as their change callbacks
    do, for every type of the tables (one path per change): a chunk at a time through their
    ``lines`` into a file, one row at a time, and without them."""
    make_tables(db.conninfo, rows=3000)
    query(db.conninfo, "INSERT INTO big VALUES (-1, 'NaN', NULL, E'tab\\there \\\\ \"q\" ü', "
                       "repeat('long', 3000))")
    with psycopg.connect(db.conninfo) as conn:
        tables = published_tables(conn, ["pub"])
        chunks = [chunk for table in tables for chunk in copy_chunks(conn, table, 700)]
    plugin, options = SNAPSHOT_EMITTERS[emitter]
    outputs = []
    counts: dict[str, Counter[str]] = {}
    for mode in ("lines", "line", "callback"):
        counts[mode] = Counter()
        pipeline = Pipeline(proto_version=4)
        out: Any = FileOutput(tmp_path / "out") if mode == "lines" else MemoryOutput()
        pipeline.add(with_fast_path(plugin(), counts[mode], fast=mode != "callback",
                                    batch=mode == "lines"), options=dict(options), output=out)
        pipeline.startup()
        pipeline.begin_snapshot()
        for chunk in chunks:
            assert chunk.table.relation is not None
            pipeline.snapshot_rows(chunk.table.relation, chunk.table.types, chunk.inserts,
                                   LSN("0/1000"), datetime(2026, 1, 1, tzinfo=UTC))
        pipeline.end_snapshot(LSN("0/1000"))
        if mode == "lines":
            out.close()
            outputs.append((tmp_path / "out").read_text().splitlines())
        else:
            outputs.append(out.lines)
    rows = sum(len(chunk.inserts) for chunk in chunks)
    assert counts["lines"]["batched"] > rows * 0.9
    assert counts["line"]["fast"] > rows * 0.9 and not counts["line"]["batched"]
    assert not counts["callback"]
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) >= rows


def test_a_large_table_is_copied_in_key_ranges_that_hold_each_row_once(
        db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables of SPLIT_BYTES or more are copied in one key range per worker, each in key
    order: the ranges, one after the other, are exactly the table's COPY in key order as the
    exported snapshot sees it (a single key, a key of two columns, a partitioned table), and
    the ledger records each range's progress as the incremental snapshot resumes it."""
    make_tables(db.conninfo, rows=20_000)
    query(db.conninfo, """
        CREATE TABLE pair (a int, b text, v text, PRIMARY KEY (a, b));
        INSERT INTO pair SELECT g % 50, 'k' || g, repeat('v', g % 40)
          FROM generate_series(1, 12000) g;
        ALTER PUBLICATION pub ADD TABLE pair""")
    monkeypatch.setattr(snapshot, "SPLIT_BYTES", 64 * 1024)
    with psycopg.connect(db.conninfo) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        exported = conn.execute("SELECT pg_export_snapshot()").fetchone()
        assert exported is not None
        # after the export: neither copy sees these
        query(db.conninfo, "INSERT INTO big VALUES (-5, 1, NULL, 'late', NULL); "
                           "DELETE FROM pair WHERE a = 7; UPDATE part SET v = 'late'")
        copy = snapshot.SnapshotCopy(db.conninfo, exported[0], workers=3)
        try:
            tables = copy.tables(["pub"])
            parts = copy.parts(tables)
            chunks = list(copy.chunks(parts, lambda: False, chunk_rows=700))
        finally:
            copy.close()
        whole = {t.qualified: [i for c in copy_chunks(conn, t, 100_000) for i in c.inserts]
                 for t in tables}
    names = {"public.big", "public.part", "public.pair"}
    assert {p.table.qualified for p in parts} == names
    assert {p.table.qualified for p in parts if p.index == 2} == names, parts
    for name in names:
        ranges = [[i for c in chunks if c.table.qualified == name and c.part == n
                   for i in c.inserts] for n in range(3)]
        assert all(ranges), (name, [len(r) for r in ranges])
        assert [i for r in ranges for i in r] == whole[name], name
        assert sum(c.last for c in chunks if c.table.qualified == name) == 3
    ledger = CopyLedger("s", parts, Decoder(1))
    first = [ledger.delivered(c)[0] for c in chunks]
    assert sum(first) == 3 and ledger.done and not ledger.record()["queue"]
    ledger = CopyLedger("s", parts, Decoder(1))
    big = [c for c in chunks if c.table.qualified == "public.big"]
    for c in big[:3]:
        ledger.delivered(c)
    recorded = ledger.record()["ranges"]["public.big"]
    bounds = [(p.after, p.upto) for p in parts if p.table.qualified == "public.big"]
    for n, (after, upto) in enumerate(bounds):
        got = [c for c in big[:3] if c.part == n and not c.last]
        last = row_key(Decoder(1), got[-1].table, got[-1].inserts[-1]) if got else after
        assert recorded[n] == ranges_text([(last, upto)])[0]


def test_an_output_that_cannot_record_the_copy_is_refused_before_the_slot(db: Any) -> None:
    """An output without a record of its progress (a MemoryOutput) cannot tell a later run
    that a copy did not finish: refused before anything is created."""
    make_tables(db.conninfo, rows=10)
    pipeline = Pipeline()
    pipeline.add(JsonEmitter(), output=MemoryOutput())
    config = SourceConfig(conninfo=db.conninfo, slot="refused", publications=["pub"],
                          create_slot=True, snapshot="initial", reconnect=False)
    with pytest.raises(SourceError, match='"json" cannot take the initial snapshot yet'):
        WalsenderSource(config, pipeline).run()
    assert slot_row(db.conninfo, "refused") is None


class SlowToStart(JsonEmitter):
    """A plugin whose startup takes a while (a Spark session's does: seconds)."""

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        time.sleep(1.5)
        super().startup(ctx, options, is_init)


def test_the_copy_outlives_the_server_s_idle_in_transaction_timeout(
        db: Any, tmp_path: Path) -> None:
    """The copy's connections hold the exported snapshot in a transaction that is idle
    while the plugins start (and while other workers copy): a database that ends such
    transactions after half a second (idle_in_transaction_session_timeout), and on 17 and
    later any transaction after a second (transaction_timeout), does not end theirs, and
    the copy is whole."""
    make_tables(db.conninfo, rows=3000)
    query(db.conninfo, sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout "
                               "= '500ms'").format(sql.Identifier(db.dbname)).as_string(None))
    if db.major_version >= 17:  # and no transaction longer than a second
        query(db.conninfo, sql.SQL("ALTER DATABASE {} SET transaction_timeout = '1s'").format(
            sql.Identifier(db.dbname)).as_string(None))
    pipeline = Pipeline()
    pipeline.add(SlowToStart(), output=FileOutput(tmp_path / "out"))
    config = SourceConfig(conninfo=db.conninfo, slot="idle", publications=["pub"],
                          create_slot=True, snapshot="only", reconnect=False,
                          snapshot_workers=3)
    WalsenderSource(config, pipeline).run()
    pipeline.shutdown()
    copied = Counter(ln["table"] for ln in read_lines(tmp_path / "out"))
    assert copied == {"big": 3000, "part": 300}


class SlowChunks(JsonEmitter):
    """A plugin that takes a while over each snapshot chunk (a transaction), so that the
    status line can be read while a copy runs."""

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        super().commit(ctx, txn, commit_lsn)
        if txn.is_snapshot:
            time.sleep(0.3)


def status_lines(db: Any, tmp_path: Path, name: str, pattern: str, **config: Any) -> str:
    """Run a source into a SlowChunks plugin until its status line matches ``pattern``;
    that line."""
    pipeline = Pipeline()
    pipeline.add(SlowChunks(), output=FileOutput(tmp_path / name))
    source = WalsenderSource(SourceConfig(conninfo=db.conninfo, slot=name, publications=["pub"],
                                          create_slot=True, reconnect=False,
                                          status_interval=0.2, **config), pipeline)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            source.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    status = StatusLine(source)
    line = ""

    def matched() -> bool:
        nonlocal line
        line = status.line()
        return bool(errors) or re.search(pattern, line) is not None

    try:
        try:
            wait_for(matched, timeout=60, interval=0.05, what="the status line")
        except TimeoutError:
            raise AssertionError(f"the status line was {line!r}, not like {pattern!r}") from None
        assert not errors, errors
        return line
    finally:
        source.request_stop()
        thread.join(60)
        pipeline.shutdown()


def test_the_status_line_says_how_far_a_snapshot_is(db: Any, tmp_path: Path) -> None:
    """During the initial copy the status line is the copy's progress (tables, rows of the
    server's estimate, MB/s, ETA); during an incremental snapshot the stream's line says
    how far the table is."""
    make_tables(db.conninfo, rows=60_000)
    query(db.conninfo, "ANALYZE big, part")  # the estimates the ETA is from
    line = status_lines(db, tmp_path, "initial", r"^snapshot: [01]/2 tables, [\d,]+ of "
                        r"~6\d,\d{3} rows, [\d.]+ MB/s, ETA \d+ s$", snapshot="initial")
    assert "received" not in line
    status_lines(db, tmp_path, "later", r"^received .* incremental snapshot of public\.big: "
                 r"0/1 tables, [1-9][\d,]* of ~6\d,\d{3} rows, [\d.]+ MB/s, ETA \d+ s$",
                 snapshot_tables=["public.big"])


def test_json_logs_carry_the_snapshot_s_figures(db: Any, env: dict[str, str],
                                                tmp_path: Path) -> None:
    """--log-format json: a snapshot's progress lines (each table copied, the end; every 10
    seconds in between) carry its figures under "snapshot", for the initial copy and for
    an incremental snapshot."""
    make_tables(db.conninfo, rows=20_000)
    query(db.conninfo, "ANALYZE big, part")
    only = [*command(db.conninfo, tmp_path / "out")[:-1], "only", "--log-format", "json"]
    result = run_cli(only, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    logs = [json.loads(line) for line in result.stderr.splitlines()]
    copied = [e for e in logs if e["message"].startswith("copied ")]
    assert [e["snapshot"]["tables_done"] for e in copied] == [1, 2]
    end = next(e["snapshot"] for e in logs if e["message"].startswith("initial snapshot done"))
    assert end["rows"] == end["rows_estimate"] == 22_000 and end["tables"] == 2
    assert end["done"] is True and end["eta_s"] is None and end["table"] is None
    assert end["bytes"] > 22_000 * 10 and end["rows_per_s"] > 0 and end["elapsed_s"] >= 0

    stderr = tmp_path / "stderr"
    proc = start_cli(["stream", "-d", db.conninfo, "-S", "snap", "--publication", "pub", "-f",
                      str(tmp_path / "again"), "--snapshot-table", "public.part",
                      "--log-format", "json"], env=env, stderr_path=stderr)
    try:
        wait_for(lambda: "incremental snapshot of public.part done" in stderr.read_text(),
                 what="the incremental snapshot done")
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    done = next(json.loads(line)["snapshot"] for line in stderr.read_text().splitlines()
                if "incremental snapshot of public.part done" in line)
    assert done["table"] == "public.part" and done["rows"] == 2_000
    assert done["tables"] == done["tables_done"] == 1 and done["rows_estimate"] == 2_000


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.text(), st.one_of(st.none(), st.text()),
                          st.lists(st.one_of(st.none(), st.text()), max_size=3)),
                min_size=1, max_size=30))
def test_the_c_copy_reader_gives_the_python_reader_s_messages(
        pg_module_db: Any, rows: list[tuple[str, str | None, list[str | None]]]) -> None:
    """The C module turns each COPY row into the Insert message that psycopg's parser and
    the protocol encoder make of it, byte for byte, for any text the server copies out
    (tabs, newlines, backslashes, \\N, non-ASCII...): read from libpq in C
    (``read_messages``), and read from Python (``copy_out``'s loop)."""
    if _copyrow is None:
        pytest.skip("the C module is not built")
    assert copy_reader_bound()  # Linux, psycopg's libpq found: the C reader is tested
    clean = [(a.replace("\x00", ""), None if b is None else b.replace("\x00", ""),
              [None if x is None else x.replace("\x00", "") for x in c]) for a, b, c in rows]
    with psycopg.connect(pg_module_db.conninfo) as conn:
        conn.execute("CREATE TEMP TABLE hostile (id serial PRIMARY KEY, a text, b text, "
                     "c text[], n numeric DEFAULT 1.50)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO hostile (a, b, c) VALUES (%s, %s, %s)", clean)
        table = TableCopy(0, "pg_temp", "hostile", False, ["id", "a", "b", "c", "n"], None)
        fast = [i for c in copy_chunks(conn, table, 7) for i in c.inserts]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(snapshot, "copy_reader_bound", lambda: False)
            unbound = [i for c in copy_chunks(conn, table, 7) for i in c.inserts]
        slow = [i for c in copy_chunks(conn, table, 7, fast=False) for i in c.inserts]
        conn.rollback()
    assert len(fast) == len(clean)
    assert fast == unbound == slow


@pytest.mark.parametrize("reader", ["c", "python"])
def test_the_copy_reader_leaves_the_connection_usable_and_reports_errors(
        db: Any, reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """copy_out, libpq's COPY loop, read in C or in Python: a consumer that stops early
    leaves the connection usable (the rest is read and dropped); a table it may not read,
    and a backend terminated in the middle of the copy, are psycopg's errors, as with
    psycopg's Copy."""
    if _copyrow is None:
        pytest.skip("the C module is not built")
    if reader == "python":
        monkeypatch.setattr(snapshot, "copy_reader_bound", lambda: False)
    else:
        assert copy_reader_bound()
    make_tables(db.conninfo, rows=60_000)
    with psycopg.connect(db.conninfo) as conn:
        table = published_tables(conn, ["pub"])[0]
        chunks = copy_chunks(conn, table, 100)
        first = next(chunks)
        assert len(first.inserts) == 100 and not first.last
        chunks.close()
        assert conn.execute("SELECT count(*) FROM big").fetchone() == (60_000,)
        whole = [i for c in copy_chunks(conn, table, 25_000) for i in c.inserts]
        assert len(whole) == 60_000 and whole[:100] == first.inserts

        query(db.conninfo, "CREATE ROLE copy_reader LOGIN; "
                           "GRANT USAGE ON SCHEMA public TO copy_reader")
    try:
        with psycopg.connect(db.conninfo, user="copy_reader") as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                list(copy_chunks(conn, table, 100))
            conn.rollback()
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        query(db.conninfo, "DROP OWNED BY copy_reader; DROP ROLE copy_reader")

    with psycopg.connect(db.conninfo) as conn:
        pid = conn.info.backend_pid
        # a copy slow enough (30 s) to be under way when its backend is terminated: a fast
        # one can be all sent, and over, by then
        slow = sql.SQL("COPY (SELECT * FROM big WHERE pg_sleep(0.0005) IS NOT NULL "
                       "ORDER BY id) TO STDOUT")
        chunks = copy_chunks(conn, table, 100, statement=slow)
        next(chunks)
        query(db.conninfo, "SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            for _ in chunks:
                pass


def finish_later(conninfo: str, slot: str, stderr: Path, stop: threading.Event,
                 writer: threading.Thread, table: str = "public.later") -> None:
    """Once the incremental snapshot of ``table`` is done: stop its writer, and wait for the
    stream to have every change it made."""
    wait_for(lambda: f"incremental snapshot of {table} done" in stderr.read_text(),
             timeout=300, what="the incremental snapshot done")
    stop.set()
    writer.join(30)
    wait_acknowledged_slot(conninfo, slot, current_lsn(conninfo))


def snapshot_while_writing(conninfo: str, env: dict[str, str], tmp_path: Path, table: str,
                           write: Callable[[threading.Event], None]) -> list[dict[str, Any]]:
    """`stream --create-slot --snapshot-table TABLE` (publication "pub") while ``write``
    changes the table, until the snapshot is done and the stream has every change: the
    lines."""
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    stop = threading.Event()
    writer = threading.Thread(target=write, args=(stop,), daemon=True)
    writer.start()
    proc = start_cli(["stream", "-d", conninfo, "-S", "written", "--publication", "pub",
                      "-f", str(out), "--status-interval", "0.2", "--create-slot",
                      "--snapshot-table", table], env=env, stderr_path=stderr)
    try:
        finish_later(conninfo, "written", stderr, stop, writer, table)
    finally:
        stop.set()
        assert stop_process(proc) == 0, stderr.read_text()
    return read_lines(out)


@pytest.mark.slow
def test_incremental_snapshot_of_a_table_added_to_a_running_stream(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """A table added to the publication of a running stream, then asked for with `pgdecode
    snapshot`, while a writer changes it (inserts, updates, key changes, deletes): the
    stream's changes and the chunks delivered between their watermarks, upserted, give the
    table; the other table streams on; no watermark reaches the output."""
    make_tables(db.conninfo, rows=30_000)
    query(db.conninfo, "CREATE TABLE later (id int PRIMARY KEY, v text, n numeric); "
                       "INSERT INTO later SELECT g, 'v' || g, g FROM generate_series(1, 60000) g")
    out = tmp_path / "out"
    stderr = tmp_path / "stderr"
    proc = start_cli(["stream", "-d", db.conninfo, "-S", "inc", "--publication", "pub",
                      "-f", str(out), "--status-interval", "0.2", "--create-slot"],
                     env=env, stderr_path=stderr)
    stop = threading.Event()
    writer = threading.Thread(target=change_later, args=(db.conninfo, stop, 3, 60000),
                              daemon=True)
    try:
        wait_for(lambda: (slot_row(db.conninfo, "inc") or {}).get("active"), what="streaming")
        writer.start()
        query(db.conninfo, "ALTER PUBLICATION pub ADD TABLE later")
        result = run_cli(["snapshot", "-d", db.conninfo, "-S", "inc", "--table", "public.later"],
                         env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        finish_later(db.conninfo, "inc", stderr, stop, writer)
    finally:
        stop.set()
        assert stop_process(proc) == 0, stderr.read_text()
    lines = read_lines(out)
    assert not any(ln["op"] == "message" for ln in lines)
    assert any(ln["op"] != "snapshot" and ln["table"] == "later" for ln in lines)
    check_upserted(db, lines)


@pytest.mark.slow
@pytest.mark.soak
def test_incremental_snapshot_keeps_the_toast_values_a_window_leaves_unchanged(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """Rows with a TOASTed value (stored out of line), changed inside their own chunk's
    window by updates and key changes that leave that value unchanged (so the server does
    not send it): the chunk's row is the stream's to give, and the value comes from the
    chunk at its high watermark. Rows such updates move into the part already copied are
    read again once the chunks are done. Upserting the lines gives the table, every value
    there."""
    query(db.conninfo, """
        CREATE TABLE later (id int PRIMARY KEY, v text, n numeric, doc text);
        ALTER TABLE later ALTER COLUMN doc SET STORAGE EXTERNAL;
        INSERT INTO later SELECT g, 'v' || g, g, repeat(md5(g::text), 100)
          FROM generate_series(1, 20000) g;
        CREATE PUBLICATION pub FOR TABLE later""")
    lines = snapshot_while_writing(db.conninfo, env, tmp_path, "public.later",
                                   lambda stop: change_later(db.conninfo, stop, 5, 20000))
    # the cases are there: updates that left the value out, of rows not copied before them,
    # some moving the row into the part copied
    left_out = [ln for ln in lines if ln["op"] == "update" and ln["unchanged_toast"] == ["doc"]]
    assert any(ln["new"]["id"] < 0 < ln["old"]["id"] for ln in left_out if ln["old"])
    check_upserted(db, lines)


def test_an_incremental_snapshot_reads_up_to_the_greatest_key_it_began_with(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """A table that grows at its end while it is read (a writer inserting ever greater
    keys, fifty a statement, at a pace the stream keeps up with): the snapshot reads up to
    the greatest key there was when it began, so it ends however fast the table grows. The
    rows inserted above that key while it read come from the stream only: hundreds of them
    are in the lines before its last rows (a read up to the table's end would have copied
    them), and upserting the lines gives the table."""
    query(db.conninfo, """
        CREATE TABLE later (id int PRIMARY KEY, v text, n numeric, doc text);
        INSERT INTO later SELECT g, 'v' || g, g, NULL FROM generate_series(1, 20000) g;
        CREATE PUBLICATION pub FOR TABLE later""")

    def grow(stop: threading.Event) -> None:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                conn.execute("INSERT INTO later SELECT g, 'new', 0 FROM generate_series("
                             "%s, %s) g", (100_000 + n, 100_000 + n + 49))
                n += 50
                time.sleep(0.01)

    lines = snapshot_while_writing(db.conninfo, env, tmp_path, "public.later", grow)
    last = max(i for i, ln in enumerate(lines) if ln["op"] == "snapshot")
    bound = max(ln["new"]["id"] for ln in lines if ln["op"] == "snapshot")
    above = [ln for ln in lines[:last] if ln["op"] == "insert" and ln["new"]["id"] > bound]
    assert len(above) >= 200, f"{len(above)} rows inserted above {bound} before its last rows"
    check_upserted(db, lines)


def change_keyed(conninfo: str, stop: threading.Event, seed: int, rows: int) -> None:
    """Insert, update, change either unique column of (id, code) and delete rows of table
    "keyed" until ``stop`` (new values far apart, so that no statement fails)."""
    r = random.Random(seed)
    statements = ["INSERT INTO keyed VALUES (%(n)s, %(n)s, 'new')",
                  "UPDATE keyed SET v = 'u' || v WHERE code = %(k)s",
                  "UPDATE keyed SET id = %(n)s WHERE code = %(k)s",
                  "UPDATE keyed SET code = %(n)s WHERE code = %(k)s",
                  "DELETE FROM keyed WHERE code = %(k)s"]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        n = 0
        while not stop.is_set():
            conn.execute(r.choice(statements), {"n": 1_000_000 + n, "k": r.randint(1, rows)})
            n += 1


@pytest.mark.slow
@pytest.mark.parametrize("constraints,identity", [
    # the replica identity index, not the primary key: an update of the primary key alone
    # sends no old key, so the chunk's row must be matched by the identity's columns
    ("PRIMARY KEY (id), UNIQUE (code)", "USING INDEX keyed_code_key"),
    # no primary key: a unique index on NOT NULL columns, the whole old row in the stream
    ("UNIQUE (code)", "FULL"),
], ids=["identity-index", "unique-not-null"])
def test_incremental_snapshot_reads_by_the_key_the_stream_identifies_rows_by(
        db: Any, env: dict[str, str], tmp_path: Path, constraints: str, identity: str) -> None:
    """A table keyed otherwise than by its primary key, snapshotted while a writer changes
    both unique columns: upserting the lines by that key gives the table."""
    query(db.conninfo, f"""
        CREATE TABLE keyed (id int NOT NULL, code int NOT NULL, v text, {constraints});
        ALTER TABLE keyed REPLICA IDENTITY {identity};
        INSERT INTO keyed SELECT g, g, 'v' || g FROM generate_series(1, 30000) g;
        CREATE PUBLICATION pub FOR TABLE keyed""")
    lines = snapshot_while_writing(db.conninfo, env, tmp_path, "public.keyed",
                                   lambda stop: change_keyed(db.conninfo, stop, 6, 30000))
    assert Counter(ln["op"] for ln in lines)["update"] > 100
    expected = server_tables(db, [("public", "keyed")], {})[("public", "keyed")]
    assert apply_upserts(lines, "keyed", "code") == {r["code"]: r for r in expected}
    assert "incremental snapshot of public.keyed: by code" in (tmp_path / "stderr").read_text()


@pytest.mark.parametrize("table,message", [
    ("public.nokey", "has no primary key, replica identity index or unique index on NOT "
                     "NULL columns"),
    ("public.elsewhere", "is not in the publications pub"),
])
def test_an_incremental_snapshot_it_cannot_take_is_refused(db: Any, env: dict[str, str],
                                                           tmp_path: Path, table: str,
                                                           message: str) -> None:
    make_tables(db.conninfo, rows=10)
    # (a unique index on a column that may be NULL is no key)
    query(db.conninfo, "CREATE TABLE nokey (a int UNIQUE, b text); "
                       "ALTER PUBLICATION pub ADD TABLE nokey;"
                       "CREATE TABLE elsewhere (id int PRIMARY KEY)")
    result = run_cli(["stream", "-d", db.conninfo, "-S", "refuse", "--publication", "pub",
                      "-f", str(tmp_path / "out"), "--create-slot", "--snapshot-table", table,
                      "--no-reconnect"], env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("table,publication,message", [
    ("public.nokey", None, "has no primary key, replica identity index or unique index on NOT "
                           "NULL columns"),
    ("public.elsewhere", None, "no publication publishes the table"),
    ("public.elsewhere", "pub", "is not in the publications pub"),
    ("public.nosuch", None, "there is no such table"),
    ("public.Big", None, "there is no such table"),
])
def test_pgdecode_snapshot_refuses_a_table_the_stream_could_not_take(
        db: Any, env: dict[str, str], table: str, publication: str | None,
        message: str) -> None:
    """Checked as the stream checks it, before anything is asked: exit 1 saying why, and
    no request in the slot's stream (the one good table asked with it is not asked
    either)."""
    make_tables(db.conninfo, rows=10)
    query(db.conninfo, "CREATE TABLE nokey (a int UNIQUE, b text); "
                       "ALTER PUBLICATION pub ADD TABLE nokey;"
                       "CREATE TABLE elsewhere (id int PRIMARY KEY)")
    assert run_cli(["slot", "create", "-d", db.conninfo, "-S", "asked"], env=env,
                   timeout=60).returncode == 0
    extra = ["--publication", publication] if publication else []
    result = run_cli(["snapshot", "-d", db.conninfo, "-S", "asked", "--table", "public.big",
                      "--table", table, *extra], env=env, timeout=60)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and result.stdout == ""

    def requests() -> list[tuple[Any, ...]]:
        query(db.conninfo, "CHECKPOINT")  # the WAL flushed: a peek reads no further
        return query(db.conninfo, """
            SELECT count(*) FROM pg_logical_slot_peek_binary_changes('asked', NULL, NULL,
              'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')
            WHERE substr(data, 1, 1) = 'M'::bytea""")

    assert requests() == [(0,)]
    good = run_cli(["snapshot", "-d", db.conninfo, "-S", "asked", "--table", "public.big"],
                   env=env, timeout=60)
    assert good.returncode == 0 and requests() == [(1,)], good.stderr


@pytest.mark.slow
@pytest.mark.soak
def test_incremental_snapshot_resumes_at_the_next_chunk_after_kill_9(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """`stream --snapshot-table`, killed at random points of the snapshot (3 times) while a
    writer changes the table: each restart goes on after the last chunk its file holds
    (FILE.progress), so no copied row is in the file twice, and upserting the lines gives
    the table, the TOASTed values the writer's updates leave out included (rows made whole
    at a chunk's high watermark). A restart after it finished does not copy the table
    again."""
    query(db.conninfo, """
        CREATE TABLE later (id int PRIMARY KEY, v text, n numeric, doc text);
        ALTER TABLE later ALTER COLUMN doc SET STORAGE EXTERNAL;
        INSERT INTO later SELECT g, 'v' || g, g,
            CASE WHEN g % 3 = 0 THEN repeat(md5(g::text), 70) END
          FROM generate_series(1, 80000) g;
        CREATE PUBLICATION pub FOR TABLE later""")
    out = tmp_path / "out"
    stderr = tmp_path / "stderr"
    command = ["stream", "-d", db.conninfo, "-S", "resumed", "--publication", "pub", "-f",
               str(out), "--status-interval", "0.2", "--create-slot", "--snapshot-table",
               "public.later"]
    stop = threading.Event()
    writer = threading.Thread(target=change_later, args=(db.conninfo, stop, 4, 80000),
                              daemon=True)
    writer.start()
    rng = random.Random(16)
    try:
        def snapshot_lines() -> int:
            return (out.read_text() if out.exists() else "").count('"op":"snapshot"')

        def copied(attempt: int) -> Callable[[], bool]:
            # Killed once this run has copied a random number of rows more than the file
            # already holds, small beside the table, so that three kills rarely finish it.
            threshold = snapshot_lines() + rng.randint(1, 15_000)
            return lambda: (snapshot_lines() > threshold
                            or "incremental snapshot of public.later done" in stderr.read_text())

        kill_during(command, env, stderr, kills=3, attempts=10, until=copied,
                    under_way=lambda: "table" in (progress_of(out).get("incremental") or {}))
        proc = start_cli(command, env=env, stderr_path=stderr)
        try:
            wait_for(lambda: "incremental snapshot of public.later done" in stderr.read_text()
                     or (progress_of(out).get("incremental") or {}).get("done"),
                     timeout=300, what="the snapshot done")
            stop.set()
            writer.join(30)
            wait_acknowledged_slot(db.conninfo, "resumed", current_lsn(db.conninfo))
        finally:
            assert stop_process(proc) == 0, stderr.read_text()
        again = run_cli([*command, "-E", str(current_lsn(db.conninfo))], env=env, timeout=120)
        assert again.returncode == 0, again.stderr
        assert "taken already into this output" in again.stderr
    finally:
        stop.set()
    log = stderr.read_text()
    assert "resumed after key" in log
    lines = read_lines(out)
    assert any(ln["op"] == "update" and ln["unchanged_toast"] == ["doc"] for ln in lines)
    check_upserted(db, lines)


def test_a_request_for_a_table_it_cannot_take_leaves_the_stream_running(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """`pgdecode snapshot --table` with a table that another publication publishes, not the
    stream's: the running stream says why and goes on streaming."""
    make_tables(db.conninfo, rows=10)
    query(db.conninfo, "CREATE TABLE elsewhere (id int PRIMARY KEY); "
                       "CREATE PUBLICATION other FOR TABLE elsewhere")
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    proc = start_cli(["stream", "-d", db.conninfo, "-S", "asked", "--publication", "pub",
                      "-f", str(out), "--status-interval", "0.2", "--create-slot"],
                     env=env, stderr_path=stderr)
    try:
        wait_for(lambda: (slot_row(db.conninfo, "asked") or {}).get("active"), what="streaming")
        result = run_cli(["snapshot", "-d", db.conninfo, "-S", "asked", "--table", "elsewhere"],
                         env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        wait_for(lambda: "is not in the publications pub" in stderr.read_text(),
                 what="the refusal")
        query(db.conninfo, "INSERT INTO big VALUES (-5, 1, NULL, 'after', NULL)")
        wait_acknowledged_slot(db.conninfo, "asked", current_lsn(db.conninfo))
        assert proc.poll() is None
    finally:
        assert stop_process(proc) == 0, stderr.read_text()
    assert [ln["new"]["id"] for ln in read_lines(out)] == [-5]


@pytest.mark.slow
@pytest.mark.soak
def test_incremental_snapshot_goes_on_after_lost_connections(db: Any, env: dict[str, str],
                                                             tmp_path: Path) -> None:
    """The walsender is terminated twice during `--snapshot-table small --snapshot-table
    later`, after small is done: the stream reconnects and the snapshots go on after their
    last chunk, knowing what they had done, so that a later run with the same command copies
    neither table again; each row is copied once."""
    query(db.conninfo, "CREATE TABLE later (id int PRIMARY KEY, v text, n numeric); "
                       "INSERT INTO later SELECT g, 'v' || g, g FROM generate_series(1, 80000) g;"
                       "CREATE TABLE small (id int PRIMARY KEY); "
                       "INSERT INTO small SELECT generate_series(1, 1000);"
                       "CREATE PUBLICATION pub FOR TABLE later, small")
    out, stderr = tmp_path / "out", tmp_path / "stderr"
    command = ["stream", "-d", db.conninfo, "-S", "lost", "--publication", "pub", "-f",
               str(out), "--status-interval", "0.2", "--create-slot", "--snapshot-table",
               "public.small", "--snapshot-table", "public.later"]
    stop = threading.Event()
    writer = threading.Thread(target=change_later, args=(db.conninfo, stop, 5, 80000),
                              daemon=True)
    writer.start()
    proc = start_cli(command, env=env, stderr_path=stderr)
    try:
        for cut in (1, 2):
            wait_for(lambda cut=cut: stderr.read_text().count("reconnecting in") >= cut - 1
                     and (slot_row(db.conninfo, "lost") or {}).get("active")
                     and size(out) > cut * 1_500_000, timeout=300, interval=0.01,
                     what="some chunks copied")
            log = stderr.read_text()
            assert "incremental snapshot of public.small done" in log
            assert "incremental snapshot of public.later done" not in log
            query(db.conninfo, "SELECT pg_terminate_backend(active_pid) "
                               "FROM pg_replication_slots WHERE slot_name = 'lost'")
        finish_later(db.conninfo, "lost", stderr, stop, writer)
    finally:
        stop.set()
        assert stop_process(proc) == 0, stderr.read_text()
    log = stderr.read_text()
    assert log.count("reconnecting in") >= 2, log
    again = run_cli([*command, "-E", str(current_lsn(db.conninfo))], env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("taken already into this output") == 2, again.stderr
    check_upserted(db, read_lines(out))


class AsksAgain(JsonEmitter):
    """The json emitter, asking its source for two rows (and one that is not there) again
    once, after the first transaction of the stream."""

    asked = False

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        super().commit(ctx, txn, commit_lsn)
        if not txn.is_snapshot and not self.asked:
            self.asked = True
            assert ctx.request_snapshot is not None
            ctx.request_snapshot("public.t", [["5"], ["7"], ["1000"]])


def test_requests_for_rows_read_them_again_and_endpos_waits_for_them(
        db: Any, tmp_path: Path) -> None:
    """A request message naming keys (as a mirror makes for rows it lacks values of), and a
    plugin's own request (``ctx.request_snapshot``): only the rows under those keys are read
    again, as snapshot rows, one under a key with no row is dropped, and -E, reached before
    the reads, waits for them."""
    query(db.conninfo, """
        CREATE TABLE t (id int PRIMARY KEY, v text);
        INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g;
        CREATE PUBLICATION p FOR TABLE t;""")
    query(db.conninfo, "SELECT pg_create_logical_replication_slot('asks', 'pgoutput')")
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        request_snapshot(conn, "asks", "public.t", [["9"]])
        conn.execute("UPDATE t SET v = 'changed' WHERE id = 7")
    endpos = current_lsn(db.conninfo)
    pipeline = Pipeline()
    pipeline.add(AsksAgain(), output=FileOutput(tmp_path / "out"))
    config = SourceConfig(conninfo=db.conninfo, slot="asks", publications=["p"],
                          endpos=endpos, reconnect=False)
    WalsenderSource(config, pipeline).run()
    pipeline.shutdown()
    lines = read_lines(tmp_path / "out")
    again = sorted(int(ln["new"]["id"]) for ln in lines if ln["op"] == "snapshot")
    assert again == [5, 7, 9]
    assert [ln["new"]["v"] for ln in lines if ln["op"] == "snapshot"
            and ln["new"]["id"] == 7] == ["changed"]
    assert [ln["op"] for ln in lines if ln["op"] != "snapshot"] == ["update"]
