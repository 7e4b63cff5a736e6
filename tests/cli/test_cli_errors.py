"""How ``pgdecode`` fails: a connection string is checked before it is used and its password
never printed; errors end in one message, never a traceback; a closed stdout ends the command
quietly; a truncated capture is replayed up to its last whole transaction; an output file that
cannot be written is named. Run as the real command line, against real servers where one is
involved."""

from __future__ import annotations

import json
import random
import resource
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from support.pgtest import TestDatabase
from support.streamkit import (
    cli_command,
    cli_env,
    confirmed_flush,
    create_slot,
    current_lsn,
    query,
    read_lines,
    run_cli,
    slot_row,
    start_cli,
    stop_process,
    transactions,
    wait_for,
)

from plugin_framework.cli.proctitle import masked_argv
from plugin_framework.cluster import LocalCluster
from plugin_framework.sources.capture import (
    MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    CaptureFormatError,
    read_capture,
)
from plugin_framework.sources.errors import describe_conninfo, explain

# Slow: each test runs the pgdecode command in a new process.
# `pytest -m "not server and not slow"`, the quick in-process suite, leaves it out.
pytestmark = pytest.mark.slow


def error_of(result: subprocess.CompletedProcess[str]) -> str:
    """The error that ended a command: one message, no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert "pgdecode: error: " in result.stderr, result.stderr
    return result.stderr[result.stderr.index("pgdecode: error: "):]


def write_capture(path: Path, header: Any) -> Path:
    """A capture of the current format that holds only a header (and its checksum)."""
    line = json.dumps(header).encode() + b"\n"
    path.write_bytes(MAGIC + line + struct.pack(">I", zlib.crc32(line)))
    return path


GOOD_HEADER = {"proto_version": 4, "options": {}, "server_version": 180000, "slot": "s",
               "created": "2026-01-01T00:00:00+00:00"}


# --- 1: the connection string ---------------------------------------------------------------

# (a -d string libpq cannot parse or would misread, the secrets in it)
BAD_CONNINFOS = [
    ("postgresql://bob:50%off@127.0.0.1:1/postgres", ["50%off", "off"]),
    ("postgresql://bob:S3cret@[::1]x/postgres", ["S3cret"]),
    ("postgresql://bob:S3cret@[::1/postgres", ["S3cret"]),
    ("postgresql://alice:Zq7/Wx9@127.0.0.1:1/postgres", ["Zq7", "Wx9"]),  # "/": host=alice
    ("postgresql://alice:Zq7@Wx9@127.0.0.1:1/postgres", ["Zq7", "Wx9"]),  # "@": host=Wx9@...
    ("host=127.0.0.1 port=1 password=Zq7 Wx9", ["Zq7", "Wx9"]),  # a blank, unquoted
]


def commands_with_d(conninfo: str, tmp_path: Path) -> list[list[str]]:
    return [
        ["stream", "-d", conninfo, "-S", "s", "--publication", "p", "--no-reconnect"],
        ["stream", "-d", conninfo, "-S", "s", "--publication", "p", "--no-reconnect",
         "--source", "sql"],
        ["stream", "-d", conninfo, "-S", "s", "--publication", "p", "--no-reconnect",
         "--row-filter", "public.t:(id > 1)"],
        ["capture", "-d", conninfo, "-S", "s", "--publication", "p", "--no-reconnect",
         "-f", str(tmp_path / "c.cap")],
        ["slot", "list", "-d", conninfo],
        ["slot", "create", "-d", conninfo, "-S", "s"],
        ["replay", str(write_capture(tmp_path / "h.cap", GOOD_HEADER)), "-d", conninfo,
         "--row-filter", "public.t:(id > 1)"],
    ]


GOOD_CONNINFOS = [
    "postgresql://alice:p%40ss%2Fw%25rd@127.0.0.1:1/postgres",  # encoded
    "postgresql://alice:p?ss@127.0.0.1:1/postgres",  # "?" in the password: libpq reads it
    "postgresql://127.0.0.1:1/postgres?user=me@example&password=p@ss",  # "@" in the query
]


def test_conninfo_checked_before_use(env: dict[str, str], tmp_path: Path) -> None:
    """Every command that takes -d refuses the first bad string; each other bad string is
    tried with one of them in turn (the check is the command line's, one for all: the whole
    cross product cost 42 runs of the command)."""
    for n, (conninfo, secrets) in enumerate(BAD_CONNINFOS):
        commands = commands_with_d(conninfo, tmp_path)
        for command in commands if n == 0 else [commands[n % len(commands)]]:
            result = run_cli(command, env=env, timeout=60)
            assert result.returncode == 2, (command, result.stderr)
            assert "percent-encode special characters in the user name and password" \
                in result.stderr
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
            for secret in secrets:
                assert secret not in result.stderr + result.stdout, (command, result.stderr)
            assert not (tmp_path / "c.cap").exists()
    for conninfo in GOOD_CONNINFOS:
        result = run_cli(["slot", "list", "-d", conninfo], env=env, timeout=60)
        assert result.returncode == 1, result.stderr  # refused by the server (there is none)
        assert "cannot connect to host=127.0.0.1 port=1" in error_of(result)
        assert "p@ss" not in result.stderr and "p?ss" not in result.stderr


@pytest.mark.parametrize(("conninfo", "secrets"), BAD_CONNINFOS)
def test_redaction_without_parsing(conninfo: str, secrets: list[str]) -> None:
    """What a library caller of the sources gets for such a string (the command line
    refuses it first): psycopg's own error, explained without the password."""
    try:
        psycopg.connect(conninfo, connect_timeout=5).close()
    except psycopg.Error as exc:
        error = exc
    else:
        pytest.fail("connected")
    message = str(explain(error, conninfo))
    assert describe_conninfo(conninfo) in message
    for secret in secrets:
        assert secret not in message, message
        assert secret not in describe_conninfo(conninfo)


