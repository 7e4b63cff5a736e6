"""The one check of a slot (sources/slots.py, ``usable_slot``) that every source and command
runs before it uses one: a slot that is missing, physical, of another output plugin or of
another database gets the same message from ``stream`` (both sources), ``capture``,
``snapshot``, ``mirror``, ``slot create --if-not-exists`` and the Spark data source, before
anything is streamed or written; creating a slot says what it waits for. Run as the real
command line against real servers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.streamkit import query, run_cli, start_cli, stop_process, wait_for

from plugin_framework.sources.errors import SourceError
from plugin_framework.spark.datasource.options import SourceOptions
from plugin_framework.spark.datasource.peek import slot_position

pytestmark = pytest.mark.slow  # the command, in a process of its own


def prepare(db: Any) -> None:
    query(db.conninfo, "CREATE TABLE t (id int PRIMARY KEY, v text); "
                       "CREATE PUBLICATION pub FOR TABLE t")


def commands(conninfo: str, slot: str, tmp_path: Path) -> dict[str, list[str]]:
    stream = ["stream", "-d", conninfo, "-S", slot, "--publication", "pub", "--emitter",
              "probe", "-f", str(tmp_path / "out"), "--no-reconnect"]
    return {
        "stream": stream,
        "stream --source sql": [*stream, "--source", "sql"],
        "capture": ["capture", "-d", conninfo, "-S", slot, "--publication", "pub", "-f",
                    str(tmp_path / "out.cap"), "--no-reconnect"],
        "snapshot": ["snapshot", "-d", conninfo, "-S", slot, "--table", "public.t"],
        "mirror": ["mirror", "-d", conninfo, "-S", slot, "--publication", "pub", "--to",
                   str(tmp_path / "lake"), "--no-reconnect", "--master", "local[1]"],
        "slot create --if-not-exists": ["slot", "create", "-d", conninfo, "-S", slot,
                                        "--if-not-exists"],
    }


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("pgdecode: error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0].removeprefix("pgdecode: error: ")


@pytest.mark.parametrize("kind", ["test_decoding", "physical", "missing", "other-database"])
def test_every_command_refuses_a_slot_pgdecode_cannot_use_with_one_message(
        db: Any, env: dict[str, str], tmp_path: Path, kind: str) -> None:
    prepare(db)
    slot = f"{db.dbname}_{kind.replace('-', '_')}"
    if kind == "test_decoding":
        query(db.conninfo, "SELECT pg_create_logical_replication_slot(%s, 'test_decoding')",
              (slot,))
        says, status = (f'replication slot "{slot}" uses output plugin "test_decoding", not '
                        "pgoutput, which pgdecode reads: create a slot of its own"), 1
    elif kind == "physical":
        query(db.conninfo, "SELECT pg_create_physical_replication_slot(%s)", (slot,))
        says, status = (f'replication slot "{slot}" is a physical slot; pgdecode reads '
                        "logical slots of output plugin pgoutput"), 1
    elif kind == "other-database":
        query(db.cluster.conninfo("postgres"),
              "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        says, status = (f'replication slot "{slot}" belongs to database "postgres", not '
                        f'"{db.dbname}": connect to that database with -d'), 1
    else:
        says, status = f'replication slot "{slot}" does not exist: create it', 3
    try:
        for name, command in commands(db.conninfo, slot, tmp_path).items():
            if kind == "missing" and name == "slot create --if-not-exists":
                continue  # (it creates it)
            result = run_cli(command, env=env, timeout=300)
            assert result.returncode == status, (name, result.stderr)
            message = refusal(result)
            assert message.startswith(says), (name, message)
            assert "proto_version" not in message and '"None"' not in message, message
            # refused before anything was written: no output file left behind
            assert not (tmp_path / "out").exists(), name
            assert not (tmp_path / "out.cap").exists(), name
            assert not (tmp_path / "lake").exists() or name == "mirror", name
        if kind != "missing":  # (the data source says how to create it its own way)
            # the Spark data source, where it finds the slot (before a query plans anything)
            with pytest.raises(SourceError) as refused:
                slot_position(SourceOptions.parse({"dsn": db.conninfo, "slot": slot,
                                                   "publication": "pub"}))
            assert str(refused.value).startswith(says), str(refused.value)
    finally:
        where = db.cluster.conninfo("postgres") if kind == "other-database" else db.conninfo
        query(where, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s", (slot,))


def test_both_sources_say_once_that_an_existing_slot_is_not_two_phase(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """--create-slot --two-phase on a slot made without it: one warning, the same from
    either source, and the stream goes on (pgdecode never turns two-phase on)."""
    prepare(db)
    slot = f"{db.dbname}_plain"
    assert run_cli(["slot", "create", "-d", db.conninfo, "-S", slot], env=env).returncode == 0
    end = query(db.conninfo, "SELECT pg_current_wal_lsn()::text")[0][0]
    for source in ("walsender", "sql"):
        result = run_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub",
                          "--emitter", "probe", "-f", str(tmp_path / source), "--create-slot",
                          "--two-phase", "--source", source, "-E", end], env=env)
        assert result.returncode == 0, result.stderr
        warnings = [ln for ln in result.stderr.splitlines() if "two-phase" in ln]
        assert warnings == [
            f'pgdecode: WARNING: replication slot "{slot}" was created without two-phase '
            "decoding, which pgdecode never turns on for an existing slot: prepared "
            "transactions arrive at COMMIT PREPARED. For them at PREPARE, create a new slot "
            "with --two-phase"], result.stderr


@pytest.mark.parametrize("how", ["slot create", "stream --create-slot"])
def test_creating_a_slot_says_it_waits_for_an_open_prepared_transaction(
        db: Any, env: dict[str, str], tmp_path: Path, how: str) -> None:
    prepare(db)
    slot = f"{db.dbname}_waits"
    with db.connect(autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'open_one'")
    if how == "slot create":
        command = ["slot", "create", "-d", db.conninfo, "-S", slot]
    else:
        command = ["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub",
                   "--emitter", "probe", "-f", str(tmp_path / "out"), "--create-slot"]
    stderr = tmp_path / "stderr"
    proc = start_cli(command, env=env, stderr_path=stderr)
    try:
        wait_for(lambda: "open_one" in stderr.read_text() or proc.poll() is not None,
                 what="the line that says what the slot waits for")
        assert proc.poll() is None, stderr.read_text()  # it does wait
        assert (f'pgdecode: WARNING: creating replication slot "{slot}" waits until the 1 '
                "prepared transaction of the server ('open_one') is committed or rolled "
                "back") in stderr.read_text()
        query(db.conninfo, "COMMIT PREPARED 'open_one'")
        wait_for(lambda: query(db.conninfo, "SELECT 1 FROM pg_replication_slots WHERE "
                                            "slot_name = %s", (slot,)),
                 what="the slot, once the transaction ended")
        if how == "slot create":
            assert proc.wait(60) == 0, stderr.read_text()
    finally:
        # (first: a prepared transaction left open would keep every slot from being made)
        if query(db.conninfo, "SELECT 1 FROM pg_prepared_xacts WHERE gid = 'open_one'"):
            query(db.conninfo, "ROLLBACK PREPARED 'open_one'")
        if proc.poll() is None:
            assert stop_process(proc) == 0, stderr.read_text()
        query(db.conninfo, "SELECT pg_drop_replication_slot(slot_name) FROM "
                           "pg_replication_slots WHERE slot_name = %s", (slot,))
