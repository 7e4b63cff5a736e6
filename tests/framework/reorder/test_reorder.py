"""The reorder contract, server-free: scripted pgoutput streams (tests/support/scripted.py,
built with ``protocol.encode``) fed to a Pipeline, and what each kind of plugin must
receive.

The expected events follow PostgreSQL's reorder buffer (reorderbuffer.c, decode.c,
logical.c): only committed transactions reach begin/change/commit, in commit order; a plugin
with stream callbacks gets the blocks as sent, one without gets the transaction whole at
Stream Commit with aborted subtransactions left out; a two-phase plugin gets a prepared
transaction at PREPARE (unless filter_prepare says no), the others at COMMIT PREPARED and
nothing at ROLLBACK PREPARED; non-transactional messages at once. The cases of
tests/framework/reorder/test_delivery_edges.py are reproduced here first, in the same order.
Re-sends, spills and restarts of every kind of transaction at once:
tests/framework/reorder/test_reorder_recovery.py.
"""

from __future__ import annotations

import fcntl
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.recorders import (
    Event,
    apply_streams,
    apply_two_phase,
)
from support.scripted import (
    FinalLsnRecorder,
    Minimal,
    OriginFilter,
    OriginRecorder,
    Rec,
    StreamingOff,
    StreamOriginFilter,
    StreamRec,
    StreamTwoPhaseRec,
    StreamWithoutOptional,
    TwoPhaseOff,
    TwoPhaseOriginFilter,
    TwoPhaseRec,
    Wal,
    alter,
    changes_of,
    dele,
    emitting,
    events,
    feed,
    ins,
    msg,
    nontx,
    pipeline,
    run,
    spilled,
    trunc,
    upd,
)

from plugin_framework import LSN, Pipeline, PipelineError

# --- the cases of tests/framework/reorder/test_delivery_edges.py -------------------------------


def test_message_just_before_commit_neither_hides_nor_unacks_the_transaction() -> None:
    """A non-transactional message is sent when decoded, before its transaction; its LSN is
    where its record ends, which is where the COMMIT record starts when it comes last."""
    wal = Wal()
    wal.table("t", "id")
    c1, _ = wal.txn(700, ins("t", "1"), nontx("audit", b"x"))
    c2, _ = wal.txn(701, ins("t", "2"))
    message = wal.items[0]
    assert message[1] == c1  # (the script's layout: the message's record ends at the COMMIT)
    [evs] = run(wal.items, Rec())
    assert evs == [("message", False, "audit", b"x", int(c1)), *wal.ordinary(700, c1),
                   *wal.ordinary(701, c2)]

    # Acknowledging what was delivered up to the message leaves the transaction in the slot:
    # the server skips a commit record only if it lies before the confirmed LSN.
    p, [out] = pipeline(Rec())
    for data, lsn in wal.items:
        p.feed(data, lsn)
        if p.position >= message[1]:
            break
    ack = p.flush()
    assert not c1 < ack
    resent = wal.items[1:]  # the message's record starts before ack: not sent again
    [again] = run(resent, Rec())
    assert changes_of(again) == [(("change", "t", "INSERT", (("id", "1"),), None, False)),
                                 (("change", "t", "INSERT", (("id", "2"),), None, False))]
    assert not [e for e in again if e[0] == "message"]
    # The pipeline that acknowledged, fed the re-send after a reconnect: each thing once.
    p.reset()
    feed(p, resent)
    assert events(out) == evs


@pytest.mark.parametrize("memory_limit", [None, 1])
def test_prepared_transaction_that_alters_its_table_replays_each_row_as_it_was(
        memory_limit: int | None) -> None:
    wal = Wal()
    wal.table("t", "id", "a", "b")
    wal.prepared(710, "reshape", ins("t", "1", "a1", "b1"), alter("t", "id", "b"),
                 ins("t", "2", "b2"), alter("t", "id", "b", "c"), ins("t", "3", "b3", "3"))
    cp, _ = wal.commit_prepared(710, "reshape")
    c2, _ = wal.txn(711, ins("t", "4", "b4", "4"))  # the last description, not sent again
    expected = [(("id", "1"), ("a", "a1"), ("b", "b1")), (("id", "2"), ("b", "b2")),
                (("id", "3"), ("b", "b3"), ("c", "3")), (("id", "4"), ("b", "b4"), ("c", "4"))]
    ordinary, two_phase = run(wal.items, Rec(), TwoPhaseRec(), memory_limit=memory_limit)
    assert [e[3] for e in changes_of(two_phase)] == expected  # live, as the messages came
    assert [e[3] for e in changes_of(ordinary)] == expected  # replayed at COMMIT PREPARED
    assert ordinary == [*wal.ordinary(710, cp), *wal.ordinary(711, c2)]
    assert two_phase == [("begin_prepare", 710, "reshape"), *wal.changes(710),
                         ("prepare", 710, "reshape"), ("commit_prepared", 710, "reshape", int(cp)),
                         *wal.ordinary(711, c2)]


