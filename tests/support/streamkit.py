"""The tests' one place for streaming: probe emitters that record every callback as a JSON
line (installed as entry points a subprocess can load), running ``pgdecode stream`` and the
other commands, reading a slot through START_REPLICATION, capturing
tests/support/workload.py's transactions from a slot, reading a probe's output transaction
by transaction, and watching a slot. Raw captures through the SQL functions are
tests/support/capture.py's; recording plugins that run in-process are
tests/support/recorders.py's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg

from plugin_framework import LSN, OutputPlugin
from plugin_framework.protocol import XLogData
from plugin_framework.sources.replication import ReplicationStream
from support.capture import Captured, peek, pgoutput_options
from support.workload import END_PREFIX, Facts, create_schema, run_workload

# --- probe emitters -----------------------------------------------------------------------------


def _texts(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    out: dict[str, Any] = {}
    for i, col in enumerate(row.relation.columns):
        kind = row.kind(i)
        raw = row.raw(i)
        if kind == "n":
            out[col.name] = None
        elif kind == "u":
            out[col.name] = {"unchanged": True}
        elif kind == "b":
            out[col.name] = {"binary": (raw or b"").hex()}
        else:
            out[col.name] = (raw or b"").decode()
    return out


class Probe(OutputPlugin):
    """Ordinary callbacks: a JSON line for each, with what the tests look at."""

    name = "probe"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        self.is_init = is_init
        self.options = dict(ctx.output_plugin_options)
        if "fail" in self.options:
            raise ValueError(f"asked to fail: {self.options['fail']}")

    def _emit(self, ctx: Any, cb: str, **fields: Any) -> None:
        ctx.emit(json.dumps({"cb": cb, **fields}, sort_keys=True))

    def begin(self, ctx: Any, txn: Any) -> None:
        self._emit(ctx, "begin", xid=txn.xid, is_init=self.is_init, options=self.options,
                   origin=txn.origin, final_lsn=str(txn.final_lsn))

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self._emit(ctx, "change", xid=txn.xid, table=relation.name, action=str(change.action),
                   new=_texts(change.new), old=_texts(change.old), lsn=str(change.lsn))

    def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        self._emit(ctx, "truncate", xid=txn.xid, tables=sorted(r.name for r in relations))

    def message(self, ctx: Any, txn: Any, message_lsn: Any, transactional: bool, prefix: str,
                message: bytes) -> None:
        self._emit(ctx, "message", xid=txn.xid if txn is not None else None,
                   transactional=transactional, prefix=prefix,
                   content=bytes(message).decode(errors="replace"), lsn=str(message_lsn))

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self._emit(ctx, "commit", xid=txn.xid, lsn=str(commit_lsn), end_lsn=str(txn.end_lsn))


class StreamProbe(Probe):
    """Also the stream callbacks: large transactions arrive block by block."""

    name = "probe-stream"

    def stream_start(self, ctx: Any, txn: Any) -> None:
        self._emit(ctx, "stream_start", xid=txn.xid)

    def stream_stop(self, ctx: Any, txn: Any) -> None:
        self._emit(ctx, "stream_stop", xid=txn.xid)

    def stream_change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self._emit(ctx, "stream_change", xid=txn.xid, subxid=change.xid, table=relation.name,
                   action=str(change.action), new=_texts(change.new), old=_texts(change.old))

    def stream_abort(self, ctx: Any, txn: Any, abort_lsn: Any) -> None:
        top = txn.toptxn.xid if txn.toptxn is not None else txn.xid
        self._emit(ctx, "stream_abort", xid=top, subxid=txn.xid,
                   abort_lsn=None if abort_lsn is None else str(abort_lsn))

    def stream_commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self._emit(ctx, "stream_commit", xid=txn.xid, lsn=str(commit_lsn),
                   end_lsn=str(txn.end_lsn))


class TwoPhaseProbe(Probe):
    """Also the two-phase callbacks: prepared transactions arrive at PREPARE."""

    name = "probe-2pc"

    def begin_prepare(self, ctx: Any, txn: Any) -> None:
        self._emit(ctx, "begin_prepare", xid=txn.xid, gid=txn.gid)

    def prepare(self, ctx: Any, txn: Any, prepare_lsn: Any) -> None:
        self._emit(ctx, "prepare", xid=txn.xid, gid=txn.gid, lsn=str(prepare_lsn))

    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self._emit(ctx, "commit_prepared", xid=txn.xid, gid=txn.gid, lsn=str(commit_lsn))

    def rollback_prepared(self, ctx: Any, txn: Any, prepare_end_lsn: Any,
                          prepare_time: Any) -> None:
        self._emit(ctx, "rollback_prepared", xid=txn.xid, gid=txn.gid)


PROBES = {"probe": "Probe", "probe-stream": "StreamProbe", "probe-2pc": "TwoPhaseProbe"}


def install_probes(directory: Path) -> Path:
    """Make the probes loadable as emitters by a subprocess that has ``directory`` on its
    PYTHONPATH: a dist-info with entry points in the ``pgdecode.emitters`` group."""
    directory.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).resolve()
    (directory / "pgdecode_probes.py").write_text(
        f"import sys\nsys.path.insert(0, {str(source.parents[1])!r})\n"
        "from support.streamkit import Probe, StreamProbe, TwoPhaseProbe  # noqa: F401\n"
    )
    info = directory / "pgdecode_probes-0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pgdecode-probes\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[pgdecode.emitters]\n"
        + "".join(f"{name} = pgdecode_probes:{cls}\n" for name, cls in PROBES.items())
    )
    return directory


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """A probe's output file, one JSON object per line."""
    return [_line(line) for line in Path(path).read_bytes().splitlines() if line]


