"""Prepared transactions held durably beside an output file (hold.py, holding.py), server-free:
the acknowledgement moves past the PREPARE of a transaction a plugin gets only at COMMIT
PREPARED, and a new process, which the server then sends only the outcome, delivers it from
the file's hold directory exactly as one uninterrupted run would have.

The server's side of a restart is scripted as it behaves: a new session (every relation
described again, when next used) that starts after what was acknowledged."""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.recorders import apply_streams
from support.scripted import (
    Rec,
    StreamRec,
    StreamTwoPhaseRec,
    TwoPhaseRec,
    Wal,
    alter,
    feed,
    file_events,
    ins,
    run,
    upd,
)

from plugin_framework import LSN, FileOutput, MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.framework.hold import HoldError


def start(paths: Sequence[Path], plugins: Sequence[OutputPlugin],
          memory: Sequence[MemoryOutput] = ()) -> Pipeline:
    p = Pipeline(proto_version=4, slot_name="s")
    for plugin, path in zip(plugins, paths, strict=False):
        p.add(plugin, output=FileOutput(str(path)))
    for plugin, out in zip(plugins[len(paths):], memory, strict=True):
        p.add(plugin, output=out)
    p.startup()
    return p


def died(p: Pipeline) -> None:
    """What the kernel does for a process that dies: its files' locks go."""
    for m in p.members:
        file = getattr(m.ctx.output, "_file", None)
        if file is not None:
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)


def held_entries(path: Path) -> list[Path]:
    hold = path.with_name(path.name + ".hold")
    return sorted(hold.glob("*.hold")) if hold.exists() else []


def two_runs(wal: Wal, plugins: Sequence[OutputPlugin], paths: Sequence[Path],
             later: Sequence[OutputPlugin]) -> tuple[Pipeline, LSN]:
    """Run 1 reads everything sent so far, acknowledging after each message, and dies; a
    new session starts. Returns run 2 (started on the same files) and run 1's last ack."""
    first = start(paths, plugins)
    ack = LSN(0)
    for data, lsn in wal.items:
        first.feed(data, lsn)
        ack = first.flush()
    assert not first.in_flight
    died(first)
    return start(paths, later), ack


# --- whole at COMMIT PREPARED -------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_prepared_transaction_is_acknowledged_and_delivered_after_a_restart(
        tmp_path: Path, outcome: str) -> None:
    """A plugin without two-phase callbacks waits for COMMIT PREPARED; the
    slot is acknowledged past the PREPARE and the later commit all the same, and the next
    process, sent only the outcome, delivers it whole (or nothing, for a rollback)."""
    wal = Wal()
    wal.table("t", "id", "v")
    _, prepare_end = wal.prepared(750, "pending", ins("t", "1", "a"), ins("t", "2", "b"))
    _, c751_end = wal.txn(751, ins("t", "3", "c"))
    out = tmp_path / "out"
    second, ack = two_runs(wal, [Rec()], [out], [Rec()])
    assert ack == c751_end  # not held back at the PREPARE
    assert len(held_entries(out)) == 1
    start_at = wal.reconnect()
    if outcome == "commit":
        wal.commit_prepared(750, "pending")
    else:
        wal.rollback_prepared(750, "pending", prepare_end)
    wal.txn(752, ins("t", "4", "d"))
    feed(second, wal.items[start_at:])
    second.flush()
    [uninterrupted] = run(wal.items, Rec())
    assert file_events(out) == uninterrupted
    assert held_entries(out) == []  # released once the outcome was durable
    second.shutdown()


def test_the_held_transaction_keeps_the_definitions_it_was_made_with(tmp_path: Path) -> None:
    """The next session describes a table only when it next sends a change of it, and by
    then the table may have changed: the entry carries the definitions the held changes
    were made with."""
    wal = Wal()
    wal.table("t", "id", "v")
    wal.txn(749, ins("t", "0", "z"))  # t described before the prepared transaction
    wal.prepared(750, "old-shape", ins("t", "1", "a"), upd("t", "1", "1", "b"))
    wal.txn(751, alter("t", "id", "v", "w"), ins("t", "2", "c", "x"))
    out = tmp_path / "out"
    second, _ = two_runs(wal, [Rec()], [out], [Rec()])
    start_at = wal.reconnect()
    wal.txn(752, ins("t", "3", "d", "y"))
    wal.commit_prepared(750, "old-shape")
    feed(second, wal.items[start_at:])
    second.flush()
    [uninterrupted] = run(wal.items, Rec())
    assert file_events(out) == uninterrupted
    got = file_events(out)
    begin = got.index(("begin", 750))
    held = got[begin + 1:begin + 3]
    assert [len(e[3]) for e in held] == [2, 2]  # id, v: not w, which came later