@pytest.mark.parametrize("memory_limit", [None, 1])
def test_streamed_prepared_transaction_that_alters_its_table_replays_each_row_as_it_was(
        memory_limit: int | None) -> None:
    """pgoutput describes a table again in every streamed transaction that uses it, and
    after it changes shape: the spool holds each definition where it applies."""
    wal = Wal()
    wal.table("t", "id", "a", "b")
    b1 = wal.block(720, *(ins("t", str(g), f"a{g}", f"b{g}") for g in range(1, 301)))
    b2 = wal.block(720, alter("t", "id", "b"),
                   *(ins("t", str(g), f"b{g}") for g in range(301, 601)))
    wal.stream_prepare(720, "reshape-streamed")
    cp, _ = wal.commit_prepared(720, "reshape-streamed")
    p, outs = pipeline(Rec(), StreamRec(), TwoPhaseRec(), StreamTwoPhaseRec(),
                       memory_limit=memory_limit)
    feed(p, wal.items)
    ordinary, streamer, two_phase, both = (events(o) for o in outs)
    rows = [e[3] for e in changes_of(ordinary)]
    assert len(rows) == 600
    assert rows[0] == (("id", "1"), ("a", "a1"), ("b", "b1"))
    assert rows[299] == (("id", "300"), ("a", "a300"), ("b", "b300"))
    assert rows[300] == (("id", "301"), ("b", "b301"))
    assert ordinary == wal.ordinary(720, cp)
    # Without two-phase callbacks, a streaming plugin gets the outcome as the end of a stream.
    assert streamer == [*b1, *b2, ("stream_commit", 720, int(cp))]
    assert two_phase == [("begin_prepare", 720, "reshape-streamed"), *wal.changes(720),
                         ("prepare", 720, "reshape-streamed"),
                         ("commit_prepared", 720, "reshape-streamed", int(cp))]
    assert both == [*b1, *b2, ("stream_prepare", 720, "reshape-streamed"),
                    ("commit_prepared", 720, "reshape-streamed", int(cp))]
    if memory_limit == 1:
        assert spilled(p) > 0


def test_commit_prepared_gets_the_commit_as_final_lsn() -> None:
    """txn->final_lsn is the COMMIT PREPARED record's LSN there (ReorderBufferFinishPrepared),
    not the PREPARE's."""
    wal = Wal()
    wal.table("t", "id")
    wal.prepared(730, "final", ins("t", "1"))
    cp, _ = wal.commit_prepared(730, "final")
    [evs] = run(wal.items, emitting(FinalLsnRecorder)())
    assert [e for e in evs if e[0] == "commit_prepared"] == [
        ("commit_prepared", "final", int(cp), int(cp))]


def _prepared_then_acknowledged(gid: str) -> tuple[Wal, LSN, int]:
    """A two-phase plugin alone reads a PREPARE and acknowledges past it; then a new session
    starts from there. Returns the script, the prepare's end and where the session starts."""
    wal = Wal()
    wal.table("t", "id")
    _, prepare_end = wal.prepared(740, gid, ins("t", "1"))
    p, _ = pipeline(TwoPhaseRec())
    feed(p, wal.items)
    ack = p.flush()
    assert ack == prepare_end
    return wal, prepare_end, wal.reconnect()


def test_rollback_of_a_transaction_prepared_before_this_pipeline_owes_others_nothing() -> None:
    wal, prepare_end, start = _prepared_then_acknowledged("undone")
    wal.rollback_prepared(740, "undone", prepare_end)
    c2, _ = wal.txn(741, ins("t", "2"))
    ordinary, two_phase = run(wal.items[start:], Rec(), TwoPhaseRec())
    assert ordinary == wal.ordinary(741, c2)
    assert two_phase == [("rollback_prepared", 740, "undone"), *wal.ordinary(741, c2)]


