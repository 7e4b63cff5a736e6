"""FileOutput under faults injected for real, on each server version: a second ``pgdecode
stream`` given the running one's file, an fsync that fails (an LD_PRELOAD shim, compiled by
tests/support/faultshim.py, makes fsync of the output file, or of a FILE.hold entry, fail once), a
FILE.progress damaged on disk, and a plugin callback that raises in the middle of a
transaction. Each must leave the file whole, acknowledge nothing that is not durable in it,
and let a rerun go on exactly."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.faultshim import build_fsync_shim
from support.streamkit import (
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
    transactions,
    wait_for,
    wait_slot_inactive,
)

from plugin_framework import LSN, FileOutput, OutputPlugin
from plugin_framework.app import PlannedEmitter, build_pipeline, open_source, run_source
from plugin_framework.framework import CallbackError, OutputError
from plugin_framework.framework.outputs import new_record
from plugin_framework.sources.session import SourceConfig


def make_table(conninfo: str) -> None:
    query(conninfo, "CREATE TABLE t (id int PRIMARY KEY, v text); "
                    "CREATE PUBLICATION pub FOR TABLE t")


def insert(conninfo: str, first: int, last: int) -> None:
    query(conninfo, "INSERT INTO t SELECT g, repeat('x', 100) || g "
                    "FROM generate_series(%s::int, %s::int) g", (first, last))


def row_ids(lines: list[dict[str, Any]]) -> list[int]:
    return [int(ln["new"]["id"]) for ln in lines if ln["cb"] == "change"]


def check_complete(conninfo: str, path: Path) -> None:
    """The file holds whole transactions, every row of t once, and its progress records
    the file's real size."""
    lines = read_lines(path)
    xids = [txn[0]["xid"] for txn in transactions(lines)]
    assert not [x for x, n in Counter(xids).items() if n > 1], "a transaction twice"
    ids = row_ids(lines)
    assert not [i for i, n in Counter(ids).items() if n > 1], "rows twice"
    assert sorted(ids) == table_ids(conninfo, "t")
    progress = json.loads(Path(f"{path}.progress").read_text())
    assert progress["size"] == path.stat().st_size


def stream_command(conninfo: str, slot: str, out: Path, *extra: str) -> list[str]:
    return ["stream", "-d", conninfo, "-S", slot, "--publication", "pub", "--emitter",
            "probe", "-f", str(out), *extra]


# --- item 7: a second process given the running one's file ---------------------------------------


def test_a_second_file_output_in_one_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out"
    first = FileOutput(path)
    first.write(new_record(LSN(0x10), 1, b"line"))
    with pytest.raises(OutputError, match=rf"{path} is in use by process {os.getpid()}"):
        FileOutput(path)
    first.mark(LSN(0x10))
    first.close()
    FileOutput(path).close()  # released with the first
    assert path.read_bytes() == b"line\n"


