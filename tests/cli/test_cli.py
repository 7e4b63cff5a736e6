"""``pgdecode stream``, ``slot``, ``capture`` and ``replay`` run as the real command line (a
subprocess), on each server version: every option of ``stream`` has a visible effect."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from support.streamkit import (
    BIG_ROWS,
    applied_ids,
    confirmed_flush,
    create_slot,
    create_tables,
    current_lsn,
    query,
    read_lines,
    run_cli,
    run_options_workload,
    run_stream,
    slot_row,
    start_cli,
    stop_process,
    table_ids,
    wait_for,
)

from plugin_framework import LSN
from plugin_framework.cluster import LocalCluster
from plugin_framework.framework.registry import installed_emitters
from plugin_framework.sources.capture import verify_capture

# Slow: each test runs the pgdecode command in a new process.
# `pytest -m "not server and not slow"`, the quick in-process suite, leaves it out.
pytestmark = pytest.mark.slow


class Source:
    """A database with the options workload done, and a slot made before it ran."""

    def __init__(self, db: Any, end: Any, slot: str, origin: str) -> None:
        self.db = db
        self.end = end
        self.slot = slot
        self.origin = origin
        self._n = 0

    @property
    def conninfo(self) -> str:
        return str(self.db.conninfo)

    def new_slot(self) -> str:
        """Another slot that still has the whole workload (copied from the first)."""
        self._n += 1
        name = f"{self.slot}_{self._n}"
        query(self.conninfo, "SELECT pg_copy_logical_replication_slot(%s, %s)",
              (self.slot, name))
        return name


@pytest.fixture
def source(db: Any) -> Source:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_s"
    create_slot(db.conninfo, slot)
    origin = f"{db.dbname}_o"
    query(db.conninfo, "SELECT pg_replication_origin_create(%s)", (origin,))
    end = run_options_workload(db.conninfo, origin=origin)
    return Source(db, end, slot, origin)


def probe_stream(src: Source, env: dict[str, str], tmp_path: Path, *args: str,
                 emitter: str = "probe", slot: str | None = None, name: str = "out",
                 expect: int = 0) -> list[dict[str, Any]]:
    """``pgdecode stream`` up to the end of the workload; the probe's lines."""
    out = tmp_path / name
    command = ["-E", str(src.end), "--no-reconnect", *args]
    if "--publication" not in args:
        command += ["--publication", "p1", "--publication", "p2"]
    if "--emitter" not in args:
        command += ["--emitter", emitter]
    result = run_stream(src.conninfo, slot or src.new_slot(), out, *command, env=env)
    assert result.returncode == expect, result.stderr
    return read_lines(out) if expect == 0 else []


def callbacks(lines: list[dict[str, Any]]) -> set[str]:
    return {ln["cb"] for ln in lines}