def test_redaction_of_an_echo() -> None:
    conninfo = "postgresql://bob:Zq7%zz@127.0.0.1:1/postgres"
    with pytest.raises(psycopg.ProgrammingError) as caught:
        conninfo_to_dict(conninfo)
    assert "Zq7" in str(caught.value)  # libpq echoes the token
    assert "Zq7" not in str(explain(caught.value, conninfo))


# --- 2a: the catalog connection of the row filters -------------------------------------------


FILTERS = [("--row-filter", "public.t:(id > 1)"), ("--filters-from-publication", "p")]


def filtered_commands(conninfo: str, tmp_path: Path) -> Iterator[list[str]]:
    header_only = write_capture(tmp_path / "h.cap", GOOD_HEADER)
    for option in FILTERS:
        yield ["stream", "-d", conninfo, "-S", "s", "--publication", "p", "--no-reconnect",
               "-f", str(tmp_path / "out"), *option]
        yield ["replay", str(header_only), "-d", conninfo, "-f", str(tmp_path / "out"),
               *option]


def test_row_filters_cannot_connect(db: TestDatabase, env: dict[str, str],
                                    tmp_path: Path) -> None:
    missing_db = db.cluster.conninfo(f"{db.dbname}_nope")
    refused = "host=127.0.0.1 port=1 dbname=x user=someone"
    for conninfo, says in [(missing_db, f'database "{db.dbname}_nope" does not exist'),
                           (refused, "Connection refused")]:
        for command in filtered_commands(conninfo, tmp_path):
            result = run_cli(command, env=env, timeout=60)
            assert result.returncode == 1, (command, result.stderr)
            error = error_of(result)
            assert error.startswith(f"pgdecode: error: cannot connect to "
                                    f"{describe_conninfo(conninfo)}"), error
            assert says in error
            assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def password_cluster(pg: LocalCluster) -> Iterator[LocalCluster]:
    """A cluster of its own where role "alice" must give her password over TCP."""
    with LocalCluster(pg.bindir) as cluster:
        query(cluster.conninfo(), "CREATE ROLE alice LOGIN REPLICATION PASSWORD 'Right0ne'")
        hba = cluster.datadir / "pg_hba.conf"
        hba.write_text("host all alice 127.0.0.1/32 scram-sha-256\n"
                       "host replication alice 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        query(cluster.conninfo(), "SELECT pg_reload_conf()")
        yield cluster


def test_row_filters_wrong_password(password_cluster: LocalCluster, env: dict[str, str],
                                    tmp_path: Path) -> None:
    for conninfo in (password_cluster.conninfo(user="alice", password="Wr0ngPw"),
                     f"postgresql://alice:Wr0ngPw@127.0.0.1:{password_cluster.port}/postgres"):
        for command in filtered_commands(conninfo, tmp_path):
            result = run_cli(command, env=env, timeout=60)
            assert result.returncode == 1, (command, result.stderr)
            error = error_of(result)
            assert 'password authentication failed for user "alice"' in error
            assert "Check the user name and the password" in error
            assert "Wr0ngPw" not in result.stderr



# --- 2a': the password in the process title ---------------------------------------------------


@pytest.mark.parametrize(("argv", "expected"), [
    (["stream", "-d", "postgresql://alice:Zq7%40x@db/app", "-S", "s"],
     ["stream", "-d", "user=alice password=******** dbname=app host=db", "-S", "s"]),
    (["x", "--dbname=host=db password='Zq7 x' dbname=app"],
     ["x", "--dbname=password=******** dbname=app host=db"]),
    (["x", "-dpostgresql:///app?password=Zq7x&host=db"],
     ["x", "-dpassword=******** dbname=app host=db"]),
    (["x", "-d", "postgresql://alice:Zq7@x@db/app"], ["x", "-d", "(connection string hidden)"]),
    (["x", "-d", "host=db password=Zq7 x"], ["x", "-d", "(connection string hidden)"]),
    (["x", "-d", "host=db dbname=app", "-S", "password"], None),
])
def test_masked_argv(argv: list[str], expected: list[str] | None) -> None:
    assert masked_argv(argv) == expected


def test_password_hidden_from_the_process_title(password_cluster: LocalCluster,
                                                env: dict[str, str], tmp_path: Path) -> None:
    """`pgdecode stream -d URI-with-password` against a server that asks for it: once
    streaming, /proc/PID/cmdline (what ps shows every user) has the password masked, and
    the process name is left as it was."""
    cluster = password_cluster
    query(cluster.conninfo(), "CREATE TABLE IF NOT EXISTS pw_t (id int PRIMARY KEY)")
    query(cluster.conninfo(), "CREATE PUBLICATION pw_p FOR TABLE pw_t")
    slot = "pw_slot"
    conninfo = f"postgresql://alice:Right0ne@127.0.0.1:{cluster.port}/postgres"
    proc = start_cli(["stream", "-d", conninfo, "-S", slot, "--create-slot", "--publication",
                      "pw_p", "-f", str(tmp_path / "out")], env=env,
                     stderr_path=tmp_path / "stderr")
    try:
        wait_for(lambda: (slot_row(cluster.conninfo(), slot) or {}).get("active_pid")
                 or proc.poll() is not None, what="streaming")
        assert proc.poll() is None, (tmp_path / "stderr").read_text()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
    finally:
        stop_process(proc)
        query(cluster.conninfo(), "SELECT pg_drop_replication_slot(%s)", (slot,))
        query(cluster.conninfo(), "DROP PUBLICATION pw_p")
    assert b"Right0ne" not in cmdline, cmdline
    assert b"password=********" in cmdline and b"stream" in cmdline and b"pw_slot" in cmdline
    assert comm == Path(sys.executable).name[:15]
    assert "warning" not in (tmp_path / "stderr").read_text()

MASKED_EARLY = """
import sys
import setproctitle

titles = []
set_title = setproctitle.setproctitle
HEAVY = ("psycopg", "plugin_framework.framework", "plugin_framework.sources.errors")


def record(title):
    titles.append((title, [m for m in HEAVY if m in sys.modules]))
    set_title(title)


setproctitle.setproctitle = record
from plugin_framework.cli import main

main()
print(repr(titles))
"""


def test_the_password_is_masked_before_anything_heavy_is_imported(env: dict[str, str]) -> None:
    """The window in which ps shows a password given in -d ends before pgdecode loads
    psycopg or the framework (a few hundred milliseconds): the first title set hides every
    argument that may hold one, the last masks only the password."""
    uri = "postgresql://alice:Zq7secret@127.0.0.1:1/postgres"
    result = subprocess.run([sys.executable, "-c", MASKED_EARLY, "slot", "list", "-d", uri],
                            env=env, capture_output=True, text=True, timeout=60)
    titles = eval(result.stdout.strip().splitlines()[-1])
    assert len(titles) == 2, titles
    (first, loaded), (last, _) = titles
    assert loaded == [], f"the password stayed visible while {loaded} were imported"
    assert "Zq7secret" not in first and "(connection string hidden)" in first
    assert "Zq7secret" not in last and "password=********" in last and "slot list" in last


def test_an_option_value_with_a_line_break_is_refused(env: dict[str, str]) -> None:
    for value in ("include-xids=0\n", "topic-prefix=a\rb", "x=\x1b[31m"):
        result = run_cli(["stream", "-d", "host=127.0.0.1 port=1 dbname=x", "-S", "s",
                          "--publication", "p", "--no-reconnect", "-o", value], env=env,
                         timeout=60)
        assert result.returncode == 2, (value, result.stderr)
        assert f"option {value!r} holds the control character" in result.stderr
        assert "give it on one line" in result.stderr
        assert "cannot connect" not in result.stderr


# --- 2b: the capture's header ----------------------------------------------------------------


@pytest.mark.parametrize(("change", "says"), [
    ({"proto_version": 9}, '"proto_version" is 9, not a pgoutput protocol version (1 to 4)'),
    ({"proto_version": "x"}, '"proto_version" is "x", not a pgoutput protocol version'),
    ({"proto_version": True}, '"proto_version" is true, not a pgoutput protocol version'),
    ({"proto_version": None}, '"proto_version" is null'),
    ({"options": ["x"]}, '"options" is not an object of strings'),
    ({"options": {"streaming": 1}}, '"options" is not an object of strings'),
    ({"server_version": "18"}, '"server_version" is "18", not a server_version_num'),
    ({"slot": 5}, '"slot" is not a string'),
    ({"extra": 1}, 'unknown field "extra"'),
])
def test_bad_capture_header(env: dict[str, str], tmp_path: Path, change: dict[str, Any],
                            says: str) -> None:
    capture = write_capture(tmp_path / "bad.cap", {**GOOD_HEADER, **change})
    out = tmp_path / "out"
    result = run_cli(["replay", str(capture), "--emitter", "probe", "-f", str(out)], env=env)
    assert result.returncode == 1
    assert error_of(result).startswith(f"pgdecode: error: {capture}: bad capture header: {says}")
    assert not out.exists()  # refused before any output is opened


def test_capture_header_not_an_object(env: dict[str, str], tmp_path: Path) -> None:
    capture = write_capture(tmp_path / "bad.cap", [4])
    result = run_cli(["replay", str(capture), "--emitter", "probe"], env=env)
    assert result.returncode == 1 and "bad capture header: not a JSON object" in error_of(result)


# --- 2c: numeric options ---------------------------------------------------------------------


@pytest.mark.parametrize(("option", "value"), [
    ("--status-interval", "-5"), ("--status-interval", "nan"), ("--status-interval", "inf"),
    ("--status-interval", "0"), ("--memory-limit", "0"), ("--memory-limit", "-1"),
])
def test_numeric_options_checked_first(env: dict[str, str], option: str, value: str) -> None:
    commands = [["stream", "-d", "host=127.0.0.1 port=1 dbname=x", "-S", "s",
                 "--publication", "p", "--no-reconnect", f"{option}={value}"]]
    if option == "--status-interval":
        commands.append(["capture", "-d", "host=127.0.0.1 port=1 dbname=x", "-S", "s",
                         "--publication", "p", "--no-reconnect", "-f", "x.cap",
                         f"{option}={value}"])
    else:
        commands.append(["replay", "x.cap", f"{option}={value}"])
    for command in commands:
        result = run_cli(command, env=env, timeout=60)
        assert result.returncode == 2, (command, result.stderr)
        assert f"argument {option}: " in result.stderr and repr(value) in result.stderr
        assert "cannot connect" not in result.stderr


# --- captures from a real server --------------------------------------------------------------


class Captured:
    """Captures of one workload: a small transaction, a medium one, a large one (some 1.7 MB
    of probe output) and a small last one."""

    def __init__(self, db: TestDatabase, whole: Path, head: Path, slot: str, end: Any) -> None:
        self.db = db
        self.whole = whole  # all four transactions
        self.head = head  # the first two (some 130 kB of probe output)
        self.slot = slot  # a third slot, not read yet
        self.end = end


@pytest.fixture(scope="module")
def captured(pg_module_db: TestDatabase, probes: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Captured:
    db = pg_module_db
    env = cli_env(probes)
    directory = tmp_path_factory.mktemp("captures")
    query(db.conninfo, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    query(db.conninfo, "CREATE PUBLICATION p FOR TABLE t")
    slots = [f"{db.dbname}_{name}" for name in ("whole", "head", "live")]
    for slot in slots:
        create_slot(db.conninfo, slot)
    files = {"whole": directory / "whole.cap", "head": directory / "head.cap"}

    def capture(name: str, upto: Any) -> None:
        result = run_cli(["capture", "-d", db.conninfo, "-S", f"{db.dbname}_{name}",
                          "--publication", "p", "-E", str(upto), "-f", str(files[name])],
                         env=env)
        assert result.returncode == 0, result.stderr

    query(db.conninfo, "INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three')")
    query(db.conninfo, "INSERT INTO t SELECT g, repeat('m', 500) FROM generate_series(10, 209) g")
    capture("head", current_lsn(db.conninfo))
    query(db.conninfo, "INSERT INTO t SELECT g, repeat('x', 500) "
                       "FROM generate_series(1000, 3999) g")
    query(db.conninfo, "INSERT INTO t VALUES (5000, 'last'), (5001, 'very last')")
    end = current_lsn(db.conninfo)
    capture("whole", end)
    return Captured(db, files["whole"], files["head"], slots[2], end)


FRAME_HEAD = 8  # a frame's length and checksum, before its payload (format version 3)


def frames(path: Path) -> list[tuple[int, bytes]]:
    """(offset, payload) of every frame of a capture."""
    data = path.read_bytes()
    offset = data.index(b"\n", len(MAGIC)) + 1 + 4  # the header line and its checksum
    found = []
    while offset < len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        found.append((offset, data[offset + FRAME_HEAD:offset + FRAME_HEAD + length]))
        offset += FRAME_HEAD + length
    return found


def pgoutput_tag(payload: bytes) -> bytes:
    return payload[25:26] if payload[:1] == b"w" else b""  # after XLogData's 25-byte header


# --- 2d: a closed stdout ---------------------------------------------------------------------


@pytest.mark.parametrize("command", [["emitters"], ["replay", "CAPTURE", "--emitter", "probe"]])
def test_closed_stdout_ends_quietly(captured: Captured, env: dict[str, str],
                                    command: list[str]) -> None:
    """As pg_recvlogical -f - (killed by SIGPIPE): no message, the status a shell shows."""
    args = [str(captured.whole) if a == "CAPTURE" else a for a in command]
    proc = subprocess.Popen(cli_command(*args), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 141, err
    assert err == ""


# --- 3: a truncated or damaged capture -------------------------------------------------------


def last_commit_frame(path: Path) -> int:
    return [off for off, payload in frames(path) if pgoutput_tag(payload) == b"C"][-1]


@pytest.mark.parametrize("damage", ["truncated", "damaged"])
def test_truncated_capture_is_refused_or_replayed_in_whole_transactions(
        captured: Captured, env: dict[str, str], tmp_path: Path, damage: str) -> None:
    """Refused before anything is replayed; with --partial, replayed up to its last whole
    transaction, and still a failure that says so."""
    full = tmp_path / "full"
    result = run_cli(["replay", str(captured.whole), "--emitter", "probe", "-f", str(full)],
                     env=env)
    assert result.returncode == 0, result.stderr
    whole = transactions(read_lines(full))
    assert len(whole) == 4
    data = captured.whole.read_bytes()
    bad = tmp_path / "bad.cap"
    if damage == "truncated":  # in the middle of the last transaction's Commit frame
        bad.write_bytes(data[:last_commit_frame(captured.whole) + 10])
    else:  # a row of the last transaction that is no pgoutput message
        offset = [off for off, payload in frames(captured.whole)
                  if pgoutput_tag(payload) == b"I"][-1]
        bad.write_bytes(data[:offset + FRAME_HEAD + 25] + b"Z"
                        + data[offset + FRAME_HEAD + 26:])
    refused = run_cli(["replay", str(bad), "--emitter", "probe", "-f", str(tmp_path / "no")],
                      env=env)
    assert refused.returncode == 1
    assert error_of(refused).startswith(f"pgdecode: error: {bad} is truncated or damaged (")
    assert "nothing was replayed" in error_of(refused) and "--partial" in error_of(refused)
    assert not (tmp_path / "no").exists()  # refused before any output was opened
    for options in ([], ["--column-list", "public.t:id,v"]):  # checked as far as it goes
        out = tmp_path / f"out{len(options)}"
        result = run_cli(["replay", str(bad), "--partial", "--emitter", "probe", "-f",
                          str(out), *options], env=env)
        assert result.returncode == 1
        error = error_of(result)
        replayed = transactions(read_lines(out))
        assert replayed == whole[:3]  # the last one is not left half in the file
        end = replayed[-1][-1]["end_lsn"]
        assert error.startswith(f"pgdecode: error: {bad} is truncated or damaged (")
        assert f"replayed 3 transactions, up to {end}; the transaction it cuts short was " \
               "taken back out of the output" in error
        assert json.loads(Path(f"{out}.progress").read_text())["lsn"] == end
        # Replaying the whole capture into that file completes it.
        result = run_cli(["replay", str(captured.whole), "--emitter", "probe", "-f",
                          str(out), *options], env=env)
        assert result.returncode == 0, result.stderr
        assert transactions(read_lines(out)) == whole
    to_stdout = run_cli(["replay", str(bad), "--partial", "--emitter", "probe"], env=env)
    assert to_stdout.returncode == 1
    assert "the transaction it cuts short was partly written to stdout" in error_of(to_stdout)



# --- 3a: the order of a capture's frames ----------------------------------------------------


def damaged_order(path: Path, damage: str) -> tuple[bytes, str]:
    """The capture with a row of its 200-row transaction cut after, dropped, repeated or
    moved; and what the replay must say of it."""
    data = path.read_bytes()
    spans = [(off, off + FRAME_HEAD + len(p), p) for off, p in frames(path)]
    rows = [i for i, (_, _, p) in enumerate(spans) if pgoutput_tag(p) == b"I"]
    i = rows[len(rows) // 2]  # in the middle of the second transaction
    (start, end, _), (_, after, _) = spans[i], spans[i + 1]
    if damage == "cut":  # at a frame boundary
        return data[:end], f"it ends inside a transaction, at frame {i + 1} at byte {start}"
    if damage == "dropped":
        return data[:start] + data[end:], f"damaged frame {i + 1} at byte {start}"
    if damage == "repeated":
        return data[:end] + data[start:], f"damaged frame {i + 2} at byte {end}"
    assert damage == "moved"
    return (data[:start] + data[end:after] + data[start:end] + data[after:],
            f"damaged frame {i + 1} at byte {start}")


@pytest.mark.parametrize("damage", ["cut", "dropped", "repeated", "moved"])
def test_a_capture_cut_inside_a_transaction_or_with_a_frame_out_of_place_is_refused(
        captured: Captured, env: dict[str, str], tmp_path: Path, damage: str) -> None:
    """Each frame's checksum goes on from the one before it, and the capture must end
    between transactions: a capture cut at a frame boundary, or with one frame dropped,
    repeated or moved, is refused before anything is replayed, naming where; --partial
    replays the transaction before it, and fails all the same."""
    whole = tmp_path / "whole"
    result = run_cli(["replay", str(captured.head), "--emitter", "probe", "-f", str(whole)],
                     env=env)
    assert result.returncode == 0, result.stderr
    expected = transactions(read_lines(whole))
    assert [len(t) for t in expected] == [5, 202]  # 3 rows, then 200 rows
    data, says = damaged_order(captured.head, damage)
    bad = tmp_path / "bad.cap"
    bad.write_bytes(data)
    out = tmp_path / "out"
    refused = run_cli(["replay", str(bad), "--emitter", "probe", "-f", str(out)], env=env)
    assert refused.returncode == 1
    error = error_of(refused)
    assert error.startswith(f"pgdecode: error: {bad} is truncated or damaged ({says}"), error
    assert "nothing was replayed" in error
    assert not out.exists()
    partial = run_cli(["replay", str(bad), "--partial", "--emitter", "probe", "-f", str(out)],
                      env=env)
    assert partial.returncode == 1
    assert f"replayed 1 transaction, up to {expected[0][-1]['end_lsn']}" in error_of(partial)
    assert transactions(read_lines(out)) == expected[:1]
    assert bad.read_bytes() == data


def test_a_frame_dropped_from_a_version_2_capture_is_found_where_it_breaks_the_order(
        captured: Captured, env: dict[str, str], tmp_path: Path) -> None:
    """Version 2's checksums are each frame's own: a Commit dropped there is found by the
    order of the messages (the next transaction, streamed, begins inside the one it left
    open)."""
    v2 = older_format(captured.head, 2)
    path = tmp_path / "v2.cap"
    path.write_bytes(v2)
    offset, payload = next((off, p) for off, p in frames(path) if pgoutput_tag(p) == b"C")
    bad = tmp_path / "bad.cap"
    bad.write_bytes(v2[:offset] + v2[offset + FRAME_HEAD + len(payload):])
    out = tmp_path / "out"
    result = run_cli(["replay", str(bad), "--emitter", "probe", "-f", str(out)], env=env)
    assert result.returncode == 1
    assert "a Stream Start inside a transaction or stream block (a message is missing or " \
        "repeated)" in error_of(result)
    assert not out.exists()


# --- 3b: checksums ----------------------------------------------------------------------------


def read_all(path: Path) -> int:
    """Read a capture through, as a replay does; the number of frames."""
    _, messages = read_capture(path)
    return sum(1 for _ in messages)


def flipped(data: bytes, bit: int) -> bytes:
    damaged = bytearray(data)
    damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


def test_every_bit_flip_of_a_capture_is_refused(captured: Captured, tmp_path: Path) -> None:
    """Every bit of the header and the first frames (a Begin, a Relation, rows), and a sample
    of bits all over the rest: each flip is refused by the reader, naming what is damaged,
    never read as another stream."""
    data = captured.head.read_bytes()
    read_all(captured.head)  # the capture as written reads through
    rng = random.Random(14)
    bits = [*range(min(len(data), 2048) * 8), *rng.sample(range(len(data) * 8), 1500)]
    bad = tmp_path / "bad.cap"
    for bit in bits:
        bad.write_bytes(flipped(data, bit))
        with pytest.raises(CaptureFormatError) as caught:
            read_all(bad)
        message = str(caught.value)
        assert any(says in message for says in (
            "bad capture header", "is not a pgdecode capture", "format version",
            "damaged frame", "truncated frame")), (bit, message)


def test_a_damaged_frame_fails_the_replay_naming_it(captured: Captured, env: dict[str, str],
                                                    tmp_path: Path) -> None:
    """A bit flipped in the value of a row (the flip a decoder cannot see: the text is still
    text) fails the replay with the frame and its offset, exit status 1."""
    offset, payload = [(off, p) for off, p in frames(captured.head)
                       if pgoutput_tag(p) == b"I"][5]
    data = captured.head.read_bytes()
    where = offset + FRAME_HEAD + len(payload) - 2  # in the last column's text
    assert data[where:where + 1] == b"m"
    bad = tmp_path / "bad.cap"
    bad.write_bytes(data[:where] + b"n" + data[where + 1:])
    number = [off for off, _ in frames(captured.head)].index(offset) + 1
    out = tmp_path / "out"
    result = run_cli(["replay", str(bad), "--emitter", "probe", "-f", str(out)], env=env)
    assert result.returncode == 1
    assert (f"(damaged frame {number} at byte {offset}: its checksum does not match"
            in error_of(result)), result.stderr


def older_format(path: Path, version: int) -> bytes:
    """The capture at ``path`` in format version 1 (no checksums: a header line, frames of a
    length and a payload) or 2 (a CRC-32 of the header line, and of each frame on its
    own)."""
    data = path.read_bytes()
    header_end = data.index(b"\n", len(MAGIC)) + 1
    line = data[len(MAGIC):header_end]
    if version == 1:
        old = bytearray(MAGIC_V1 + line)
    else:
        old = bytearray(MAGIC_V2 + line + struct.pack(">I", zlib.crc32(line)))
    for _, payload in frames(path):
        length = struct.pack(">I", len(payload))
        old += length
        if version == 2:
            old += struct.pack(">I", zlib.crc32(payload, zlib.crc32(length)))
        old += payload
    return bytes(old)


def test_captures_of_format_versions_1_and_2_still_replay(
        captured: Captured, env: dict[str, str], tmp_path: Path) -> None:
    """Captures written before checksums (format version 1), or with one per frame on its
    own (version 2), replay as they did."""
    outputs = []
    for version in (None, 1, 2):
        capture = tmp_path / f"v{version}.cap"
        if version is None:
            capture = captured.head
        else:
            capture.write_bytes(older_format(captured.head, version))
        out = tmp_path / f"v{version}.out"
        result = run_cli(["replay", str(capture), "--emitter", "probe", "-f", str(out)],
                         env=env)
        assert result.returncode == 0, result.stderr
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0]
    future = tmp_path / "v4.cap"
    future.write_bytes(b"PGDECODE-CAPTURE 4\n" + captured.head.read_bytes()[len(MAGIC):])
    result = run_cli(["replay", str(future), "--emitter", "probe"], env=env)
    assert result.returncode == 1
    assert "format version 4, which this pgdecode does not read" in error_of(result)

# --- 7: output files -------------------------------------------------------------------------


def run_limited(args: list[str], env: dict[str, str], max_file_size: int
                ) -> subprocess.CompletedProcess[str]:
    """The command with files limited to ``max_file_size`` bytes: writing past it fails with
    EFBIG ("File too large"), as a full disk fails with ENOSPC (Python ignores SIGXFSZ)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_size, max_file_size))

    return subprocess.run(cli_command(*args), env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)


@pytest.mark.parametrize("capture", ["whole", "head"])
def test_output_file_cannot_be_written(captured: Captured, env: dict[str, str],
                                       tmp_path: Path, capture: str) -> None:
    """Failing in a callback's write (the whole capture's output is larger than the 1 MB
    buffer) or in the last flush (the head's is not): either way the file is named."""
    out = tmp_path / "out"
    result = run_limited(["replay", str(getattr(captured, capture)), "--emitter", "probe",
                          "-f", str(out)], env, 4096)
    assert result.returncode == 1
    assert error_of(result).strip() == (
        f"pgdecode: error: cannot write to {out}: File too large. Make room there (or give "
        "another file with -f) and run the command again: it goes on from what the file holds")


def test_stream_output_file_cannot_be_written(captured: Captured, env: dict[str, str],
                                              tmp_path: Path) -> None:
    db = captured.db
    slot = f"{captured.slot}_copy"
    query(db.conninfo, "SELECT pg_copy_logical_replication_slot(%s, %s)", (captured.slot, slot))
    before = confirmed_flush(db.conninfo, slot)
    out = tmp_path / "out"
    result = run_limited(["stream", "-d", db.conninfo, "-S", slot, "--publication", "p",
                          "-E", str(captured.end), "--emitter", "probe", "-f", str(out),
                          "--no-reconnect"], env, 4096)
    assert result.returncode == 1
    assert f"pgdecode: error: cannot write to {out}: File too large." in error_of(result)
    assert confirmed_flush(db.conninfo, slot) == before  # nothing in the file, nothing acked


def test_output_file_cannot_be_opened(captured: Captured, env: dict[str, str],
                                      tmp_path: Path) -> None:
    db = captured.db
    missing = tmp_path / "no" / "such" / "dir"
    says = "give -f a file in an existing directory that you can write to"
    result = run_cli(["replay", str(captured.head), "--emitter", "probe", "-f",
                      str(missing / "out")], env=env)
    assert result.returncode == 1
    assert f"cannot open {missing / 'out'} for writing: No such file or directory: {says}" \
        in error_of(result)
    result = run_cli(["stream", "-d", db.conninfo, "-S", captured.slot, "--publication", "p",
                      "-E", str(captured.end), "--emitter", "probe", "-f",
                      str(missing / "out")], env=env)
    assert result.returncode == 1
    assert f"cannot open {missing / 'out'} for writing" in error_of(result)
    assert "streaming slot" not in result.stderr  # refused before connecting


def test_capture_file_checked_before_streaming(captured: Captured, env: dict[str, str],
                                               tmp_path: Path) -> None:
    db = captured.db
    before = confirmed_flush(db.conninfo, captured.slot)
    missing = tmp_path / "no" / "such" / "dir" / "x.cap"
    result = run_cli(["capture", "-d", db.conninfo, "-S", captured.slot, "--publication", "p",
                      "-E", str(captured.end), "-f", str(missing)], env=env)
    assert result.returncode == 1
    assert f"cannot open {missing} for writing: No such file or directory" in error_of(result)
    assert "streaming slot" not in result.stderr  # refused before streaming started
    assert confirmed_flush(db.conninfo, captured.slot) == before
    # A capture that never got a message leaves no empty file behind.
    nothing = tmp_path / "nothing.cap"
    result = run_cli(["capture", "-d", db.conninfo, "-S", "no_such_slot", "--publication",
                      "p", "-f", str(nothing), "--no-reconnect"], env=env)
    assert result.returncode == 3 and "does not exist" in error_of(result)
    assert not nothing.exists()


# --- 4: demo -------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (["--emitter", "nope"], 'no emitter named "nope" is installed'),
    (["--emitter", "json", "-o", "nope=1"], 'option "nope" = "1" is unknown'),
    (["--emitter", "text", "-o", "include-xids=maybe"],
     'could not parse value "maybe" for parameter "include-xids"'),
    (["-f", "/nonexistent-dir/out"], "cannot open /nonexistent-dir/out for writing"),
])
def test_demo_refuses_bad_emitters_before_starting(env: dict[str, str], args: list[str],
                                                   says: str) -> None:
    result = run_cli(["demo", *args], env=env, timeout=300)
    assert result.returncode == 1
    assert says in error_of(result)
    assert "starting an embedded PostgreSQL" not in result.stderr


def test_demo_has_no_keep_option(env: dict[str, str]) -> None:
    result = run_cli(["demo", "--keep", "--emitter", "nope"], env=env, timeout=300)
    assert result.returncode == 2
    assert "unrecognized arguments: --keep" in result.stderr