def test_two_phase_and_ordinary_plugins_after_a_restart(tmp_path: Path) -> None:
    """The two-phase plugin had the PREPARE: after the restart it gets COMMIT PREPARED; the
    ordinary one gets the transaction whole, from the entry; a filter_prepare that declines
    counts as ordinary."""
    plugins = [Rec, TwoPhaseRec, lambda: TwoPhaseRec(filter_gids=("g",)), StreamRec]
    wal = Wal()
    wal.table("t", "id")
    wal.prepared(760, "g", ins("t", "1"), ins("t", "2"))
    wal.txn(761, ins("t", "3"))
    paths = [tmp_path / f"out{i}" for i in range(len(plugins))]
    second, _ = two_runs(wal, [p() for p in plugins], paths, [p() for p in plugins])
    start_at = wal.reconnect()
    wal.commit_prepared(760, "g")
    feed(second, wal.items[start_at:])
    second.flush()
    uninterrupted = run(wal.items, *(p() for p in plugins))
    assert [file_events(p) for p in paths] == uninterrupted
    assert not any(held_entries(p) for p in paths)


# --- the rest of a stream ------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_the_rest_of_a_streamed_prepared_transaction_after_a_restart(
        tmp_path: Path, outcome: str) -> None:
    """A streaming plugin without two-phase callbacks had the blocks streamed for the memory
    limit, not the rest streamed at PREPARE: after a restart it gets that rest and
    stream_commit (or stream_abort for each subtransaction and the transaction), and is not
    told to abort the blocks it has."""
    wal = Wal()
    wal.table("t", "id", "v")
    wal.block(770, ins("t", "1", "a"), ins("t", "2", "b", sub=771))
    wal.block(770, upd("t", "1", "1", "c"), ins("t", "3", "d", sub=772))
    _, prepare_end = wal.stream_prepare(770, "streamed")
    wal.txn(773, alter("t", "id", "v", "w"), ins("t", "4", "e", "f"))
    plugins = [StreamRec, Rec, StreamTwoPhaseRec]
    paths = [tmp_path / f"out{i}" for i in range(len(plugins))]
    second, ack = two_runs(wal, [p() for p in plugins], paths, [p() for p in plugins])
    assert ack == LSN(wal.pos)
    assert held_entries(paths[0]) and held_entries(paths[1])
    start_at = wal.reconnect()
    if outcome == "commit":
        wal.commit_prepared(770, "streamed")
    else:
        wal.rollback_prepared(770, "streamed", prepare_end)
    feed(second, wal.items[start_at:])
    second.flush()
    uninterrupted = run(wal.items, *(p() for p in plugins))
    assert [file_events(p) for p in paths] == uninterrupted
    assert not any(held_entries(p) for p in paths)


# --- when the server sends it again, or cannot be passed -----------------------------------------


def test_an_output_that_cannot_hold_keeps_the_acknowledgement_at_the_prepare(
        tmp_path: Path) -> None:
    """A plugin writing to memory (as to a pipe) has nowhere durable to keep it: the
    acknowledgement stays at the PREPARE, as before, while the file's plugin holds it."""
    wal = Wal()
    wal.table("t", "id")
    prepare_lsn, _ = wal.prepared(780, "mixed", ins("t", "1"))
    wal.txn(781, ins("t", "2"))
    memory = MemoryOutput()
    p = start([tmp_path / "out"], [Rec(), Rec()], [memory])
    feed(p, wal.items)
    assert p.flush() <= prepare_lsn
    assert p.in_flight


def test_a_crash_before_the_output_passed_the_prepare_takes_the_transaction_sent_again(
        tmp_path: Path) -> None:
    """The entry is written at PREPARE, the output made durable later: a crash between
    leaves an entry the restart must not use (the server sends the transaction again)."""
    wal = Wal()
    wal.table("t", "id")
    wal.prepared(790, "early", ins("t", "1"))
    out = tmp_path / "out"
    first = start([out], [Rec()])
    feed(first, wal.items)  # never flushed
    assert len(held_entries(out)) == 1
    died(first)
    wal.reconnect()
    cp, _ = wal.commit_prepared(790, "early")
    second = start([out], [Rec()])
    assert held_entries(out) == []  # not durable past its PREPARE: the server sends it again
    feed(second, wal.items)
    second.flush()
    assert file_events(out) == wal.ordinary(790, cp)