def without_lsns(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lines without the LSNs that differ between the interfaces (the SQL functions give a
    change the LSN of its record, the walsender the start of the message it arrives in)."""
    return [{k: v for k, v in ln.items() if k != "lsn" or ln["cb"] == "commit"} for ln in lines]


# --- what the workload must look like, through any option --------------------------------------


def check_complete(src: Source, lines: list[dict[str, Any]], *, origin: bool = True) -> None:
    t1 = table_ids(src.conninfo, "t1")
    if not origin:
        t1.remove(-2)
    assert applied_ids(lines, "t1") == t1
    assert applied_ids(lines, "t2") == table_ids(src.conninfo, "t2")
    assert not [ln for ln in lines if ln.get("table") == "unpub"]
    begins = [ln["xid"] for ln in lines if ln["cb"] == "begin"]
    commits = [ln["xid"] for ln in lines if ln["cb"] == "commit"]
    assert begins == commits and len(set(begins)) == len(begins)


# --- stream: options ---------------------------------------------------------------------------


@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
def test_stream_both_sources_same_output(source: Source, env: dict[str, str], tmp_path: Path,
                                         source_kind: str) -> None:
    lines = probe_stream(source, env, tmp_path, "--source", source_kind)
    check_complete(source, lines)
    assert {"begin", "change", "commit", "message"} <= callbacks(lines)
    other = "sql" if source_kind == "walsender" else "walsender"
    again = probe_stream(source, env, tmp_path, "--source", other, name="other")
    assert without_lsns(again) == without_lsns(lines)


@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
def test_create_slot_plugins_see_is_init(db: Any, env: dict[str, str], tmp_path: Path,
                                         source_kind: str) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_new"
    out = tmp_path / "out"
    base = ["stream", "-d", db.conninfo, "-S", slot, "--publication", "p1", "--emitter",
            "probe", "-f", str(out), "--status-interval", "0.2", "--source", source_kind]
    proc = start_cli([*base, "--create-slot"], env=env)
    try:
        wait_for(lambda: slot_row(db.conninfo, slot), what="slot created")
        query(db.conninfo, "INSERT INTO t1 VALUES (1, 'a', 1)")
        wait_for(lambda: out.exists() and out.stat().st_size > 0, what="output")
    finally:
        assert stop_process(proc) == 0
    row = slot_row(db.conninfo, slot)
    assert row is not None and not row["temporary"] and not row["two_phase"]
    assert [ln["is_init"] for ln in read_lines(out) if ln["cb"] == "begin"] == [True]
    # The slot exists now: --create-slot leaves it, and the plugins are not initialising.
    query(db.conninfo, "INSERT INTO t1 VALUES (2, 'b', 2)")
    end = query(db.conninfo, "SELECT pg_current_wal_insert_lsn()::text")[0][0]
    result = run_cli([*base, "--create-slot", "-E", end], env=env)
    assert result.returncode == 0, result.stderr
    assert [ln["is_init"] for ln in read_lines(out) if ln["cb"] == "begin"] == [True, False]
    assert applied_ids(read_lines(out), "t1") == [1, 2]


def test_create_slot_two_phase(db: Any, env: dict[str, str], tmp_path: Path) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_2pc"
    out = tmp_path / "out"
    proc = start_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "p1",
                      "--emitter", "probe-2pc", "-f", str(out), "--create-slot", "--two-phase",
                      "--status-interval", "0.2"], env=env)
    try:
        wait_for(lambda: slot_row(db.conninfo, slot), what="slot created")
        with db.connect(autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t1 VALUES (1, 'prepared', 1)")
            conn.execute("PREPARE TRANSACTION 'cli-2pc'")

            def prepared() -> bool:
                return out.exists() and "prepare" in callbacks(read_lines(out))

            wait_for(prepared, what="the prepare")
            conn.execute("COMMIT PREPARED 'cli-2pc'")
        wait_for(lambda: "commit_prepared" in callbacks(read_lines(out)), what="commit")
    finally:
        assert stop_process(proc) == 0
    row = slot_row(db.conninfo, slot)
    assert row is not None and row["two_phase"]
    assert [ln["cb"] for ln in read_lines(out)] == [
        "begin_prepare", "change", "prepare", "commit_prepared"]


def test_two_phase_needs_create_slot(env: dict[str, str]) -> None:
    result = run_cli(["stream", "-d", "dbname=x", "-S", "s", "--publication", "p",
                      "--two-phase"], env=env)
    assert result.returncode == 2
    assert "--two-phase may only be specified with --create-slot" in result.stderr


@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
def test_endpos(db: Any, env: dict[str, str], tmp_path: Path, source_kind: str) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_e"
    create_slot(db.conninfo, slot)
    query(db.conninfo, "INSERT INTO t1 VALUES (1, 'before', 1)")
    query(db.conninfo, "INSERT INTO t1 VALUES (2, 'before', 2)")
    endpos = query(db.conninfo, "SELECT pg_current_wal_insert_lsn()::text")[0][0]
    query(db.conninfo, "INSERT INTO t1 VALUES (3, 'after', 3)")
    out = tmp_path / "out"
    result = run_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "p1",
                      "--emitter", "probe", "-f", str(out), "--endpos", endpos, "--source",
                      source_kind], env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = read_lines(out)
    assert applied_ids(lines, "t1") == [1, 2]
    last_end = [ln["end_lsn"] for ln in lines if ln["cb"] == "commit"][-1]
    assert confirmed_flush(db.conninfo, slot) >= LSN(last_end)
    # The rest is still in the slot.
    result = run_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "p1",
                      "--emitter", "probe", "-f", str(out), "-E",
                      query(db.conninfo, "SELECT pg_current_wal_insert_lsn()::text")[0][0],
                      "--source", source_kind], env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert applied_ids(read_lines(out), "t1") == [1, 2, 3]


def test_endpos_must_be_an_lsn(env: dict[str, str]) -> None:
    result = run_cli(["stream", "-d", "dbname=x", "-S", "s", "--publication", "p", "-E",
                      "tomorrow"], env=env)
    assert result.returncode == 2 and "tomorrow" in result.stderr


def supported_protocols(major: int) -> list[int]:
    return [1, 2, 3, 4] if major >= 16 else [1, 2, 3]


@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
def test_proto_versions(source: Source, env: dict[str, str], tmp_path: Path,
                        source_kind: str) -> None:
    for proto in supported_protocols(source.db.major_version):
        streaming = "off" if proto == 1 else "on"
        out = tmp_path / f"p{proto}"
        result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(),
                          "--publication", "p1", "--publication", "p2", "--emitter",
                          "probe-stream", "-E", str(source.end), "-f", str(out),
                          "--proto-version", str(proto), "--streaming", streaming,
                          "--source", source_kind], env=env)
        assert result.returncode == 0, result.stderr
        assert f"pgoutput protocol {proto}," in result.stderr
        lines = read_lines(out)
        streamed = "stream_start" in callbacks(lines)
        # Protocol 1 has no streaming: the large transaction comes whole, at its commit.
        assert streamed == (proto >= 2), proto
        assert len([ln for ln in lines if ln["cb"] in ("change", "stream_change")
                    and ln["table"] == "t1" and (ln["new"] or {}).get("v") == "big"]) >= BIG_ROWS


def test_proto_version_1_cannot_stream(source: Source, env: dict[str, str],
                                       tmp_path: Path) -> None:
    result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(),
                      "--publication", "p1", "-E", str(source.end), "--emitter", "probe",
                      "--proto-version", "1", "-f", str(tmp_path / "o")], env=env)
    assert result.returncode == 1
    assert "--streaming on needs pgoutput protocol version 2 or later" in result.stderr
    assert "--streaming off" in result.stderr


@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
def test_proto_version_not_supported(pg: LocalCluster, source: Source, env: dict[str, str],
                                     tmp_path: Path, source_kind: str) -> None:
    if pg.major_version >= 16:
        pytest.skip("PostgreSQL 16 and later speak every version --proto-version offers")
    result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(),
                      "--publication", "p1", "-E", str(source.end), "--emitter", "probe",
                      "--proto-version", "4", "--source", source_kind,
                      "-f", str(tmp_path / "o")], env=env)
    assert result.returncode == 1
    assert (f"PostgreSQL {pg.major_version} speaks pgoutput protocol up to version 3, not 4: "
            "use --proto-version 3 or leave it out") in result.stderr


def test_streaming_modes(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    major = source.db.major_version
    off = probe_stream(source, env, tmp_path, "--streaming", "off", emitter="probe-stream",
                       name="off")
    on = probe_stream(source, env, tmp_path, "--streaming", "on", emitter="probe-stream",
                      name="on")
    assert not {"stream_start", "stream_change"} & callbacks(off)
    assert {"stream_start", "stream_change", "stream_stop", "stream_commit"} <= callbacks(on)
    # The rolled-back savepoint was streamed, then aborted: a Stream Abort without the abort
    # LSN (that comes only with parallel streaming).
    aborts = [ln for ln in on if ln["cb"] == "stream_abort"]
    assert aborts and all(a["subxid"] != a["xid"] and a["abort_lsn"] is None for a in aborts)
    streamed_big = {ln["new"]["id"] for ln in on if ln["cb"] == "stream_change"
                    and (ln["new"] or {}).get("v") == "big"}
    assert len(streamed_big) == BIG_ROWS
    if major < 16:
        result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(),
                          "--publication", "p1", "-E", str(source.end), "--emitter", "probe",
                          "--streaming", "parallel", "-f", str(tmp_path / "o")], env=env)
        assert result.returncode == 1
        assert "--streaming parallel needs protocol version 4 (PostgreSQL 16+)" in result.stderr
        return
    parallel = probe_stream(source, env, tmp_path, "--streaming", "parallel",
                            emitter="probe-stream", name="parallel")
    assert {"stream_start", "stream_change", "stream_commit"} <= callbacks(parallel)
    aborts = [ln for ln in parallel if ln["cb"] == "stream_abort"]
    assert aborts and all(a["abort_lsn"] is not None for a in aborts)
    # A plugin without stream callbacks gets the same transactions either way.
    plain = [probe_stream(source, env, tmp_path, "--streaming", mode, name=f"plain-{mode}")
             for mode in ("off", "on", "parallel")]
    assert without_lsns(plain[0]) == without_lsns(plain[1]) == without_lsns(plain[2])


def test_no_messages(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    with_messages = probe_stream(source, env, tmp_path, name="with")
    messages = [ln for ln in with_messages if ln["cb"] == "message"]
    assert {(m["prefix"], m["transactional"]) for m in messages} == {
        ("probe-tx", True), ("probe-nontx", False)}
    without = probe_stream(source, env, tmp_path, "--no-messages", name="without")
    assert "message" not in callbacks(without)
    assert [ln for ln in with_messages if ln["cb"] != "message"] == without


def test_binary(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    text = probe_stream(source, env, tmp_path, name="text")
    binary = probe_stream(source, env, tmp_path, "--binary", name="binary")
    first_text = next(ln for ln in text if ln["cb"] == "change")
    first_binary = next(ln for ln in binary if ln["cb"] == "change")
    assert first_text["new"] == {"id": "1", "v": "one", "n": "10"}
    assert first_binary["new"] == {"id": {"binary": "00000001"},
                                   "v": {"binary": b"one".hex()},
                                   "n": {"binary": "0000000a"}}
    assert len(text) == len(binary)


def test_origin(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    default = probe_stream(source, env, tmp_path, name="default")
    assert source.origin in {ln["origin"] for ln in default if ln["cb"] == "begin"}
    if source.db.major_version < 16:
        result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(),
                          "--publication", "p1", "-E", str(source.end), "--emitter", "probe",
                          "--origin", "none", "-f", str(tmp_path / "o")], env=env)
        assert result.returncode == 1
        assert "the origin option needs PostgreSQL 16 or later" in result.stderr
        return
    any_origin = probe_stream(source, env, tmp_path, "--origin", "any", name="any")
    assert any_origin == default
    check_complete(source, any_origin)
    none = probe_stream(source, env, tmp_path, "--origin", "none", name="none")
    assert {ln["origin"] for ln in none if ln["cb"] == "begin"} == {None}
    check_complete(source, none, origin=False)


def test_publications(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    only_p1 = probe_stream(source, env, tmp_path, "--publication", "p1", name="p1")
    only_p2 = probe_stream(source, env, tmp_path, "--publication", "p2", name="p2")
    both = probe_stream(source, env, tmp_path, "--publication", "p1", "--publication", "p2",
                        name="both")
    assert {ln["table"] for ln in only_p1 if ln["cb"] == "change"} == {"t1"}
    assert {ln["table"] for ln in only_p2 if ln["cb"] == "change"} == {"t2"}
    check_complete(source, both)


def test_several_emitters_with_scoped_options(source: Source, env: dict[str, str],
                                              tmp_path: Path) -> None:
    slot = source.new_slot()
    out = tmp_path / "out"
    result = run_cli(["stream", "-d", source.conninfo, "-S", slot, "--publication", "p1",
                      "--publication", "p2", "-E", str(source.end), "-f", str(out),
                      "--emitter", "probe", "--emitter", "probe-stream",
                      "-o", "probe.only=1", "-o", "probe-stream.mine=x=y", "-o", "shared",
                      "-o", "both=2"], env=env)
    assert result.returncode == 0, result.stderr
    plain = read_lines(f"{out}.probe")
    streaming = read_lines(f"{out}.probe-stream")
    assert {json.dumps(ln["options"], sort_keys=True) for ln in plain if ln["cb"] == "begin"} \
        == {json.dumps({"only": "1", "shared": None, "both": "2"}, sort_keys=True)}
    assert {json.dumps(ln["options"], sort_keys=True) for ln in streaming
            if ln["cb"] == "begin"} == {
        json.dumps({"mine": "x=y", "shared": None, "both": "2"}, sort_keys=True)}
    check_complete(source, plain)
    assert "stream_start" in callbacks(streaming) and "stream_start" not in callbacks(plain)
    assert not out.exists()


def test_emitter_options_errors(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    common = ["stream", "-d", source.conninfo, "-S", source.new_slot(), "--publication", "p1",
              "-E", str(source.end), "-f", str(tmp_path / "o")]
    twice = run_cli([*common, "--emitter", "probe", "--emitter", "probe"], env=env)
    assert twice.returncode == 2 and "an emitter can be named once" in twice.stderr
    repeated = run_cli([*common, "--emitter", "probe", "-o", "a=1", "-o", "probe.a=2"], env=env)
    assert repeated.returncode == 2 and 'option "a" given twice' in repeated.stderr
    failing = run_cli([*common, "--emitter", "probe", "-o", "fail=please"], env=env)
    assert failing.returncode == 1 and "asked to fail: please" in failing.stderr
    unknown = run_cli([*common, "--emitter", "no-such-emitter"], env=env)
    assert unknown.returncode == 1 and 'no emitter named "no-such-emitter"' in unknown.stderr


def test_output_to_stdout(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    to_file = probe_stream(source, env, tmp_path)
    result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(),
                      "--publication", "p1", "--publication", "p2", "-E", str(source.end),
                      "--emitter", "probe"], env=env)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == to_file
    assert not list(Path.cwd().glob("*.progress"))


def test_log_format_json(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    ok = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(), "--publication",
                  "p1", "-E", str(source.end), "--emitter", "probe", "-f", str(tmp_path / "o"),
                  "--log-format", "json", "-v"], env=env)
    assert ok.returncode == 0, ok.stderr
    records = [json.loads(line) for line in ok.stderr.splitlines()]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any("pgoutput protocol" in r["message"] for r in records)
    failed = run_cli(["stream", "-d", source.conninfo, "-S", "no_such_slot", "--publication",
                      "p1", "--emitter", "probe", "--log-format", "json"], env=env)
    assert failed.returncode == 3  # the slot is missing: a restart cannot help
    records = [json.loads(line) for line in failed.stderr.splitlines()]
    assert records[-1]["level"] == "error"
    assert 'replication slot "no_such_slot" does not exist' in records[-1]["message"]


def test_status_interval_and_quiet(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    slot = source.new_slot()
    out = tmp_path / "out"
    proc = start_cli(["stream", "-d", source.conninfo, "-S", slot, "--publication", "p1",
                      "--emitter", "probe", "-f", str(out), "--status-interval", "0.3", "-q"],
                     env=env)
    try:
        # Acknowledged while the command runs, not only when it ends.
        wait_for(lambda: confirmed_flush(source.conninfo, slot) >= source.end, timeout=60,
                 what="acknowledgement of the workload")
        assert proc.poll() is None
    finally:
        assert stop_process(proc) == 0
    assert applied_ids(read_lines(out), "t1") == table_ids(source.conninfo, "t1")


# --- slot ---------------------------------------------------------------------------------------


def test_slot_commands(db: Any, env: dict[str, str]) -> None:
    d = db.conninfo
    name = f"{db.dbname}_cmd"

    def slot(*args: str) -> Any:
        return run_cli(["slot", *args, "-d", d], env=env)

    created = slot("create", "-S", name)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith(f"{name} created at ")
    row = slot_row(d, name)
    assert row is not None and row["plugin"] == "pgoutput" and not row["two_phase"]
    assert not row["temporary"]
    again = slot("create", "-S", name)
    assert again.returncode == 1 and "already exists" in again.stderr
    exists = slot("create", "-S", name, "--if-not-exists")
    assert exists.returncode == 0 and exists.stdout.startswith(f"{name} exists at ")

    two_phase = slot("create", "-S", f"{name}_2pc", "--two-phase")
    assert two_phase.returncode == 0, two_phase.stderr
    assert slot_row(d, f"{name}_2pc")["two_phase"]  # type: ignore[index]

    failover = slot("create", "-S", f"{name}_fo", "--failover")
    if db.major_version >= 17:
        assert failover.returncode == 0, failover.stderr
        assert slot_row(d, f"{name}_fo")["failover"]  # type: ignore[index]
    else:
        assert failover.returncode == 2
        assert "failover slots need PostgreSQL 17 or later" in failover.stderr
        assert slot_row(d, f"{name}_fo") is None

    listed = slot("list")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["SLOT", "DATABASE", "ACTIVE", "TWO_PHASE", "CONFIRMED_FLUSH",
                              "WAL_STATUS"]
    table = {r.split()[0]: r.split() for r in rows}
    assert table[name][1:4] == [db.dbname, "no", "no"]
    assert table[f"{name}_2pc"][3] == "yes"
    assert table[name][5] == "reserved"

    dropped = slot("drop", "-S", name)
    assert dropped.returncode == 0 and dropped.stdout.strip() == f"{name} dropped"
    assert slot_row(d, name) is None
    gone = slot("drop", "-S", name)
    assert gone.returncode == 1 and "does not exist" in gone.stderr
    if_exists = slot("drop", "-S", name, "--if-exists")
    assert if_exists.returncode == 0 and "did not exist" in if_exists.stdout
    no_name = slot("create")
    assert no_name.returncode == 2 and "a slot is required" in no_name.stderr


# --- capture and replay -------------------------------------------------------------------------


@pytest.mark.parametrize("emitters", [["probe"], ["probe-stream", "probe-2pc"], ["json"]])
def test_capture_then_replay_equals_stream(source: Source, env: dict[str, str], tmp_path: Path,
                                           emitters: list[str]) -> None:
    if "json" in emitters and "json" not in {e.name for e in installed_emitters()}:
        pytest.skip("the json emitter is not installed")
    options = ["--publication", "p1", "--publication", "p2", "-E", str(source.end)]
    chosen = [x for e in emitters for x in ("--emitter", e)]
    streamed = tmp_path / "streamed"
    result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(), *options,
                      *chosen, "-f", str(streamed)], env=env)
    assert result.returncode == 0, result.stderr
    capture = tmp_path / "capture.pgd"
    result = run_cli(["capture", "-d", source.conninfo, "-S", source.new_slot(), *options,
                      "-f", str(capture)], env=env)
    assert result.returncode == 0, result.stderr
    replayed = tmp_path / "replayed"
    result = run_cli(["replay", str(capture), *chosen, "-f", str(replayed)], env=env)
    assert result.returncode == 0, result.stderr
    suffixes = [f".{e}" for e in emitters] if len(emitters) > 1 else [""]
    for suffix in suffixes:
        expected = Path(f"{streamed}{suffix}").read_bytes()
        assert expected
        assert Path(f"{replayed}{suffix}").read_bytes() == expected


def test_capture_is_one_session(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    """A capture ends with its connection (a reconnect would record what the server sends
    again); the next capture, to another file, goes on from the slot, and replaying both into
    one output file gives what stream gives: the output skips what it already holds. (A
    plugin with stream callbacks would also get the re-sent stream blocks, then stream_abort.)"""
    options = ["--publication", "p1", "--publication", "p2"]
    streamed = tmp_path / "streamed"
    result = run_cli(["stream", "-d", source.conninfo, "-S", source.new_slot(), *options,
                      "-E", str(source.end), "--emitter", "probe", "-f", str(streamed)],
                     env=env)
    assert result.returncode == 0, result.stderr
    slot = source.new_slot()
    first, second = tmp_path / "first.pgd", tmp_path / "second.pgd"
    proc = start_cli(["capture", "-d", source.conninfo, "-S", slot, *options, "-f", str(first),
                      "--status-interval", "60"], env=env, stderr_path=tmp_path / "err")
    try:
        wait_for(lambda: first.exists() and first.stat().st_size > 20_000, what="a capture")
        pid = slot_row(source.conninfo, slot)["active_pid"]  # type: ignore[index]
        query(source.conninfo, "SELECT pg_terminate_backend(%s)", (pid,))
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    message = (tmp_path / "err").read_text()
    assert "start a new capture, to another file" in message
    again = run_cli(["capture", "-d", source.conninfo, "-S", slot, *options, "-f", str(first),
                     "-E", str(source.end)], env=env)
    assert again.returncode == 2 and "a capture is never overwritten" in again.stderr
    result = run_cli(["capture", "-d", source.conninfo, "-S", slot, *options, "-f", str(second),
                      "-E", str(source.end)], env=env)
    assert result.returncode == 0, result.stderr
    replayed = tmp_path / "replayed"
    for capture in (first, second):
        result = run_cli(["replay", str(capture), "--emitter", "probe", "-f",
                          str(replayed)], env=env)
        assert result.returncode == 0, result.stderr
    assert replayed.read_bytes() == streamed.read_bytes()


def test_a_capture_whose_connection_ends_inside_a_transaction_ends_before_it(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """The connection lost in the middle of a transaction: the capture ends at the last
    transaction boundary (the slot was told nothing of the transaction, so the next capture
    gets it whole), and the two captures replay to what stream gives. The transaction is
    48 MB of 1 MB rows, more than the sockets between the server and the stopped capture
    can hold, so the connection ends inside it whatever the machine's pace."""
    create_tables(db.conninfo)
    slot = f"{db.dbname}_s"
    create_slot(db.conninfo, slot)
    with_proto1 = ["--publication", "p1", "--proto-version", "1", "--streaming", "off"]
    for i in range(3):
        query(db.conninfo, "INSERT INTO t1 VALUES (%s, 'small', %s)", (i, i))
    query(db.conninfo, "INSERT INTO t1 SELECT g, repeat(md5(g::text), 32768), g "
                       "FROM generate_series(100, 147) g")
    end = current_lsn(db.conninfo)
    query(db.conninfo, "SELECT pg_copy_logical_replication_slot(%s, %s)", (slot, slot + "_c"))
    streamed = tmp_path / "streamed"
    result = run_cli(["stream", "-d", db.conninfo, "-S", slot + "_c", *with_proto1, "-E",
                      str(end), "--emitter", "probe", "-f", str(streamed)], env=env)
    assert result.returncode == 0, result.stderr
    first, second = tmp_path / "first.pgd", tmp_path / "second.pgd"
    proc = start_cli(["capture", "-d", db.conninfo, "-S", slot, *with_proto1, "-f", str(first),
                      "--status-interval", "60"], env=env, stderr_path=tmp_path / "err")
    try:
        # Past 20 kB the capture is inside the big transaction (the small ones take < 1 kB):
        # stopped there, the connection is ended under it. (Not waiting for the walsender to
        # end before the capture goes on: blocked on a full socket, it ends only once its
        # last message, the error, is read.)
        wait_for(lambda: first.exists() and first.stat().st_size > 20_000, what="a capture")
        proc.send_signal(signal.SIGSTOP)
        pid = slot_row(db.conninfo, slot)["active_pid"]  # type: ignore[index]
        query(db.conninfo, "SELECT pg_terminate_backend(%s)", (pid,))
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    message = (tmp_path / "err").read_text()
    assert "the capture ended inside a transaction" in message, message
    assert verify_capture(first).damage is None
    result = run_cli(["capture", "-d", db.conninfo, "-S", slot, *with_proto1, "-f", str(second),
                      "-E", str(end)], env=env)
    assert result.returncode == 0, result.stderr
    replayed = tmp_path / "replayed"
    for capture in (first, second):
        result = run_cli(["replay", str(capture), "--emitter", "probe", "-f", str(replayed)],
                         env=env)
        assert result.returncode == 0, result.stderr
    assert replayed.read_bytes() == streamed.read_bytes()


def test_capture_needs_a_file_and_the_walsender(env: dict[str, str]) -> None:
    to_stdout = run_cli(["capture", "-d", "dbname=x", "-S", "s", "--publication", "p"], env=env)
    assert to_stdout.returncode == 2 and "-f FILE" in to_stdout.stderr
    sql = run_cli(["capture", "-d", "dbname=x", "-S", "s", "--publication", "p", "-f", "x",
                   "--source", "sql"], env=env)
    assert sql.returncode == 2 and "--source sql" in sql.stderr


def test_replay_of_something_else(tmp_path: Path, env: dict[str, str]) -> None:
    bogus = tmp_path / "bogus"
    bogus.write_text("hello\n")
    result = run_cli(["replay", str(bogus), "--emitter", "probe"], env=env)
    assert result.returncode == 1 and "is not a pgdecode capture" in result.stderr


# --- connection strings -------------------------------------------------------------------------


@pytest.mark.parametrize("conninfo", [
    "host=127.0.0.1 port=1 user=someone password=secret123 dbname=x",
    "postgresql://someone:secret123@127.0.0.1:1/x",
])
def test_password_never_printed(env: dict[str, str], tmp_path: Path, conninfo: str) -> None:
    for command in (["stream", "-d", conninfo, "-S", "s", "--publication", "p", "--emitter",
                     "probe", "--no-reconnect"],
                    ["stream", "-d", conninfo, "-S", "s", "--publication", "p", "--emitter",
                     "probe", "--no-reconnect", "--source", "sql"],
                    ["capture", "-d", conninfo, "-S", "s", "--publication", "p", "-f",
                     str(tmp_path / "c"), "--no-reconnect"],
                    ["slot", "list", "-d", conninfo],
                    ["slot", "create", "-d", conninfo, "-S", "s"]):
        result = run_cli(command, env=env, timeout=60)
        assert result.returncode == 1, (command, result.stderr)
        assert "127.0.0.1" in result.stderr and "port=1" in result.stderr
        assert "secret123" not in result.stderr + result.stdout, command
    # Retrying: the warnings do not show it either.
    log = tmp_path / "stderr"
    proc = start_cli(["stream", "-d", conninfo, "-S", "s", "--publication", "p", "--emitter",
                      "probe"], env=env, stderr_path=log)
    try:
        wait_for(lambda: log.read_text().count("reconnecting in") >= 2, timeout=30,
                 what="two reconnection attempts")
    finally:
        assert stop_process(proc, signal.SIGINT) == 0
    text = log.read_text()
    assert "cannot connect to host=127.0.0.1 port=1" in text
    assert "secret123" not in text


def test_signal_while_waiting_to_reconnect(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "err"
    proc = start_cli(["stream", "-d", "host=127.0.0.1 port=1 dbname=x", "-S", "s",
                      "--publication", "p", "--emitter", "probe"], env=env, stderr_path=log)
    try:
        wait_for(lambda: "reconnecting in" in log.read_text(), timeout=30)
    finally:
        assert stop_process(proc, signal.SIGTERM) == 0
    assert "stopping" in log.read_text()


def test_memory_limit(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    """A large transaction, streamed by the server, is held for a plugin without stream
    callbacks: within 1 MB it spills to disk, and comes out the same."""
    query(source.conninfo, "INSERT INTO t1 SELECT g, repeat('x', 200), g "
                           "FROM generate_series(50000, 64999) g")  # some 3 MB of changes
    source.end = query(source.conninfo, "SELECT pg_current_wal_insert_lsn()::text")[0][0]
    default = probe_stream(source, env, tmp_path, name="default")
    small = probe_stream(source, env, tmp_path, "--memory-limit", "1", name="small")
    assert small == default


def test_emitter_allowlist(source: Source, env: dict[str, str], tmp_path: Path) -> None:
    common = ["stream", "-d", source.conninfo, "-S", source.new_slot(), "--publication", "p1",
              "-E", str(source.end), "-f", str(tmp_path / "o")]
    refused = run_cli([*common, "--emitter", "probe", "--emitter-allowlist", "simple,json"],
                      env=env)
    assert refused.returncode == 1
    assert 'emitter "probe" is not in the allowlist (json, simple)' in refused.stderr
    from_env = run_cli([*common, "--emitter", "probe"],
                       env={**env, "PGDECODE_EMITTER_ALLOWLIST": "simple"})
    assert from_env.returncode == 1 and "not in the allowlist" in from_env.stderr
    allowed = run_cli([*common, "--emitter", "probe", "--emitter-allowlist", "probe"], env=env)
    assert allowed.returncode == 0, allowed.stderr


def test_no_reconnect(db: Any, env: dict[str, str], tmp_path: Path) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_nr"
    create_slot(db.conninfo, slot)
    log = tmp_path / "err"
    proc = start_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "p1",
                      "--emitter", "probe", "-f", str(tmp_path / "o"), "--no-reconnect"],
                     env=env, stderr_path=log)
    try:
        pid = wait_for(lambda: (slot_row(db.conninfo, slot) or {}).get("active_pid"))
        query(db.conninfo, "SELECT pg_terminate_backend(%s)", (pid,))
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "terminating connection due to administrator command" in text
    assert "reconnecting" not in text


def test_create_temporary_slot(db: Any, env: dict[str, str], tmp_path: Path) -> None:
    create_tables(db.conninfo)
    slot = f"{db.dbname}_temp"
    out = tmp_path / "out"
    proc = start_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "p1",
                      "--emitter", "probe", "-f", str(out), "--create-slot", "--temporary",
                      "--status-interval", "0.2"], env=env)
    try:
        wait_for(lambda: slot_row(db.conninfo, slot), what="slot created")
        row = slot_row(db.conninfo, slot)
        assert row is not None and row["temporary"]
        query(db.conninfo, "INSERT INTO t1 VALUES (1, 'a', 1)")
        wait_for(lambda: out.exists() and out.stat().st_size > 0, what="output")
    finally:
        assert stop_process(proc) == 0
    assert applied_ids(read_lines(out), "t1") == [1]
    wait_for(lambda: slot_row(db.conninfo, slot) is None, what="temporary slot gone")
    for bad in (["--temporary"], ["--create-slot", "--temporary", "--source", "sql"]):
        result = run_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "p1",
                          *bad], env=env)
        assert result.returncode == 2 and "--temporary" in result.stderr