def test_commit_of_a_transaction_prepared_before_this_pipeline_is_refused_for_others() -> None:
    """Its changes are no longer in the slot: the ordinary plugin must not silently miss them."""
    wal, _, start = _prepared_then_acknowledged("done")
    cp, _ = wal.commit_prepared(740, "done")
    with pytest.raises(PipelineError, match='prepared transaction "done" was prepared before'):
        run(wal.items[start:], Rec(), TwoPhaseRec())
    [alone] = run(wal.items[start:], TwoPhaseRec())  # a two-phase plugin alone takes it
    assert alone == [("commit_prepared", 740, "done", int(cp))]


def test_a_stream_prepared_transaction_sent_again_after_a_lost_connection_is_kept_once() -> None:
    """A streaming plugin without two-phase callbacks got a transaction's blocks, then its
    Stream Prepare: it waits for COMMIT PREPARED. The connection is lost and the server
    streams the transaction again from its start. Every plugin ends with it once."""
    wal = Wal()
    wal.table("t", "id")
    b1 = wal.block(760, *(ins("t", str(g)) for g in range(1, 101)))
    b2 = wal.block(760, *(ins("t", str(g)) for g in range(101, 201)))
    wal.stream_prepare(760, "again")
    sent = list(wal.items)
    p, outs = pipeline(StreamRec(), Rec(), TwoPhaseRec(), StreamTwoPhaseRec())
    feed(p, sent)
    p.reset()
    feed(p, sent)  # what a reconnect gets: the same again
    cp, _ = wal.commit_prepared(760, "again")
    feed(p, wal.items[len(sent):])
    streamer, ordinary, two_phase, both = (events(o) for o in outs)
    rows = [e for e in apply_streams(streamer) if e[0] == "change"]
    assert len(rows) == 200
    assert streamer == [*b1, *b2, ("stream_commit", 760, int(cp))]
    assert ordinary == wal.ordinary(760, cp)
    assert two_phase == [("begin_prepare", 760, "again"), *wal.changes(760),
                         ("prepare", 760, "again"), ("commit_prepared", 760, "again", int(cp))]
    assert both == [*b1, *b2, ("stream_prepare", 760, "again"),
                    ("commit_prepared", 760, "again", int(cp))]


# --- streamed transactions ------------------------------------------------------------------


def test_interleaved_stream_blocks_reach_each_plugin_as_its_callbacks_say() -> None:
    wal = Wal()
    wal.table("t", "id", "v")
    a1 = wal.block(800, ins("t", "1", "a"), ins("t", "2", "b", sub=801))
    b1 = wal.block(810, ins("t", "10", "x"))
    c820, _ = wal.txn(820, ins("t", "20", "y"))  # small, committed meanwhile
    a2 = wal.block(800, upd("t", "1", "1", "a2"), dele("t", "2", sub=801))
    c810, _ = wal.stream_commit(810)
    c800, _ = wal.stream_commit(800)
    ordinary, streamer = run(wal.items, Rec(), StreamRec())
    assert ordinary == [*wal.ordinary(820, c820), *wal.ordinary(810, c810),
                        *wal.ordinary(800, c800)]
    assert streamer == [*a1, *b1, *wal.ordinary(820, c820), *a2, ("stream_commit", 810, int(c810)),
                        ("stream_commit", 800, int(c800))]
    assert apply_streams(streamer) == ordinary


@pytest.mark.parametrize("memory_limit", [None, 1])
def test_aborted_subtransaction_of_a_stream(memory_limit: int | None) -> None:
    """ROLLBACK TO SAVEPOINT in a streamed transaction: a streaming plugin gets stream_abort
    for the subtransaction (txn.toptxn set); the others never see its changes."""
    wal = Wal()
    wal.table("t", "id")
    s1 = wal.block(900, ins("t", "1"), ins("t", "2", sub=901), ins("t", "3", sub=902))
    wal.stream_abort(900, 901)
    s2 = wal.block(900, ins("t", "4"), ins("t", "5", sub=902))
    c, _ = wal.stream_commit(900)
    ordinary, streamer, two_phase = run(wal.items, Rec(), StreamRec(), TwoPhaseRec(),
                                        memory_limit=memory_limit)
    assert [e[3] for e in changes_of(ordinary)] == [(("id", k),) for k in "1345"]
    assert ordinary == two_phase == wal.ordinary(900, c)
    assert streamer == [*s1, ("stream_abort", 900, 901), *s2, ("stream_commit", 900, int(c))]