def _line(line: bytes) -> Any:
    """orjson's parse (a probe's output can be millions of lines), else the json module's:
    NaN and integers past 64 bits, which orjson refuses."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def transactions(lines: Iterable[dict[str, Any]], *,
                 between: bool = False) -> list[list[dict[str, Any]]]:
    """A probe's lines, transaction by transaction (begin to commit), checking that they are
    a sequence of whole transactions: none begins inside another, each commit ends the one
    open, none is cut short. A line outside every transaction (a non-transactional message, a
    two-phase callback) is an error unless ``between``; it is then in none of them."""
    found: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] | None = None
    for ln in lines:
        if ln["cb"] == "begin":
            assert current is None, f"transaction {ln['xid']} began inside {current[0]['xid']}"
            current = [ln]
        elif current is None:
            assert between and ln["cb"] != "commit", f"{ln} is outside every transaction"
        else:
            current.append(ln)
            if ln["cb"] == "commit":
                assert ln["xid"] == current[0]["xid"], (current[0], ln)
                found.append(current)
                current = None
    assert current is None, f"transaction {current[0]['xid']} is cut short"
    return found


def committed_xids(lines: Iterable[dict[str, Any]]) -> list[int]:
    """The xids of the whole transactions in a probe's output, in order, checking it as
    ``transactions`` does (two-phase callbacks may come between them)."""
    return [txn[0]["xid"] for txn in transactions(lines, between=True)]


# --- running the command line -------------------------------------------------------------------


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "plugin_framework.cli", *args]


# The JVM options of the tests' own Spark session (spark_fixtures.new_session) for the Spark
# a command starts: a JVM that lives for one test starts and warms up faster with C1 alone
# and one GC thread (on two cores, about a third of a short mirror run's time).
SPARK_SUBMIT_ARGS = ("--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' "
                     "pyspark-shell")


def cli_env(probes: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PGDECODE_EMITTER_ALLOWLIST", None)
    env.setdefault("PYSPARK_SUBMIT_ARGS", SPARK_SUBMIT_ARGS)
    if probes is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(probes), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def run_cli(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), env=env or cli_env(), capture_output=True,
                          text=True, timeout=timeout, input=input)


def start_cli(args: Sequence[str], *, env: dict[str, str] | None = None,
              stderr_path: Path | None = None,
              new_session: bool = False) -> subprocess.Popen[bytes]:
    """The command in the background; stdout is discarded, stderr goes to ``stderr_path``.
    ``new_session``: in a process group of its own (so that its children, Spark's JVM, can
    be killed with it: ``os.killpg(proc.pid, ...)``)."""
    err: Any = subprocess.PIPE
    if stderr_path is not None:
        err = stderr_path.open("ab")
    try:
        return subprocess.Popen(cli_command(*args), env=env or cli_env(),
                                stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=new_session)
    finally:
        if stderr_path is not None:
            err.close()


def run_stream(conninfo: str, slot: str, out: str | Path, *args: str,
               env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``pgdecode stream -d CONNINFO -S SLOT -f OUT ARGS...``, to its end."""
    return run_cli(["stream", "-d", conninfo, "-S", slot, "-f", str(out), *args], env=env,
                   timeout=timeout)


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
                 timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