def test_a_second_stream_with_the_same_file_is_refused_untouched(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """As a supervisor restarting a consumer still finishing after SIGTERM would: the second
    process must neither cut the file (the first keeps appending and acknowledging) nor
    record anything; it says which process has the file."""
    make_table(db.conninfo)
    slot = f"{db.dbname}_twice"
    create_slot(db.conninfo, slot)
    out = tmp_path / "out.jsonl"
    # Acknowledging rarely: most of what the first writes is past its FILE.progress size,
    # which is what an unguarded second process would cut the file back to.
    command = stream_command(db.conninfo, slot, out, "--status-interval", "3600")
    first = start_cli(command, env=env, stderr_path=tmp_path / "first.stderr")
    try:
        insert(db.conninfo, 1, 20_000)  # ~4 MB of lines: past the 1 MB write buffer
        wait_for(lambda: (out.exists() and out.stat().st_size > 1 << 20) or first.poll(),
                 timeout=120, what="the first consumer's output")
        assert first.poll() is None, (tmp_path / "first.stderr").read_text()
        second = run_cli(command, env=env, timeout=60)
        assert second.returncode == 1, second.stderr
        assert f"{out} is in use by process {first.pid}" in second.stderr
        assert "Stop that one first" in second.stderr and "-f another file" in second.stderr
        assert "Traceback" not in second.stderr
        insert(db.conninfo, 20_001, 22_000)  # the first goes on
    finally:
        assert stop_process(first) == 0, (tmp_path / "first.stderr").read_text()
    wait_slot_inactive(db.conninfo, slot)
    # The first ended whole, its progress recording the file's real size ...
    transactions(read_lines(out))
    assert json.loads(Path(f"{out}.progress").read_text())["size"] == out.stat().st_size
    # ... and with nothing lost: what it had not got to comes now, the rest is skipped
    rerun = run_cli([*command, "-E", str(current_lsn(db.conninfo))], env=env)
    assert rerun.returncode == 0, rerun.stderr
    check_complete(db.conninfo, out)


def test_a_stream_refused_for_an_active_slot_leaves_the_file_untouched(
        db: Any, env: dict[str, str], tmp_path: Path) -> None:
    """The slot is checked before the file is repaired: a run refused because another
    consumer reads the slot must not cut the file's torn tail (it is that consumer's
    business, or the next run's)."""
    make_table(db.conninfo)
    slot = f"{db.dbname}_active"
    create_slot(db.conninfo, slot)
    out = tmp_path / "out.jsonl"
    insert(db.conninfo, 1, 10)
    done = run_cli([*stream_command(db.conninfo, slot, out), "-E", str(current_lsn(db.conninfo))],
                   env=env)
    assert done.returncode == 0, done.stderr
    with out.open("ab") as f:
        f.write(b'{"cb": "begin", "xid": 1}\n')  # a torn tail, as a crash leaves it
    before, progress = out.read_bytes(), Path(f"{out}.progress").read_bytes()
    other = start_cli(["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub",
                       "--emitter", "probe"], env=env)
    try:
        wait_for(lambda: (slot_row(db.conninfo, slot) or {}).get("active") or other.poll(),
                 what="the other consumer")
        refused = run_cli(stream_command(db.conninfo, slot, out, "--no-reconnect"), env=env)
    finally:
        assert stop_process(other) == 0
    assert refused.returncode == 1, refused.stderr
    assert f'replication slot "{slot}" is active for PID' in refused.stderr
    assert out.read_bytes() == before
    assert Path(f"{out}.progress").read_bytes() == progress


# --- item 10: an fsync that fails -----------------------------------------------------------------

@pytest.fixture(scope="module")
def failing_fsync(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fsync_shim(tmp_path_factory.mktemp("shim"))


def test_a_failed_fsync_stops_the_stream_unacknowledged(
        db: Any, env: dict[str, str], tmp_path: Path, failing_fsync: Path) -> None:
    make_table(db.conninfo)
    slot = f"{db.dbname}_fsync"
    create_slot(db.conninfo, slot)
    out = tmp_path / "out.jsonl"
    trigger = tmp_path / "fail-now"
    shimmed = {**env, "LD_PRELOAD": str(failing_fsync), "FAIL_FSYNC_PATH": str(out.resolve()),
               "FAIL_FSYNC_TRIGGER": str(trigger)}
    command = stream_command(db.conninfo, slot, out, "--status-interval", "0.2",
                             "--no-reconnect")
    proc = start_cli(command, env=shimmed, stderr_path=tmp_path / "stderr")
    try:
        insert(db.conninfo, 1, 100)
        durable = current_lsn(db.conninfo)
        wait_for(lambda: confirmed_flush(db.conninfo, slot) >= durable or proc.poll(),
                 timeout=120, what="the first rows acknowledged")
        before = Path(f"{out}.progress").read_text()
        trigger.touch()
        insert(db.conninfo, 101, 200)
        after = current_lsn(db.conninfo)
        wait_for(lambda: proc.poll() is not None
                 or confirmed_flush(db.conninfo, slot) >= after,
                 timeout=120, what="the consumer's exit or acknowledgement")
    finally:
        status = stop_process(proc, signal.SIGKILL)
    stderr = (tmp_path / "stderr").read_text()
    assert not trigger.exists(), "fsync was never called on the output"
    assert status == 1, stderr
    assert confirmed_flush(db.conninfo, slot) < after  # the rows after the failure: not acked
    assert f"could not make {out} durable: fsync failed (Input/output error)" in stderr
    assert "Traceback" not in stderr
    # Nothing recorded durable after the failure (not even at close, where an fsync tried
    # again would succeed); the file ends where it was durable.
    assert Path(f"{out}.progress").read_text() == before
    assert out.stat().st_size == json.loads(before)["size"]
    wait_slot_inactive(db.conninfo, slot)
    rerun = run_cli([*command, "-E", str(current_lsn(db.conninfo))], env=env)
    assert rerun.returncode == 0, rerun.stderr
    check_complete(db.conninfo, out)


@pytest.mark.parametrize(("code", "says"), [(errno.EIO, "Input/output error"),
                                           (errno.ENOSPC, "No space left on device")],
                         ids=["EIO", "ENOSPC"])
def test_a_hold_entry_that_cannot_be_saved_is_named_and_nothing_is_lost(
        db: Any, env: dict[str, str], tmp_path: Path, failing_fsync: Path, code: int,
        says: str) -> None:
    """A prepared transaction held for a plugin without two-phase callbacks (FILE.hold)
    whose entry cannot be made durable (EIO, ENOSPC): the run stops with one message naming
    the entry and saying what to do, the slot is not acknowledged past the PREPARE, and the
    next run delivers the transaction at its COMMIT PREPARED, once."""
    make_table(db.conninfo)
    slot = f"{db.dbname}_hold"
    out = tmp_path / "out"
    hold = Path(f"{out}.probe.hold")
    trigger = tmp_path / "fail-now"
    # probe-2pc asks for two-phase decoding; probe (no two-phase callbacks) holds
    command = ["stream", "-d", db.conninfo, "-S", slot, "--publication", "pub", "--emitter",
               "probe", "--emitter", "probe-2pc", "-f", str(out), "--status-interval", "0.2",
               "--create-slot", "--two-phase", "--no-reconnect"]
    shimmed = {**env, "LD_PRELOAD": str(failing_fsync), "FAIL_FSYNC_PATH": f"{hold}/",
               "FAIL_FSYNC_TRIGGER": str(trigger), "FAIL_FSYNC_ERRNO": str(code)}
    stderr = tmp_path / "stderr"
    proc = start_cli(command, env=shimmed, stderr_path=stderr)
    try:
        wait_for(lambda: slot_row(db.conninfo, slot) or proc.poll() is not None,
                 what="the slot")
        insert(db.conninfo, 1, 10)
        trigger.touch()
        with db.connect(autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t SELECT g, 'prepared' FROM generate_series(-20, -1) g")
            conn.execute("PREPARE TRANSACTION 'pending'")
        prepared = current_lsn(db.conninfo)
        status = proc.wait(120)
    finally:
        stop_process(proc, signal.SIGKILL)
    error = stderr.read_text()
    assert not trigger.exists(), "fsync was never called on the hold entry"
    assert status == 1, error
    assert "Traceback" not in error and "[Errno" not in error
    assert error.count("pgdecode: error: ") == 1, error
    assert ('pgdecode: error: could not save prepared transaction "pending" (xid ') in error
    assert f" in {hold}/" in error and f".hold, where it is held until its COMMIT " \
        f"PREPARED: {says}. Nothing was acknowledged past its PREPARE" in error
    assert f"Make room in {hold} (or repair the disk), then run the same command again" \
        in error
    assert confirmed_flush(db.conninfo, slot) < prepared
    assert not list(hold.glob("*.tmp"))
    wait_slot_inactive(db.conninfo, slot)
    rerun = start_cli(command, env=env, stderr_path=stderr)
    try:
        wait_for(lambda: (slot_row(db.conninfo, slot) or {}).get("active") or rerun.poll(),
                 what="the rerun")
        query(db.conninfo, "COMMIT PREPARED 'pending'")
        insert(db.conninfo, 11, 12)
        wait_for(lambda: confirmed_flush(db.conninfo, slot) >= current_lsn(db.conninfo)
                 or rerun.poll() is not None, timeout=120, what="everything acknowledged")
    finally:
        assert stop_process(rerun) == 0, stderr.read_text()
    ids = row_ids(read_lines(Path(f"{out}.probe")))
    assert sorted(ids) == [*range(-20, 0), *range(1, 13)]  # each row once


# --- item 11: a damaged FILE.progress ------------------------------------------------------------


# How FILE.progress is damaged (by hand, or by a disk), and what the refusal says: each as
# a file written before checksums has it (no "crc32": its members are all there is to check),
# except "stale-checksum", a member changed under the checksum the file was written with.
DAMAGES = {
    "lsn-beyond-wal": "records that {out} holds the changes up to FFFFFFFF/FFFFFFFF, but the "
                      "server's WAL ends at",
    "negative-size": '"size" is -1, not a count',
    "size-inside-a-line": "which falls inside a line of {out}",
    "incremental-a-string": '"incremental" is "public.t", not an object',
    "incremental-a-list": '"incremental" is ["public.t"], not an object',
    "nested": "it is nested too deeply to be one of pgdecode's files",
    "lsn-an-integer": '"lsn" is 12345, not an LSN written as "0/16B3748"',
    "stale-checksum": "its checksum does not match its content",
}


def damaged_progress(state: dict[str, Any], damage: str, out: Path) -> bytes:
    """``state`` (FILE.progress as written) damaged as ``damage`` says."""
    if damage == "stale-checksum":
        return json.dumps({**state, "size": state["size"] - 1}).encode()
    state = {k: v for k, v in state.items() if k != "crc32"}
    if damage == "lsn-beyond-wal":
        state["lsn"] = "FFFFFFFF/FFFFFFFF"
    elif damage == "negative-size":
        state["size"] = -1
    elif damage == "size-inside-a-line":
        state["size"] = out.read_bytes().index(b"\n") + 5  # in the second line
    elif damage == "incremental-a-string":
        state["incremental"] = "public.t"
    elif damage == "incremental-a-list":
        state["incremental"] = ["public.t"]
    elif damage == "lsn-an-integer":
        state["lsn"] = 12345
    else:
        assert damage == "nested"
        text = json.dumps(state)
        return f'{text[:-1]}, "incremental": {"[" * 100_000}{"]" * 100_000}}}'.encode()
    return json.dumps(state).encode()


@pytest.mark.parametrize("source_kind", ["walsender", "sql"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_progress_file_is_refused_untouched(
        db: Any, env: dict[str, str], tmp_path: Path, source_kind: str, damage: str) -> None:
    """Refused before anything is cut, streamed or acknowledged, with one message naming
    the file, what is wrong and what to do; the file and its progress stay as they were."""
    make_table(db.conninfo)
    slot = f"{db.dbname}_damaged"
    create_slot(db.conninfo, slot)
    out = tmp_path / "out.jsonl"
    command = stream_command(db.conninfo, slot, out, "--source", source_kind,
                             "--no-reconnect")
    insert(db.conninfo, 1, 10)
    first = run_cli([*command, "-E", str(current_lsn(db.conninfo))], env=env)
    assert first.returncode == 0, first.stderr
    progress = Path(f"{out}.progress")
    progress.write_bytes(damaged_progress(json.loads(progress.read_text()), damage, out))
    insert(db.conninfo, 11, 20)
    acked = confirmed_flush(db.conninfo, slot)
    content, recorded = out.read_bytes(), progress.read_bytes()
    second = run_cli([*command, "-E", str(current_lsn(db.conninfo))], env=env)
    assert second.returncode == 1, second.stderr
    assert "Traceback" not in second.stderr and "Errno" not in second.stderr
    assert second.stderr.count("pgdecode: error: ") == 1, second.stderr
    assert f"pgdecode: error: {progress} " in second.stderr
    assert DAMAGES[damage].format(out=out) in second.stderr
    assert f"remove {out} and {progress}" in second.stderr
    assert "streaming slot" not in second.stderr
    assert confirmed_flush(db.conninfo, slot) == acked
    assert out.read_bytes() == content
    assert progress.read_bytes() == recorded


# --- item 1: a callback that raises in the middle of a transaction -------------------------------


class Failing(OutputPlugin):
    """A contrib-style plugin (public API only): a JSON line per callback; raises KeyError
    at its ``fail_at``-th change, as the wal2json emitter did for a renamed column."""

    name = "failing"

    def __init__(self, fail_at: int | None) -> None:
        self.fail_at, self.seen = fail_at, 0

    def _emit(self, ctx: Any, **fields: Any) -> None:
        ctx.emit(json.dumps(fields))

    def begin(self, ctx: Any, txn: Any) -> None:
        self._emit(ctx, cb="begin", xid=txn.xid)

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self.seen += 1
        if self.seen == self.fail_at:
            raise KeyError("a")
        self._emit(ctx, cb="change", xid=txn.xid, new={"id": change.new.text("id")})

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self._emit(ctx, cb="commit", xid=txn.xid)


def run_app(conninfo: str, slot: str, out: Path, plugin: OutputPlugin) -> None:
    assembly = build_pipeline([PlannedEmitter(plugin, {}, str(out))], slot_name=slot)
    config = SourceConfig(conninfo, slot, ["pub"], reconnect=False,
                          endpos=current_lsn(conninfo))
    run_source(open_source(config, assembly.pipeline), assembly, handle_signals=False)


def test_a_callback_error_leaves_no_torn_transaction(db: Any, tmp_path: Path) -> None:
    make_table(db.conninfo)
    slot = f"{db.dbname}_cb"
    create_slot(db.conninfo, slot)
    for first in (1, 11, 21):  # three transactions of 10 rows
        insert(db.conninfo, first, first + 9)
    out = tmp_path / "out.jsonl"
    with pytest.raises(CallbackError, match=r"in the change callback.*KeyError: 'a'"):
        run_app(db.conninfo, slot, out, Failing(fail_at=14))  # the 4th row of the 2nd
    lines = read_lines(out)
    assert len(transactions(lines)) == 1  # the first, whole; nothing of the second
    assert row_ids(lines) == list(range(1, 11))
    wait_slot_inactive(db.conninfo, slot)
    run_app(db.conninfo, slot, out, Failing(fail_at=None))  # fixed: resumes exactly
    check_complete(db.conninfo, out)