def test_aborted_stream() -> None:
    wal = Wal()
    wal.table("t", "id")
    s1 = wal.block(910, ins("t", "1"))
    s2 = wal.block(910, ins("t", "2", sub=911))
    wal.stream_abort(910)
    c, _ = wal.txn(920, ins("t", "3"))
    wal.stream_abort(930)  # a transaction never streamed to us: nothing to undo
    ordinary, streamer = run(wal.items, Rec(), StreamRec())
    assert ordinary == wal.ordinary(920, c)
    assert streamer == [*s1, *s2, ("stream_abort", 910, 910), *wal.ordinary(920, c)]


def test_truncate_and_messages_in_a_stream() -> None:
    wal = Wal()
    wal.table("t", "id")
    wal.table("u", "id")
    s = wal.block(930, ins("t", "1"), trunc("t", "u", cascade=True), msg("p", b"in"),
                  ins("u", "2"))
    c, _ = wal.stream_commit(930)
    ordinary, streamer, minimal = run(wal.items, Rec(), StreamRec(), Minimal())
    assert ordinary == wal.ordinary(930, c)
    assert [e[0] for e in ordinary] == ["begin", "change", "truncate", "message", "change",
                                        "commit"]
    assert ("truncate", ("t", "u"), True, False) in ordinary
    assert streamer == [*s, ("stream_commit", 930, int(c))]
    assert [e[0] for e in s] == ["stream_start", "stream_change", "stream_truncate",
                                 "stream_message", "stream_change", "stream_stop"]
    assert minimal == [("begin", 930), ("change", "t", "INSERT"), ("change", "u", "INSERT"),
                       ("commit", 930)]


def test_a_non_transactional_message_between_blocks_comes_at_once() -> None:
    """It is delivered when decoded: before the streamed transaction around it commits."""
    wal = Wal()
    wal.table("t", "id")
    s = wal.block(940, ins("t", "1"))
    m = wal.nontx("audit", b"now")
    c, _ = wal.stream_commit(940)
    ordinary, streamer = run(wal.items, Rec(), StreamRec())
    message = ("message", False, "audit", b"now", int(m))
    assert ordinary == [message, *wal.ordinary(940, c)]
    assert streamer == [*s, message, ("stream_commit", 940, int(c))]


# --- random interleavings --------------------------------------------------------------------


@st.composite
def schedules(draw: Any) -> tuple[Wal, dict[int, LSN], list[Event]]:
    """Up to four transactions, each streamed in blocks or sent whole at its commit, with
    subtransactions and savepoint rollbacks; the blocks of the streamed ones interleaved at
    random, the commits in order. Returns the script, commit LSNs and the streamer's
    expected blocks are checked by apply_streams."""
    wal = Wal()
    wal.table("t", "id", "v")
    n = draw(st.integers(1, 4))
    plans = []
    key = 0
    for i in range(n):
        xid = 1000 + 10 * i
        streamed = draw(st.booleans())
        nblocks = draw(st.integers(1, 3)) if streamed else 1
        blocks = []
        for _ in range(nblocks):
            ops = []
            for _ in range(draw(st.integers(1, 4))):
                key += 1
                sub = draw(st.sampled_from([None, xid + 1, xid + 2])) if streamed else None
                ops.append(ins("t", str(key), draw(st.sampled_from(["a", "b", None])),
                               sub=sub))
            blocks.append(ops)
        aborted_sub = draw(st.sampled_from([None, xid + 1])) if streamed else None
        abort_all = streamed and draw(st.integers(0, 5)) == 0
        plans.append((xid, streamed, blocks, aborted_sub, abort_all))
    # The order: each streamed transaction's blocks in order, anywhere before its end; the
    # ends (commit, or abort) in the transactions' order.
    pending = {xid: list(blocks) for xid, streamed, blocks, _, _ in plans if streamed}
    commits: dict[int, LSN] = {}
    nontx_events: list[Event] = []
    for xid, streamed, blocks, aborted_sub, abort_all in plans:
        while pending.get(xid):
            ready = [x for x, bs in pending.items() if bs]
            pick = draw(st.sampled_from(ready))
            wal.block(pick, *pending[pick].pop(0))
            if draw(st.integers(0, 6)) == 0:
                lsn = wal.nontx("n", b"x")
                nontx_events.append(("message", False, "n", b"x", int(lsn)))
        if not streamed:
            commits[xid], _ = wal.txn(xid, *blocks[0])
        elif abort_all:
            wal.stream_abort(xid)
        else:
            if aborted_sub is not None:
                wal.stream_abort(xid, aborted_sub)
            commits[xid], _ = wal.stream_commit(xid)
    return wal, commits, nontx_events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(), st.sampled_from([None, 1, 700, 3000]))
