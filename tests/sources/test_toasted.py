"""toasted.Moves: which rows an incremental snapshot reads again because an UPDATE moved them
to another key leaving a TOASTed value out (the server test is
tests/sources/test_snapshot.py::test_incremental_snapshot_keeps_the_toast_values_a_window_leaves_unchanged)."""

from __future__ import annotations

from plugin_framework.protocol import TupleData, Update
from plugin_framework.sources.snapshots.toasted import Moves

REL = 16384


def row(key: str, doc: str | None) -> TupleData:
    """(id, doc): doc None is an unchanged TOAST value, not sent."""
    return TupleData(b"t" + (b"u" if doc is None else b"t"),
                     (key.encode(), None if doc is None else doc.encode()))


def moved(old: str, new: str, doc: str | None = None) -> Update:
    return Update(REL, row(new, doc), key=TupleData(b"tn", (old.encode(), None)))


def test_a_row_moved_leaving_its_value_out_is_kept_until_read() -> None:
    moves = Moves()
    assert moves.note(moved("5", "-5"), [0])
    assert not moves.note(Update(REL, row("-5", None)), [0])  # the same key: nothing new
    assert not moves.note(moved("1", "2", "whole"), [0])  # sent whole: nothing to read
    # moved on: the newest key too (the older stays: notes only add, a transaction may be
    # rolled back; a read finds no row there and drops it)
    assert moves.note(moved("-5", "7"), [0])
    assert list(moves.keys) == [(b"-5",), (b"7",)]


def test_once_the_chunks_are_read_only_rows_the_consumer_may_lack_are_kept() -> None:
    moves = Moves([(b"-5",)])
    moves.read_all = True
    assert not moves.note(moved("3", "-3"), [0])  # 3 was copied: the consumer has it
    assert moves.note(moved("-5", "-6"), [0])  # -5 was never given whole
    assert list(moves.keys) == [(b"-5",), (b"-6",)]


def test_a_read_answers_only_for_moves_noted_before_it() -> None:
    moves = Moves([(b"-1",)])
    noted = moves.noted
    moves.note(moved("2", "-2"), [0])  # after the read began: the read may not have it
    moves.delivered([(b"-1",), (b"-2",)], noted)
    assert list(moves.keys) == [(b"-2",)]
    moves.delivered([(b"-2",)], moves.noted)
    assert not moves
