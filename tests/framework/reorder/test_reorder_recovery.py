"""Re-sends, spills and restarts, server-free: one scripted stream with every kind of
transaction and outcome (tests/support/scripted.py), fed to every kind of plugin, cut anywhere. Each
plugin must end with each transaction once, whatever the server sends again, however small
the memory limit, wherever the process dies."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.recorders import Event, apply_streams, apply_two_phase
from support.scripted import (
    Rec,
    StreamOriginFilter,
    StreamRec,
    StreamTwoPhaseRec,
    TwoPhaseRec,
    Wal,
    alter,
    dele,
    emitting,
    events,
    feed,
    feed_in_runs,
    file_events,
    ins,
    msg,
    nontx,
    pipeline,
    run,
    spilled,
    trunc,
    upd,
)

from plugin_framework import FileOutput, OutputPlugin, Pipeline


def big_script() -> Wal:
    """Every kind of transaction and outcome, in one stream."""
    wal = Wal()
    wal.table("t", "id", "v")
    wal.table("u", "id")
    wal.nontx("start", b"0")
    wal.txn(2000, ins("t", "1", "a"), upd("t", "1", "1", "b"), msg("p", b"m"), trunc("u"),
            nontx("mid", b"1"))
    wal.block(2010, ins("t", "2", "c"), ins("t", "3", "d", sub=2011))
    wal.txn(2020, ins("u", "4"), origin="upstream")
    wal.block(2010, ins("t", "5", None, sub=2012), msg("p", b"s"), trunc("u", sub=2012))
    wal.stream_abort(2010, 2011)
    wal.stream_commit(2010)
    wal.prepared(2030, "p1", ins("t", "6", "e"))
    wal.txn(2040, alter("u", "id", "w"), ins("u", "7", "f"))
    wal.commit_prepared(2030, "p1")
    wal.block(2050, ins("t", "8", "g"))
    _, end = wal.stream_prepare(2050, "p2")
    wal.rollback_prepared(2050, "p2", end)
    _, end = wal.prepared(2060, "p3", dele("t", "6"))
    wal.nontx("between", b"2")
    wal.rollback_prepared(2060, "p3", end)
    wal.block(2070, ins("t", "9", "h"))
    wal.block(2080, ins("t", "10", "i"), origin="upstream")
    wal.stream_abort(2070)
    wal.block(2080, upd("t", "10", "10", "j", sub=2081))
    wal.stream_prepare(2080, "p4")
    wal.txn(2090, dele("t", "2"))
    wal.commit_prepared(2080, "p4")
    return wal


BIG = big_script()


def big_plugins() -> list[OutputPlugin]:
    return [Rec(), StreamRec(), TwoPhaseRec(), StreamTwoPhaseRec(),
            TwoPhaseRec(filter_gids=("p1", "p4")), StreamTwoPhaseRec(filter_gids=("p2",)),
            emitting(StreamOriginFilter)()]


def as_ordinary(evs: list[Event]) -> list[Event]:
    """What a plugin without stream or two-phase callbacks should have seen."""
    return apply_two_phase(apply_streams(evs))


BIG_BASELINE = run(BIG.items, *big_plugins())


def test_every_kind_of_plugin_sees_the_same_committed_transactions() -> None:
    ordinary = BIG_BASELINE[0]
    for evs in BIG_BASELINE[1:-1]:
        assert as_ordinary(evs) == ordinary
    assert [e[1] for e in ordinary if e[0] == "begin"] == [2000, 2020, 2010, 2040, 2030, 2090,
                                                           2080]
    filtered = as_ordinary(BIG_BASELINE[-1])  # 2020 and 2080 come from "upstream"
    assert [e[1] for e in filtered if e[0] == "begin"] == [2000, 2010, 2040, 2030, 2090]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6000))
def test_any_memory_limit_gives_the_same_output(memory_limit: int) -> None:
    p, outs = pipeline(*big_plugins(), memory_limit=memory_limit)
    feed(p, BIG.items)
    assert [events(o) for o in outs] == BIG_BASELINE
    if memory_limit < 100:
        assert spilled(p) > 0


def runs_script() -> Wal:
    """Streamed, ordinary and prepared transactions whose row changes come several in a row
    of one relation (of one subtransaction, in a stream block): what the walsender source
    hands the pipeline as runs, a block's first change among them."""
    wal = Wal()
    wal.table("t", "id", "v")
    wal.table("u", "id")
    wal.block(3000, ins("t", "1", "a"), ins("t", "2", "b"), ins("t", "3", "c"),
              upd("t", "1", "1", "d"), upd("t", "2", "2", "e"))
    wal.txn(3010, ins("u", "4"), ins("u", "5"), dele("t", "2"), dele("t", "3"))
    wal.block(3000, ins("t", "6", "f", sub=3001), ins("t", "7", "g", sub=3001),
              ins("t", "8", "h"), ins("t", "9", "i"), msg("p", b"m"))
    wal.block(3020, ins("u", "10"), ins("u", "11"), ins("u", "12"))
    wal.stream_abort(3000, 3001)
    wal.block(3000, dele("t", "8"), dele("t", "9"))
    wal.stream_commit(3000)
    wal.block(3020, upd("u", "10", "13"), upd("u", "11", "14"))
    wal.stream_prepare(3020, "p5")
    wal.prepared(3030, "p6", ins("t", "15", "j"), ins("t", "16", "k"))
    wal.commit_prepared(3020, "p5")
    wal.commit_prepared(3030, "p6")
    return wal