def test_any_interleaving_of_stream_blocks_gives_the_committed_order(
        schedule: tuple[Wal, dict[int, LSN], list[Event]], memory_limit: int | None) -> None:
    wal, commits, nontx_events = schedule
    ordinary, streamer = run(wal.items, Rec(), StreamRec(), memory_limit=memory_limit)
    transactions = [e for xid, c in commits.items() for e in wal.ordinary(xid, c)]
    assert [e for e in ordinary if e[0] != "message"] == transactions
    assert [e for e in ordinary if e[0] == "message"] == nontx_events
    assert apply_streams(streamer) == ordinary
    # Every streamed change inside a block of its own transaction, tagged with the top-level
    # xid, and with its subtransaction's as the change's.
    open_xid = None
    for e in streamer:
        if e[0] == "stream_start":
            assert open_xid is None
            open_xid = e[1]
        elif e[0] == "stream_stop":
            assert open_xid == e[1]
            open_xid = None
        elif e[0] == "stream_change":
            assert e[1] == open_xid and e[2] in (e[1], e[1] + 1, e[1] + 2)


# --- two-phase --------------------------------------------------------------------------------


def test_prepared_transactions_by_kind_of_plugin() -> None:
    """A two-phase plugin gets begin_prepare .. prepare at PREPARE and the outcome later;
    without two-phase callbacks, or when filter_prepare says no, the transaction comes as an
    ordinary one at COMMIT PREPARED (after what committed meanwhile), nothing at ROLLBACK
    PREPARED."""
    wal = Wal()
    wal.table("t", "id")
    wal.prepared(1000, "g1", ins("t", "1"), msg("p", b"m"))
    c1001, _ = wal.txn(1001, ins("t", "2"))
    cp, _ = wal.commit_prepared(1000, "g1")
    _, prepare_end = wal.prepared(1002, "g2", ins("t", "3"))
    wal.rollback_prepared(1002, "g2", prepare_end)
    ordinary, streamer, two_phase, both, filtering = run(
        wal.items, Rec(), StreamRec(), TwoPhaseRec(), StreamTwoPhaseRec(),
        TwoPhaseRec(filter_gids=("g1", "g2")))
    assert ordinary == [*wal.ordinary(1001, c1001), *wal.ordinary(1000, cp)]
    assert streamer == ordinary  # nothing was streamed
    g2 = [("begin_prepare", 1002, "g2"), *wal.changes(1002), ("prepare", 1002, "g2"),
          ("rollback_prepared", 1002, "g2")]
    assert two_phase == both == [
        ("begin_prepare", 1000, "g1"), *wal.changes(1000), ("prepare", 1000, "g1"),
        *wal.ordinary(1001, c1001), ("commit_prepared", 1000, "g1", int(cp)), *g2]
    assert filtering == ordinary
    assert apply_two_phase(two_phase) == ordinary


