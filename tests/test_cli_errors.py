"""How ``pgdecode`` fails: a connection string is checked before it is used and its password
never printed; errors end in one message, never a traceback; a closed stdout ends the command
quietly; a truncated capture is replayed up to its last whole transaction; an output file that
cannot be written is named. Run as the real command line, against real servers where one is
involved."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgtest import TestDatabase
from psycopg.conninfo import conninfo_to_dict
from streamkit import (
    cli_env,
    install_probes,
    query,
    run_cli,
)

from plugin_framework.sources.capture import MAGIC
from plugin_framework.sources.cluster import LocalCluster
from plugin_framework.sources.errors import describe_conninfo, explain


@pytest.fixture(scope="session")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_probes(tmp_path_factory.mktemp("probes"))


@pytest.fixture
def env(probes: Path) -> dict[str, str]:
    return cli_env(probes)


def error_of(result: subprocess.CompletedProcess[str]) -> str:
    """The error that ended a command: one message, no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert "pgdecode: error: " in result.stderr, result.stderr
    return result.stderr[result.stderr.index("pgdecode: error: "):]


def write_capture(path: Path, header: Any, frames: bytes = b"") -> Path:
    path.write_bytes(MAGIC + json.dumps(header).encode() + b"\n" + frames)
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
    for conninfo, secrets in BAD_CONNINFOS:
        for command in commands_with_d(conninfo, tmp_path):
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