RUNS = runs_script()


def spooling_plugins() -> list[OutputPlugin]:
    """Plugins without stream callbacks: a stream block's changes go only to the spool."""
    return [Rec(), TwoPhaseRec(), TwoPhaseRec(filter_gids=("p5",))]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([RUNS, BIG]), st.lists(st.integers(0, len(BIG.items)), max_size=4),
       st.integers(1, 3000), st.booleans())
def test_changes_fed_a_run_at_a_time_give_what_each_fed_alone_gives(
        wal: Wal, batch_ends: list[int], memory_limit: int, spooling: bool) -> None:
    """The walsender source feeds a run of row changes in one call (feed_run), however its
    reads cut the stream: every plugin gets what a change at a time gives it."""
    plugins = spooling_plugins if spooling else big_plugins
    expected = run(wal.items, *plugins(), memory_limit=memory_limit)
    p, outs = pipeline(*plugins(), memory_limit=memory_limit)
    feed_in_runs(p, wal.items, batch_ends)
    assert [events(o) for o in outs] == expected


def normalized(evs: list[Event]) -> list[Event]:
    """Stream blocks taken back by a stream_abort after a reconnect leave no trace here."""
    return apply_streams(evs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(BIG.items)), max_size=3))
def test_a_reconnect_anywhere_delivers_everything_once(cuts: list[int]) -> None:
    """The connection is lost after ``cut`` messages (Pipeline.reset) and the server sends
    again from the slot's start: what is delivered already is skipped, a transaction cut short
    is taken back from the output and delivered whole, streams cut short are aborted."""
    p, outs = pipeline(*big_plugins())
    for cut in cuts:
        feed(p, BIG.items[:cut])
        p.reset()
    feed(p, BIG.items)
    got = [events(o) for o in outs]
    for i, (evs, expected) in enumerate(zip(got, BIG_BASELINE, strict=True)):
        if i in (0, 2, 4):  # no stream callbacks: nothing to abort, so nothing to normalize
            assert evs == expected
        else:
            assert normalized(evs) == normalized(expected)


def test_a_prepare_sent_again_is_skipped_by_every_plugin() -> None:
    wal = Wal()
    wal.table("t", "id")
    wal.prepared(2100, "twice", ins("t", "1"))
    sent = list(wal.items)
    cp, _ = wal.commit_prepared(2100, "twice")
    p, outs = pipeline(Rec(), TwoPhaseRec())
    feed(p, sent)
    p.reset()
    feed(p, wal.items)
    ordinary, two_phase = (events(o) for o in outs)
    assert ordinary == wal.ordinary(2100, cp)
    assert two_phase == [("begin_prepare", 2100, "twice"), *wal.changes(2100),
                         ("prepare", 2100, "twice"), ("commit_prepared", 2100, "twice", int(cp))]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, len(BIG.items)))
def test_a_restart_from_the_files_delivers_everything_once(tmp_path: Path, crash: int) -> None:
    """Files flushed after every message; the process dies after ``crash`` messages and a new
    one resumes the files while the server sends again from the slot's start."""
    directory = tmp_path / f"crash-{crash}"
    directory.mkdir(exist_ok=True)
    for f in directory.iterdir():
        if f.is_dir():
            shutil.rmtree(f)  # a hold directory
        else:
            f.unlink()
    paths = [directory / f"out{i}" for i in range(len(BIG_BASELINE))]

    def start() -> Pipeline:
        p = Pipeline(proto_version=4)
        for plugin, path in zip(big_plugins(), paths, strict=True):
            p.add(plugin, output=FileOutput(str(path)))
        p.startup()
        return p

    first = start()
    for data, lsn in BIG.items[:crash]:
        first.feed(data, lsn)
        first.flush()
    for m in first.members:  # it died: the kernel released its files' locks
        fcntl.flock(m.ctx.output._file.fileno(), fcntl.LOCK_UN)  # type: ignore[attr-defined]
    second = start()  # (the first one is never shut down: it died)
    for data, lsn in BIG.items:
        second.feed(data, lsn)
        second.flush()
    for i, (path, expected) in enumerate(zip(paths, BIG_BASELINE, strict=True)):
        evs = file_events(path)
        if i in (0, 2, 4):
            assert evs == expected
        else:
            assert normalized(evs) == normalized(expected)