def test_streamed_prepared_transactions_by_kind_of_plugin() -> None:
    wal = Wal()
    wal.table("t", "id")
    a1 = wal.block(1100, ins("t", "1"), ins("t", "2", sub=1101))
    wal.stream_abort(1100, 1101)
    a2 = wal.block(1100, ins("t", "3"))
    wal.stream_prepare(1100, "sp")
    cp, _ = wal.commit_prepared(1100, "sp")
    b1 = wal.block(1110, ins("t", "4"))
    _, prepare_end = wal.stream_prepare(1110, "sr")
    wal.rollback_prepared(1110, "sr", prepare_end)
    ordinary, streamer, two_phase, both, filtering = run(
        wal.items, Rec(), StreamRec(), TwoPhaseRec(), StreamTwoPhaseRec(),
        StreamTwoPhaseRec(filter_gids=("sp",)))
    sub_abort = ("stream_abort", 1100, 1101)
    assert wal.changes(1100) == [
        ("change", "t", "INSERT", (("id", "1"),), None, False),
        ("change", "t", "INSERT", (("id", "3"),), None, False)]
    assert ordinary == wal.ordinary(1100, cp)
    # without two-phase callbacks: the outcome ends the stream
    assert streamer == [*a1, sub_abort, *a2, ("stream_commit", 1100, int(cp)),
                        *b1, ("stream_abort", 1110, 1110)]
    assert two_phase == [
        ("begin_prepare", 1100, "sp"), *wal.changes(1100), ("prepare", 1100, "sp"),
        ("commit_prepared", 1100, "sp", int(cp)),
        ("begin_prepare", 1110, "sr"), *wal.changes(1110), ("prepare", 1110, "sr"),
        ("rollback_prepared", 1110, "sr")]
    assert both == [*a1, sub_abort, *a2, ("stream_prepare", 1100, "sp"),
                    ("commit_prepared", 1100, "sp", int(cp)),
                    *b1, ("stream_prepare", 1110, "sr"), ("rollback_prepared", 1110, "sr")]
    # filter_prepare says no to "sp": decoded as if the slot had no two-phase for it
    assert filtering == [*a1, sub_abort, *a2, ("stream_commit", 1100, int(cp)),
                         *b1, ("stream_prepare", 1110, "sr"), ("rollback_prepared", 1110, "sr")]
    assert apply_two_phase(apply_streams(both)) == ordinary


def test_streamed_prepared_remainder_waits_for_the_outcome_where_prepare_is_declined() -> None:
    """pgoutput streams the rest of a streamed transaction at PREPARE (the block right before
    Stream Prepare) and sends Stream Prepare whatever our plugins' filter_prepare says. A
    streaming plugin that does not take the transaction at PREPARE (no two-phase callbacks,
    or filter_prepare says no) gets in PostgreSQL nothing at PREPARE (decode.c's
    FilterPrepare), the rest as one more block and stream_commit at COMMIT PREPARED
    (ReorderBufferCommit of a streamed transaction), and at ROLLBACK PREPARED stream_abort
    for each subtransaction it had changes of, in ascending xid order, then for the
    transaction (ReorderBufferAbort); the rest never reaches it."""
    wal = Wal()
    wal.table("t", "id")
    a1 = wal.block(1200, ins("t", "1"), ins("t", "2", sub=1201))
    c1, _ = wal.txn(1203, ins("t", "10"))  # a memory-limit block is followed by others
    a2 = wal.block(1200, ins("t", "3"))
    a3 = wal.block(1200, ins("t", "4"))  # the remainder, streamed at PREPARE
    wal.stream_prepare(1200, "keep")
    c2, _ = wal.txn(1204, ins("t", "11"))
    cp, _ = wal.commit_prepared(1200, "keep")
    b1 = wal.block(1210, ins("t", "5", sub=1212), ins("t", "6", sub=1211), ins("t", "7"))
    b2 = wal.block(1210, ins("t", "8", sub=1213))
    _, prepare_end = wal.stream_prepare(1210, "gone")
    rp = wal.rollback_prepared(1210, "gone", prepare_end)
    ordinary, streamer, two_phase, both, filtering = run(
        wal.items, Rec(), StreamRec(), TwoPhaseRec(), StreamTwoPhaseRec(),
        StreamTwoPhaseRec(filter_gids=("keep", "gone")))
    t1203, t1204 = wal.ordinary(1203, c1), wal.ordinary(1204, c2)
    declined = [*a1, *t1203, *a2, *t1204, *a3, ("stream_commit", 1200, int(cp)),
                *b1, ("stream_abort", 1210, 1211), ("stream_abort", 1210, 1212),
                ("stream_abort", 1210, 1210)]
    assert streamer == declined
    assert filtering == declined
    assert both == [*a1, *t1203, *a2, *a3, ("stream_prepare", 1200, "keep"), *t1204,
                    ("commit_prepared", 1200, "keep", int(cp)),
                    *b1, *b2, ("stream_prepare", 1210, "gone"),
                    ("rollback_prepared", 1210, "gone")]
    assert ordinary == [*t1203, *t1204, *wal.ordinary(1200, cp)]
    assert two_phase == [*t1203, ("begin_prepare", 1200, "keep"), *wal.changes(1200),
                         ("prepare", 1200, "keep"), *t1204,
                         ("commit_prepared", 1200, "keep", int(cp)),
                         ("begin_prepare", 1210, "gone"), *wal.changes(1210),
                         ("prepare", 1210, "gone"), ("rollback_prepared", 1210, "gone")]
    assert int(rp) > 0