def test_a_restored_transaction_sent_again_is_taken_once(tmp_path: Path) -> None:
    """Another output lagged, so the slot stayed before the PREPARE: the server sends the
    transaction again, blocks and all; the restored copy gives way to it."""
    wal = Wal()
    wal.table("t", "id")
    wal.block(800, ins("t", "1"))
    wal.stream_prepare(800, "again")
    wal.txn(801, ins("t", "2"))
    sent = list(wal.items)
    out = tmp_path / "out"
    first = start([out], [StreamRec()])
    feed(first, sent)
    first.flush()
    died(first)
    wal.reconnect()
    wal.items.extend(sent)  # the server goes back further than this file
    cp, _ = wal.commit_prepared(800, "again")
    second = start([out], [StreamRec()])
    feed(second, wal.items[len(sent):])
    second.flush()
    got = apply_streams(file_events(out))
    [expected] = run(sent + wal.items[-1:], StreamRec())
    assert got == apply_streams(expected)
    raw = file_events(out)
    assert [e for e in raw if e[0] == "stream_commit"] == [("stream_commit", 800, int(cp))]
    assert [e[0] for e in raw].count("stream_abort") == 1  # the old blocks, taken back


def test_a_damaged_entry_is_refused_at_startup(tmp_path: Path) -> None:
    wal = Wal()
    wal.table("t", "id")
    wal.prepared(810, "damaged", ins("t", "1"))
    wal.txn(811, ins("t", "2"))
    out = tmp_path / "out"
    second, _ = two_runs(wal, [Rec()], [out], [])
    [entry] = held_entries(out)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0x10
    entry.write_bytes(bytes(data))
    died(second)
    with out.open("ab") as f:
        f.write(b"a torn tail")  # what a restart cuts back, once it may
    before = out.read_bytes()
    with pytest.raises(HoldError, match=r"is damaged .*checksum.* will not send it again"):
        start([out], [Rec()])
    assert out.read_bytes() == before  # refused before the output was cut back


# --- a restart anywhere ---------------------------------------------------------------------------


# Each unit of the script: what it is, whose, where it ends, its messages. A new session
# (wal.reconnect) before each, so that each describes its relations: the server does so when
# it sends a unit again in a new session.
Unit = tuple[str, int, LSN, list[tuple[bytes, LSN]]]


def script() -> list[Unit]:
    wal = Wal()
    wal.table("t", "id", "v")
    units: list[Unit] = []

    def unit(kind: str, xid: int, make: Callable[[], object]) -> None:
        wal.reconnect()
        before = len(wal.items)
        make()
        units.append((kind, xid, LSN(wal.pos), wal.items[before:]))

    unit("prepare", 900, lambda: wal.prepared(900, "a", ins("t", "1", "a")))
    unit("block", 910, lambda: wal.block(910, ins("t", "2", "b"), ins("t", "3", "c", sub=911)))
    unit("txn", 920, lambda: wal.txn(920, upd("t", "1", "1", "d")))
    unit("block", 910, lambda: wal.block(910, ins("t", "6", "i", sub=912)))
    unit("prepare", 910, lambda: wal.stream_prepare(910, "b"))
    unit("txn", 930, lambda: wal.txn(930, alter("t", "id", "v", "w"), ins("t", "4", "e", "f")))
    unit("outcome", 900, lambda: wal.commit_prepared(900, "a"))
    unit("outcome", 910, lambda: wal.commit_prepared(910, "b"))
    unit("txn", 940, lambda: wal.txn(940, ins("t", "5", "g", "h")))
    return units


SCRIPT = script()
ALL = [item for *_, items in SCRIPT for item in items]
PLUGINS = [Rec, StreamRec, TwoPhaseRec, StreamTwoPhaseRec,
           lambda: StreamTwoPhaseRec(filter_gids=("b",))]


def resent_after(ack: LSN) -> list[tuple[bytes, LSN]]:
    """What the server sends of SCRIPT from a slot confirmed up to ``ack``: each transaction
    and outcome whose record ends after it; a streamed transaction's blocks with its
    PREPARE (it is streamed again from its start)."""
    prepares = {xid: end for kind, xid, end, _ in SCRIPT if kind == "prepare"}
    return [item for kind, xid, end, items in SCRIPT
            if (prepares[xid] if kind == "block" else end) > ack for item in items]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, len(ALL)))
def test_a_restart_after_any_message_delivers_as_one_run(tmp_path: Path, crash: int) -> None:
    """Run 1 reads up to ``crash`` messages, flushing after each, and dies; the server then
    sends, in a new session, what the acknowledgement did not pass. The files end as one
    run's output (stream blocks taken back by a stream_abort aside), and hold nothing."""
    directory = tmp_path / f"crash-{crash}"
    directory.mkdir()
    paths = [directory / f"out{i}" for i in range(len(PLUGINS))]
    first = start(paths, [p() for p in PLUGINS])
    ack = LSN(0)
    for data, lsn in ALL[:crash]:
        first.feed(data, lsn)
        ack = first.flush()
    died(first)
    second = start(paths, [p() for p in PLUGINS])
    feed(second, resent_after(ack))
    second.flush()
    expected = run(ALL, *(p() for p in PLUGINS))
    for path, want in zip(paths, expected, strict=True):
        assert apply_streams(file_events(path)) == apply_streams(want)
        assert held_entries(path) == []
