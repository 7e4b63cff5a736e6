"""The wal2json emitter's C fast path (emitters/_wal2jsonrow.c, format version 2) writes exactly
the objects of its Python change callback, or declines and leaves the change to it.

Each example runs transactions through two pipelines with the wal2json emitter: one as
``pgdecode stream`` runs it (the fast path on), one without its ``fast_change`` callback
(every change through the Python callback, the reference). Their outputs, or their errors,
must be the same. test_emitter_wal2json.py diffs both against wal2json 2.5 itself
(``test_fast_path_on_and_off_match_wal2json``).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorders import with_fast_path

from emitters.wal2json import Wal2JsonEmitter
from plugin_framework import LSN
from plugin_framework.framework import CallbackError, MemoryOutput, Pipeline
from plugin_framework.protocol import (
    Begin,
    Commit,
    Delete,
    Insert,
    RelationColumn,
    RelationMessage,
    TupleData,
    Update,
    encode,
)


def test_the_fast_path_is_built() -> None:
    from emitters import _wal2jsonrow

    assert _wal2jsonrow.RowFormat is not None


# Every converter (numbers, booleans, bytea, strings) and a type that is not built in.
TYPES = [20, 21, 23, 26, 700, 701, 1700, 16, 17, 25, 1043, 3802, 1009, 1184, 16500]

_values = st.one_of(
    st.binary(max_size=12),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12).map(str.encode),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"infinity", b"t", b"f", b"\\x",
                     b"\\x00ff", b"x", b"", b'"', b"\\", b"\x7f", b"\xe2\x80\xa8", b"-1.5e3"]))

_names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                 min_size=1, max_size=8)


@st.composite
def relations(draw: st.DrawFn) -> RelationMessage:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=7))
    names = draw(st.lists(_names, min_size=len(types), max_size=len(types), unique=True))
    identity = draw(st.sampled_from("dfin"))
    keys = draw(st.lists(st.booleans(), min_size=len(types), max_size=len(types)))
    if identity == "f":
        keys = [True] * len(types)  # pgoutput flags every column of a FULL identity
    elif identity == "n":
        keys = [False] * len(types)
    columns = tuple(RelationColumn(k, n, t, -1) for k, n, t in zip(keys, names, types,
                                                                     strict=True))
    return RelationMessage(16400, draw(_names), draw(_names), identity, columns)


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


_flags = ["include-xids", "include-timestamp", "include-lsn", "include-pk", "include-types",
          "include-type-oids", "include-schemas", "include-transaction",
          "numeric-data-types-as-string"]
options = st.builds(
    lambda on, actions: {"format-version": "2", **{f: "1" if f in on else "0" for f in _flags},
                         **({} if actions is None else {"actions": actions})},
    st.sets(st.sampled_from(_flags)),
    st.sampled_from([None, None, None, "insert,delete", "update"]))

WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class Run:
    """The emitter's objects for some messages, or its error; how many changes its fast
    path wrote and how many it left to the callback."""

    def __init__(self, messages: list[bytes], fast: bool, opts: dict[str, str]) -> None:
        self.used: Counter[str] = Counter()
        pipeline = Pipeline(proto_version=1)
        out = MemoryOutput()
        pipeline.add(with_fast_path(Wal2JsonEmitter(), self.used, fast), options=dict(opts),
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


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes(), options)
def test_fast_objects_equal_the_callbacks(example: tuple[RelationMessage, list[Any]],
                                          opts: dict[str, str]) -> None:
    relation, body = example
    messages = transaction(relation, body) + transaction(relation, body, xid=742)[1:]
    fast = Run(messages, True, opts)
    reference = Run(messages, False, opts)
    assert fast.error == reference.error
    assert fast.lines == reference.lines
    assert not reference.used
    if reference.error is None:
        # no formatter: output held for the commit's LSN, or a table whose plan needs a
        # catalog (its error is the callback's, for a change it prints)
        held = opts["include-lsn"] == "1" and opts["include-transaction"] == "1"
        no_plan = opts["include-pk"] == "1" and relation.replica_identity != "d"
        if held or no_plan:
            assert not fast.used
        else:
            assert fast.used["fast"] + fast.used["declined"] == 2 * len(body)


def test_rows_the_server_sends_all_take_the_fast_path() -> None:
    relation = RelationMessage(16401, "public", "t", "d", (
        RelationColumn(True, "id", 23, -1), RelationColumn(False, "n", 1700, -1),
        RelationColumn(False, "b", 17, -1), RelationColumn(False, "ok", 16, -1),
        RelationColumn(False, "s", 25, -1)))
    body = [Insert(16401, TupleData(b"ttttt", (b"1", b"NaN", b"\\x00", b"t", b'a"\n\xc3\xa9'))),
            Update(16401, TupleData(b"ttntu", (b"1", b"2.50", None, b"f", None))),
            Delete(16401, key=TupleData(b"tnnnn", (b"1", None, None, None, None)))]
    opts = {"format-version": "2", "include-pk": "1", "include-xids": "1"}
    fast = Run(transaction(relation, body), True, opts)
    reference = Run(transaction(relation, body), False, opts)
    assert fast.lines == reference.lines
    assert fast.used == {"fast": 3}
    assert fast.lines[1] == (
        '{"action":"I","xid":741,"schema":"public","table":"t","columns":['
        '{"name":"id","type":"integer","value":1},{"name":"n","type":"numeric","value":null},'
        '{"name":"b","type":"bytea","value":"00"},{"name":"ok","type":"boolean","value":true},'
        '{"name":"s","type":"text","value":"a\\"\\n\u00e9"}],'
        '"pk":[{"name":"id","type":"integer"}]}')


@settings(max_examples=300, deadline=None)
@given(changes(), st.data())
def test_damaged_messages_are_left_to_the_decoder(example: tuple[RelationMessage, list[Any]],
                                                  data: st.DataObject) -> None:
    relation, body = example
    messages = transaction(relation, body * 2)
    index = data.draw(st.integers(3, len(messages) - 2))
    raw = bytearray(messages[index])
    cut = data.draw(st.integers(5, max(5, len(raw))))
    messages[index] = bytes(raw[:cut]) + data.draw(st.binary(max_size=6))
    outcomes = []
    for fast in (True, False):
        try:
            run = Run(messages, fast, {"format-version": "2"})
            outcomes.append((run.error, run.lines))
        except Exception as exc:  # the decoder's ProtocolError, or the pipeline's
            outcomes.append((f"{type(exc).__name__}: {exc}", None))
    assert outcomes[0] == outcomes[1]


def test_format_version_1_has_no_formatter() -> None:
    """v1 builds one document per transaction: its changes always go through the callback."""
    relation = RelationMessage(16401, "public", "t", "d", (RelationColumn(True, "id", 23, -1),))
    messages = transaction(relation, [Insert(16401, TupleData(b"t", (b"1",)))])
    fast = Run(messages, True, {"format-version": "1"})
    assert fast.lines == Run(messages, False, {"format-version": "1"}).lines
    assert not fast.used


@pytest.mark.parametrize("bad", [
    dict(heads=(b"a", b"b")),
    dict(codes=b"\x09"),
    dict(key=(3,)),
    dict(pks=("x",)),
])
def test_the_formatter_checks_what_it_is_made_of(bad: dict[str, Any]) -> None:
    from emitters import _wal2jsonrow

    args: dict[str, Any] = dict(relid=1, heads=(b"a", b"b", b"c"), schema_table=b"",
                                befores=(b"x",), afters=(b"y",), pks=(b"z",), codes=b"\0",
                                key=(0,), pk=(), actions=7, with_lsn=False, with_pk=False,
                                has_identity=True)
    with pytest.raises(ValueError):
        _wal2jsonrow.RowFormat(**(args | bad))