def test_streamed_prepared_transaction_with_catalog_changes_ends_at_the_commit() -> None:
    """A transaction that changed the catalog (a TRUNCATE) has invalidations in its commit
    record, which ReorderBufferCommit queues as a last change: a declining streaming plugin
    gets a block at COMMIT PREPARED even when nothing was left to stream at PREPARE."""
    wal = Wal()
    wal.table("t", "id")
    a1 = wal.block(1220, ins("t", "1"), trunc("t"))
    a2 = wal.block(1220, ins("t", "2"))
    c1, _ = wal.txn(1221, ins("t", "10"))  # so a2 was not streamed at PREPARE
    wal.stream_prepare(1220, "cat")
    cp, _ = wal.commit_prepared(1220, "cat")
    [streamer] = run(wal.items, StreamRec())
    assert streamer == [*a1, *a2, *wal.ordinary(1221, c1), ("stream_start", 1220),
                        ("stream_stop", 1220), ("stream_commit", 1220, int(cp))]


def test_a_block_with_nothing_published_counts_as_streamed_before_prepare() -> None:
    """pgoutput opens a block for changes it then does not send (tables outside the
    publication): the server streamed the transaction for its memory limit all the same, so
    the next block, right before Stream Prepare, is the one streamed at PREPARE."""
    wal = Wal()
    wal.table("t", "id")
    wal.block(1240)  # Stream Start, Stream Stop: nothing for the plugins
    a2 = wal.block(1240, ins("t", "1"))
    wal.stream_prepare(1240, "e")
    c, _ = wal.txn(1241, ins("t", "10"))
    cp, _ = wal.commit_prepared(1240, "e")
    [streamer] = run(wal.items, StreamRec())
    assert streamer == [*wal.ordinary(1241, c), *a2, ("stream_commit", 1240, int(cp))]


def test_a_held_back_block_is_dropped_with_a_lost_connection() -> None:
    """reset() after a block held back from a streaming plugin: the server streams the
    transaction again from its start; the plugin is told to abort what it had, and gets
    the held-back block only once, from the re-send."""
    wal = Wal()
    wal.table("t", "id")
    first = wal.block(1230, ins("t", "1"))
    wal.block(1230, ins("t", "2"))
    cut = len(wal.items)
    again = wal.reconnect()
    wal.streams.discard(1230)
    wal.expected.pop(1230, None)
    b1 = wal.block(1230, ins("t", "1"))
    b2 = wal.block(1230, ins("t", "2"))
    c, _ = wal.stream_commit(1230)
    p, [out] = pipeline(StreamRec())
    feed(p, wal.items[:cut])
    p.reset()
    feed(p, wal.items[again:])
    assert events(out) == [*first, ("stream_abort", 1230, 1230), *b1, *b2,
                           ("stream_commit", 1230, int(c))]


# --- origins, descriptions, TRUNCATE, messages -------------------------------------------------


def test_filter_by_origin_skips_whole_transactions_for_the_plugin_that_asks() -> None:
    wal = Wal()
    wal.table("t", "id")
    c1, _ = wal.txn(1200, ins("t", "1"), origin="upstream")
    c2, _ = wal.txn(1201, ins("t", "2"), origin="elsewhere")
    wal.block(1210, ins("t", "3"), origin="upstream")
    wal.block(1210, ins("t", "4"))
    c3, _ = wal.stream_commit(1210)
    wal.prepared(1220, "from-upstream", ins("t", "5"), origin="upstream")
    c4, _ = wal.commit_prepared(1220, "from-upstream")
    c5, _ = wal.txn(1230, ins("t", "6"))
    ordinary, streamer, two_phase, everything = run(
        wal.items, emitting(OriginFilter)(), emitting(StreamOriginFilter)(),
        emitting(TwoPhaseOriginFilter)(), emitting(OriginRecorder)())
    kept = [*wal.ordinary(1201, c2), *wal.ordinary(1230, c5)]
    assert ordinary == streamer == two_phase == kept
    assert [e for e in everything if e[0] == "begin"] == [
        ("begin", 1200, "upstream"), ("begin", 1201, "elsewhere"), ("begin", 1210, "upstream"),
        ("begin", 1220, "upstream"), ("begin", 1230, None)]
    assert [e for e in everything if e[0] == "commit"] == [
        ("commit", x, int(c)) for x, c in ((1200, c1), (1201, c2), (1210, c3), (1220, c4),
                                          (1230, c5))]