# --- watching the server ------------------------------------------------------------------------


def wait_for(condition: Callable[[], Any], timeout: float = 60, interval: float = 0.05,
             what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def query(conninfo: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def current_lsn(conninfo: str) -> LSN:
    return LSN(str(query(conninfo, "SELECT pg_current_wal_insert_lsn()")[0][0]))


def slot_row(conninfo: str, slot: str) -> dict[str, Any] | None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute("SELECT * FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
        if row is None:
            return None
        assert cur.description is not None
        return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def confirmed_flush(conninfo: str, slot: str) -> LSN:
    row = slot_row(conninfo, slot)
    assert row is not None, f"slot {slot} is gone"
    return LSN(str(row["confirmed_flush_lsn"]))


def wait_slot_inactive(conninfo: str, slot: str, timeout: float = 30) -> None:
    def inactive() -> bool:
        row = slot_row(conninfo, slot)
        return row is None or not row["active"]

    wait_for(inactive, timeout, what=f"slot {slot} released")


def create_slot(conninfo: str, slot: str, two_phase: bool = False) -> LSN:
    rows = query(conninfo,
                 "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput', "
                 "false, %s)", (slot, two_phase))
    return LSN(rows[0][0])


def changes_of(lines: Iterable[dict[str, Any]], table: str,
               callbacks: Sequence[str] = ("change",)) -> list[dict[str, Any]]:
    return [ln for ln in lines if ln["cb"] in callbacks and ln.get("table") == table]


# --- reading a slot in-process -------------------------------------------------------------------


def replicate(conninfo: str, slot: str, options: Mapping[str, str], timeout: float = 60.0,
              ready: threading.Event | None = None) -> list[Captured]:
    """The slot's changes through START_REPLICATION, up to tests/support/workload.py's end
    marker."""
    marker = END_PREFIX.encode() + b"\0"
    out: list[Captured] = []
    deadline = time.monotonic() + timeout
    with ReplicationStream(conninfo) as repl:
        repl.start(slot, LSN(0), options)
        if ready is not None:
            ready.set()
        while time.monotonic() < deadline:
            msg = repl.read(1.0)
            if isinstance(msg, XLogData):
                out.append(Captured(msg.wal_start, msg.data))
                if msg.data[:1] == b"M" and marker in msg.data:
                    return out
    raise TimeoutError(f"no end marker from slot {slot} within {timeout} s")


class LiveCapture(threading.Thread):
    """Streams a slot in the background while a workload runs, up to the end marker."""

    def __init__(self, conninfo: str, slot: str, options: Mapping[str, str]) -> None:
        super().__init__(daemon=True)
        self.args_ = (conninfo, slot, options)
        self.captured: list[Captured] = []
        self.error: BaseException | None = None
        self.started_streaming = threading.Event()

    def run(self) -> None:
        try:
            self.captured = replicate(*self.args_, ready=self.started_streaming)
        except BaseException as exc:  # re-raised in result()
            self.error = exc
            self.started_streaming.set()

    def result(self, timeout: float = 120.0) -> list[Captured]:
        self.join(timeout)
        if self.error is not None:
            raise self.error
        if self.is_alive():
            raise TimeoutError("live capture did not finish")
        return self.captured


@dataclass
class WorkloadCapture:
    """tests/support/workload.py's transactions, in a two-phase slot made before them."""

    db: Any
    facts: Facts
    slot: str
    proto: int  # the newest pgoutput protocol of the server

    def capture(self, streaming: bool = True) -> list[Captured]:
        """The slot's messages, peeked anew each time: the workload's last message is not
        transactional, and reaches the slot only once the server has flushed it to WAL."""
        with self.db.connect(autocommit=True) as conn:
            return peek(conn, self.slot, pgoutput_options(
                self.proto, streaming="on" if streaming else "off"))


def capture_workload(db: Any) -> WorkloadCapture:
    """The workload's schema, a two-phase slot, then the workload, on ``db``."""
    slot = f"{db.dbname}_workload"
    with db.connect(autocommit=True) as conn:
        create_schema(conn)
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (slot,))
        facts = run_workload(conn)
    return WorkloadCapture(db, facts, slot, 4 if db.major_version >= 16 else 3)


# --- a small workload with something for every option -------------------------------------------

SCHEMA = """
CREATE TABLE t1 (id int PRIMARY KEY, v text, n int);
CREATE TABLE t2 (id int PRIMARY KEY, v text);
CREATE TABLE unpub (id int PRIMARY KEY, v text);
CREATE PUBLICATION p1 FOR TABLE t1;
CREATE PUBLICATION p2 FOR TABLE t2;
"""

BIG_ROWS = 3000  # well over logical_decoding_work_mem = 64kB: the server streams it
BIG_FIRST = 10_000


def create_tables(conninfo: str) -> None:
    query(conninfo, SCHEMA)


def run_options_workload(conninfo: str, *, origin: str | None = None) -> LSN:
    """Changes to both published tables and an unpublished one, logical messages, a large
    transaction with a rolled-back savepoint (streamed, with a subtransaction's Stream Abort),
    and, with ``origin``, a transaction replayed from that replication origin. Returns the
    WAL position after it."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        ex = conn.execute
        ex("INSERT INTO t1 VALUES (1, 'one', 10), (2, 'two', 20), (3, NULL, NULL)")
        ex("INSERT INTO t2 VALUES (1, 'uno'), (2, 'dos')")
        ex("INSERT INTO unpub VALUES (1, 'hidden')")
        with conn.transaction():
            ex("UPDATE t1 SET v = 'ONE' WHERE id = 1")
            ex("DELETE FROM t1 WHERE id = 2")
            ex("SELECT pg_logical_emit_message(true, 'probe-tx', 'in a transaction')")
        ex("SELECT pg_logical_emit_message(false, 'probe-nontx', 'on its own')")
        with conn.transaction():
            ex("INSERT INTO t1 SELECT g, 'big', g FROM generate_series(%s::int, %s::int) g",
               (BIG_FIRST, BIG_FIRST + BIG_ROWS - 1))
            ex("SAVEPOINT s")
            ex("INSERT INTO t1 SELECT g, 'gone', g FROM generate_series(%s::int, %s::int) g",
               (BIG_FIRST + BIG_ROWS, BIG_FIRST + 2 * BIG_ROWS - 1))
            ex("ROLLBACK TO SAVEPOINT s")
            ex("INSERT INTO t1 VALUES (-1, 'after the savepoint', -1)")
        if origin is not None:
            ex("SELECT pg_replication_origin_session_setup(%s)", (origin,))
            with conn.transaction():
                ex("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
                ex("INSERT INTO t1 VALUES (-2, 'from elsewhere', -2)")
            ex("SELECT pg_replication_origin_session_reset()")
        ex("INSERT INTO t2 VALUES (3, 'tres')")
    return current_lsn(conninfo)


def table_ids(conninfo: str, table: str) -> list[int]:
    return sorted(r[0] for r in query(conninfo, f"SELECT id FROM {table}"))


def applied_ids(lines: Iterable[dict[str, Any]], table: str) -> list[int]:
    """The ids a subscriber applying the probe's ordinary callbacks would have (inserts and
    deletes by key; updates keep their key in these tests)."""
    ids: dict[int, int] = {}
    for ln in lines:
        if ln["cb"] != "change" or ln["table"] != table:
            continue
        if ln["action"] == "INSERT":
            key = int(ln["new"]["id"])
            assert key not in ids, f"{table} id {key} inserted twice"
            ids[key] = 1
        elif ln["action"] == "DELETE":
            del ids[int(ln["old"]["id"])]
    return sorted(ids)


# --- metrics --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """The metrics served at 127.0.0.1:PORT/metrics, as ``{"name{label=value,...}": value}``
    (without the ``slot`` label); {} while nothing answers."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                              if k != "slot")
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out
