"""The text emitter's C fast path (emitters/_textrow.c) writes exactly the lines of its Python
change callback (test_decoding's format), or declines and leaves the change to it.

Each example runs transactions through two pipelines with the text emitter: one as
``pgdecode stream`` runs it (the fast path on), one without its ``fast_change`` callback
(every change through the Python callback, the reference). Their outputs, or their errors,
must be the same. test_emitter_text.py diffs both against test_decoding itself on the real
servers (``test_fast_path_on_and_off_match_test_decoding``).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorders import with_fast_path

from emitters.text import TestDecodingEmitter
from plugin_framework import LSN
from plugin_framework.framework import CallbackError, MemoryOutput, Pipeline
from plugin_framework.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    Delete,
    Insert,
    Prepare,
    RelationColumn,
    RelationMessage,
    TupleData,
    Update,
    encode,
)


def test_the_fast_path_is_built() -> None:
    """`pip install` compiles it (gcc is on every machine here): without it, nothing below
    would test anything and `pgdecode stream --emitter text` would be slow."""
    from emitters import _textrow

    assert _textrow.RowFormat is not None


# --- relations and rows -------------------------------------------------------------------------

# Every print_literal style (bare numbers, booleans, bit strings, quoted) and a type that is
# not built in (its name from the Type message the test does not send: the stream's "???").
TYPES = [20, 21, 23, 26, 700, 701, 1700, 16, 1560, 1562, 25, 1043, 3802, 1009, 17, 16500]

# The server's text never holds a NUL; anything else goes, quotes and invalid UTF-8 included
# (test_decoding writes a value's bytes as they are).
_values = st.one_of(
    st.binary(max_size=12).map(lambda b: b.replace(b"\0", b"")),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
            max_size=12).map(str.encode),
    st.sampled_from([b"'", b"''", b"t", b"f", b"true", b"%s", b"%%", b"101", b"NaN", b"-1.5"]))

_names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                 min_size=1, max_size=8)


@st.composite
def relations(draw: st.DrawFn) -> RelationMessage:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=7))
    names = draw(st.lists(_names, min_size=len(types), max_size=len(types), unique=True))
    keys = draw(st.lists(st.booleans(), min_size=len(types), max_size=len(types)))
    columns = tuple(RelationColumn(k, n, t, -1) for k, n, t in zip(keys, names, types,
                                                                     strict=True))
    return RelationMessage(16400, draw(_names), draw(_names), draw(st.sampled_from("dfi")),
                           columns)


@st.composite
def rows(draw: st.DrawFn, width: int) -> TupleData:
    kinds, values = [], []
    for _ in range(width):
        kind = draw(st.sampled_from("ttttttnu" + ("b" if draw(st.integers(0, 30)) == 0 else "")))
        kinds.append(ord(kind))
        values.append(draw(_values) if kind in "tb" else None)
    return TupleData(bytes(kinds), tuple(values))


@st.composite
def changes(draw: st.DrawFn) -> tuple[RelationMessage, list[Any]]:
    relation = draw(relations())
    width = len(relation.columns)
    out: list[Any] = []
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["I", "U", "D"]))
        before = draw(st.sampled_from(["key", "old", "none"]))
        old, new = draw(rows(width)), draw(rows(width))
        if action == "I":
            out.append(Insert(relation.relation_id, new))
        elif action == "U":
            out.append(Update(relation.relation_id, new,
                              key=old if before == "key" else None,
                              old=old if before == "old" else None))
        else:
            out.append(Delete(relation.relation_id, key=old if before != "old" else None,
                              old=old if before == "old" else None))
    return relation, out


# --- the two pipelines ------------------------------------------------------------------------

WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
OPTION_SETS: list[dict[str, str | None]] = [
    {}, {"skip-empty-xacts": "1"}, {"include-xids": "0", "skip-empty-xacts": "1"}]


class Run:
    """The text emitter's lines for some messages, or its error; how many changes its fast
    path wrote and how many it left to the callback."""

    def __init__(self, messages: list[bytes], fast: bool, options: dict[str, str | None],
                 proto: int = 1) -> None:
        self.used: Counter[str] = Counter()
        pipeline = Pipeline(proto_version=proto)
        out = MemoryOutput()
        pipeline.add(with_fast_path(TestDecodingEmitter(), self.used, fast), options=options,
                     output=out)
        pipeline.startup()
        self.error: str | None = None
        lsn = 0x16B3748
        try:
            for data in messages:
                lsn += 0x100
                pipeline.feed(data, LSN(lsn))
        except CallbackError as exc:
            self.error = f"{type(exc.cause).__name__}: {exc.cause}"
        self.lines = out.lines


def transaction(relation: RelationMessage, body: list[Any], xid: int = 741) -> list[bytes]:
    end = LSN(0x2000000 + 0x1000 * (xid - 741))  # a later transaction commits later
    return [encode(relation), encode(Begin(end, WHEN, xid)),
            *(encode(m) for m in body), encode(Commit(end, LSN(end + 0x100), WHEN))]


def _binary(m: Any) -> bool:
    return any(row is not None and b"b" in row.kinds
               for row in (getattr(m, "new", None), getattr(m, "key", None),
                           getattr(m, "old", None)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes(), st.sampled_from(OPTION_SETS))
def test_fast_lines_equal_the_callbacks(example: tuple[RelationMessage, list[Any]],
                                        options: dict[str, str | None]) -> None:
    relation, body = example
    messages = transaction(relation, body) + transaction(relation, body, xid=742)[1:]
    fast = Run(messages, True, options)
    reference = Run(messages, False, options)
    assert fast.error == reference.error
    assert fast.lines == reference.lines
    assert not reference.used
    if reference.error is None:
        # Offered every change; it writes each but binary ones, and under skip-empty-xacts
        # each transaction's first (whose BEGIN the callback prints first).
        assert fast.used["fast"] + fast.used["declined"] == 2 * len(body)
        gated = 2 if options.get("skip-empty-xacts") else 0
        assert fast.used["fast"] >= 2 * sum(not _binary(m) for m in body) - gated
        if not any(_binary(m) for m in body):
            assert fast.used["declined"] == gated


@settings(max_examples=300, deadline=None)
@given(changes(), st.data())
def test_damaged_messages_are_left_to_the_decoder(example: tuple[RelationMessage, list[Any]],
                                                  data: st.DataObject) -> None:
    """A damaged row change is never formatted: the decoder reports it, as without the fast
    path (or, damaged into another valid message, both print the same)."""
    relation, body = example
    messages = transaction(relation, body * 2)
    index = data.draw(st.integers(3, len(messages) - 2))  # a change after the first
    raw = bytearray(messages[index])
    cut = data.draw(st.integers(5, max(5, len(raw))))
    messages[index] = bytes(raw[:cut]) + data.draw(st.binary(max_size=6))
    outcomes = []
    for fast in (True, False):
        try:
            run = Run(messages, fast, {})
            outcomes.append((run.error, run.lines))
        except Exception as exc:  # the decoder's ProtocolError, or the pipeline's
            outcomes.append((f"{type(exc).__name__}: {exc}", None))
    assert outcomes[0] == outcomes[1]


def _row(*values: bytes | None) -> TupleData:
    return TupleData(bytes(ord("n") if v is None else ord("t") for v in values), values)


TABLE = RelationMessage(16401, "public", "t", "d", (RelationColumn(True, "id", 23, -1),
                                                    RelationColumn(False, "name", 25, -1)))
WIDER = RelationMessage(16401, "public", "t", "d", (*TABLE.columns,
                                                    RelationColumn(False, "ok", 16, -1)))


def test_a_relation_redescribed_mid_transaction_gets_a_new_formatter() -> None:
    *begun, commit = transaction(TABLE, [Insert(16401, _row(b"1", b"a'b"))])
    messages = [*begun, encode(WIDER), encode(Insert(16401, _row(b"2", None, b"t"))), commit]
    fast, reference = Run(messages, True, {}), Run(messages, False, {})
    assert fast.lines == reference.lines == [
        "BEGIN 741",
        "table public.t: INSERT: id[integer]:1 name[text]:'a''b'",
        "table public.t: INSERT: id[integer]:2 name[text]:null ok[boolean]:true",
        "COMMIT 741"]
    assert fast.used == {"fast": 2}


def test_prepared_transactions_take_the_fast_path() -> None:
    messages = [encode(TABLE),
                encode(BeginPrepare(LSN(0x2000000), LSN(0x2000100), WHEN, 742, "g1")),
                encode(Insert(16401, _row(b"1", b"a"))),
                encode(Prepare(LSN(0x2000000), LSN(0x2000100), WHEN, 742, "g1"))]
    fast, reference = Run(messages, True, {}, proto=3), Run(messages, False, {}, proto=3)
    assert fast.lines == reference.lines
    assert fast.lines[-1] == "PREPARE TRANSACTION 'g1', txid 742"
    assert fast.used == {"fast": 1}


def test_a_binary_column_is_the_callbacks_error() -> None:
    messages = transaction(TABLE, [Insert(16401, TupleData(b"tb", (b"1", b"\0\1")))])
    fast, reference = Run(messages, True, {}), Run(messages, False, {})
    assert fast.error == reference.error
    assert fast.error is not None and "binary = false" in fast.error
    assert fast.used == {"declined": 1}


@pytest.mark.parametrize("bad", [
    dict(heads=(b"a", b"b"), styles=b"\0", opens=(b"x",), bares=(b"y",)),
    dict(heads=(b"a", b"b", b"c"), styles=b"\0\0", opens=(b"x",), bares=(b"y",)),
    dict(heads=(b"a", b"b", b"c"), styles=b"\7", opens=(b"x",), bares=(b"y",)),
    dict(heads=(b"a", b"b", b"c"), styles=b"\0", opens=("x",), bares=(b"y",)),
])
def test_the_formatter_checks_what_it_is_made_of(bad: dict[str, Any]) -> None:
    from emitters import _textrow

    with pytest.raises(ValueError):
        _textrow.RowFormat(1, bad["heads"], bad["styles"], bad["opens"], bad["bares"], False)