def test_a_table_described_again_mid_transaction() -> None:
    """Each change decodes with the description in force where it was made, live and from
    a spool; later transactions use the last one."""
    wal = Wal()
    wal.table("t", "id", "a")
    c1, _ = wal.txn(1300, ins("t", "1", "x"), alter("t", "id"), ins("t", "2"),
                    alter("t", "id", "b", "c"), upd("t", "2", "2", "y", None))
    s = wal.block(1310, ins("t", "3", "p", "q"), alter("t", "id", "c"), ins("t", "4", "r"))
    c2, _ = wal.stream_commit(1310)
    c3, _ = wal.txn(1320, dele("t", "4"))
    ordinary, streamer = run(wal.items, Rec(), StreamRec(), memory_limit=1)
    assert [e[3] or e[4] for e in changes_of(ordinary)] == [
        (("id", "1"), ("a", "x")), (("id", "2"),), (("id", "2"), ("b", "y"), ("c", None)),
        (("id", "3"), ("b", "p"), ("c", "q")), (("id", "4"), ("c", "r")),
        (("id", "4"), ("c", None))]
    assert ordinary == [*wal.ordinary(1300, c1), *wal.ordinary(1310, c2),
                        *wal.ordinary(1320, c3)]
    assert streamer == [*wal.ordinary(1300, c1), *s, ("stream_commit", 1310, int(c2)),
                        *wal.ordinary(1320, c3)]


def test_truncate_and_transactional_messages() -> None:
    """One truncate call with every relation of the statement and its flags, skipped for a
    plugin without the callback; transactional messages in their place in the transaction."""
    wal = Wal()
    wal.table("t", "id")
    wal.table("u", "id")
    c1, _ = wal.txn(1400, ins("t", "1"), msg("audit", b"before"),
                    trunc("u", "t", cascade=True, restart=True), msg("audit", b"after"))
    ordinary, minimal = run(wal.items, Rec(), Minimal())
    assert [e[0] for e in ordinary] == ["begin", "change", "message", "truncate", "message",
                                        "commit"]
    assert ordinary[3] == ("truncate", ("t", "u"), True, True)
    assert ordinary == wal.ordinary(1400, c1)
    assert minimal == [("begin", 1400), ("change", "t", "INSERT"), ("commit", 1400)]


# --- optional callbacks, and capabilities a plugin turns off ----------------------------------


def test_optional_stream_callbacks_and_capabilities_turned_off() -> None:
    wal = Wal()
    wal.table("t", "id")
    s = wal.block(2200, ins("t", "1"), msg("p", b"m"), trunc("t"))
    c1, _ = wal.stream_commit(2200)
    wal.prepared(2210, "off", ins("t", "2"))
    cp, _ = wal.commit_prepared(2210, "off")
    without, streaming_off, two_phase_off, ordinary = run(
        wal.items, emitting(StreamWithoutOptional)(), emitting(StreamingOff)(),
        emitting(TwoPhaseOff)(), Rec())
    assert without == [s[0], s[1], s[-1], ("stream_commit", 2200, int(c1)),
                       *wal.ordinary(2210, cp)]
    assert streaming_off == two_phase_off == ordinary == [*wal.ordinary(2200, c1),
                                                          *wal.ordinary(2210, cp)]


@pytest.mark.xfail(strict=True, reason=(
    "pgoutput sends a streamed transactional message with the top-level xid, so the "
    "pipeline cannot drop it with its aborted subtransaction as PostgreSQL's reorder buffer "
    "does (docs/framework.md, known limits)"))
def test_a_message_of_an_aborted_subtransaction_of_a_stream_is_dropped() -> None:
    wal = Wal()
    wal.table("t", "id")
    wal.block(2300, ins("t", "1"), msg("p", b"gone", sub=2301), ins("t", "2", sub=2301))
    wal.stream_abort(2300, 2301)
    c, _ = wal.stream_commit(2300)
    [ordinary] = run(wal.items, Rec())
    assert ordinary == wal.ordinary(2300, c)


def died(p: Pipeline) -> None:
    """What the kernel does for a process that dies: its files' locks are released (the
    pipeline's objects stay, unclosed)."""
    for m in p.members:
        fcntl.flock(m.ctx.output._file.fileno(), fcntl.LOCK_UN)  # type: ignore[attr-defined]
