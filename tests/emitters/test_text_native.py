"""The text emitter's C fast path (emitters/text/native/_textrow.c) writes exactly the lines of
its Python change callback (test_decoding's format), or declines and leaves the change to it.

Each example runs transactions through two pipelines (tests/support/native.py): the fast path on, as
``pgdecode stream`` runs it, and off (every change through the Python callback, the
reference). test_emitter_text.py diffs both against test_decoding itself on the real servers
(``test_fast_path_on_and_off_match_test_decoding``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.native import (
    WHEN,
    Run,
    binary,
    both,
    changes,
    damaged_outcomes_agree,
    relations,
    transaction,
)

from emitters.text import TestDecodingEmitter
from plugin_framework import LSN
from plugin_framework.protocol import (
    BeginPrepare,
    Insert,
    Prepare,
    RelationColumn,
    RelationMessage,
    TupleData,
    encode,
)

# The C formatter against its Python reference: nothing to compare under PGDECODE_IMPL=python
pytestmark = pytest.mark.native


def test_the_fast_path_is_built() -> None:
    """`pip install` compiles it (gcc is on every machine here): without it, nothing below
    would test anything and `pgdecode stream --emitter text` would be slow."""
    from emitters.text.native import _textrow

    assert _textrow.RowFormat is not None


# Every print_literal style (bare numbers, booleans, bit strings, quoted) and a type that is
# not built in (named from the stream: the test sends no Type message).
TYPES = [20, 21, 23, 26, 700, 701, 1700, 16, 1560, 1562, 25, 1043, 3802, 1009, 17, 16500]

# The server's text never holds a NUL; anything else goes, quotes and invalid UTF-8 included
# (test_decoding writes a value's bytes as they are).
VALUES = st.one_of(
    st.binary(max_size=12).map(lambda b: b.replace(b"\0", b"")),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
            max_size=12).map(str.encode),
    st.sampled_from([b"'", b"''", b"t", b"f", b"true", b"%s", b"%%", b"101", b"NaN", b"-1.5"]))

OPTION_SETS: list[dict[str, str | None]] = [
    {}, {"skip-empty-xacts": "1"}, {"include-xids": "0", "skip-empty-xacts": "1"}]


@st.composite
def examples(draw: st.DrawFn) -> tuple[RelationMessage, list[Any]]:
    relation = draw(relations(TYPES))
    return relation, draw(changes(relation, lambda oid: VALUES))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples(), st.sampled_from(OPTION_SETS))
def test_fast_lines_equal_the_callbacks(example: tuple[RelationMessage, list[Any]],
                                        options: dict[str, str | None]) -> None:
    relation, body = example
    messages = transaction(relation, body) + transaction(relation, body, xid=742)[1:]
    fast = both(TestDecodingEmitter, messages, options)
    if fast.error is None:
        # Offered every change; it writes each but binary ones, and under skip-empty-xacts
        # each transaction's first (whose BEGIN the callback prints first).
        assert fast.used["fast"] + fast.used["declined"] == 2 * len(body)
        gated = 2 if options.get("skip-empty-xacts") else 0
        assert fast.used["fast"] >= 2 * sum(not binary(m) for m in body) - gated
        if not any(binary(m) for m in body):
            assert fast.used["declined"] == gated


@settings(max_examples=300, deadline=None)
@given(examples(), st.data())
def test_damaged_messages_are_left_to_the_decoder(example: tuple[RelationMessage, list[Any]],
                                                  data: st.DataObject) -> None:
    damaged_outcomes_agree(TestDecodingEmitter, *example, data, {})


def _row(*values: bytes | None) -> TupleData:
    return TupleData(bytes(ord("n") if v is None else ord("t") for v in values), values)


TABLE = RelationMessage(16401, "public", "t", "d", (RelationColumn(True, "id", 23, -1),
                                                    RelationColumn(False, "name", 25, -1)))
WIDER = RelationMessage(16401, "public", "t", "d", (*TABLE.columns,
                                                    RelationColumn(False, "ok", 16, -1)))


def test_a_relation_redescribed_mid_transaction_gets_a_new_formatter() -> None:
    *begun, commit = transaction(TABLE, [Insert(16401, _row(b"1", b"a'b"))])
    messages = [*begun, encode(WIDER), encode(Insert(16401, _row(b"2", None, b"t"))), commit]
    fast = both(TestDecodingEmitter, messages, {})
    assert fast.lines == [
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
    fast = both(TestDecodingEmitter, messages, {}, proto=3)
    assert fast.lines[-1] == "PREPARE TRANSACTION 'g1', txid 742"
    assert fast.used == {"fast": 1}


def test_a_binary_column_is_the_callbacks_error() -> None:
    messages = transaction(TABLE, [Insert(16401, TupleData(b"tb", (b"1", b"\0\1")))])
    fast = Run(TestDecodingEmitter, messages, True, {})
    assert fast.error == Run(TestDecodingEmitter, messages, False, {}).error
    assert fast.error is not None and "binary = false" in fast.error
    assert fast.used == {"declined": 1}


@pytest.mark.parametrize("bad", [
    dict(heads=(b"a", b"b"), styles=b"\0", opens=(b"x",), bares=(b"y",)),
    dict(heads=(b"a", b"b", b"c"), styles=b"\0\0", opens=(b"x",), bares=(b"y",)),
    dict(heads=(b"a", b"b", b"c"), styles=b"\7", opens=(b"x",), bares=(b"y",)),
    dict(heads=(b"a", b"b", b"c"), styles=b"\0", opens=("x",), bares=(b"y",)),
])
def test_the_formatter_checks_what_it_is_made_of(bad: dict[str, Any]) -> None:
    from emitters.text.native import _textrow

    with pytest.raises(ValueError):
        _textrow.RowFormat(1, bad["heads"], bad["styles"], bad["opens"], bad["bares"], False)
