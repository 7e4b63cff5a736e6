"""The json emitter's C fast path (emitters/json/native/_jsonrow.c) writes exactly the lines of
its Python change callback, or declines and leaves the change to it.

Each example runs one transaction through two pipelines (tests/support/native.py): the fast path on,
as ``pgdecode stream`` runs it, and off (every change through the Python callback, the
reference). Their outputs, or their errors, must be the same. Server-made values of every
type are compared the same way in test_emitter_json.py
(``test_fast_path_writes_the_callbacks_lines``).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.native import (
    SERVER,
    TYPES,
    VALUES,
    both,
    changes,
    damaged_outcomes_agree,
    decodes,
    relations,
    transaction,
)
from support.recorders import with_fast_path

from emitters.json import JsonEmitter
from emitters.json.fast import native_code
from plugin_framework import LSN
from plugin_framework.framework import CallbackError, MemoryOutput, Pipeline
from plugin_framework.pgtypes import NATIVE_KIND, TypeConverters
from plugin_framework.protocol import (
    Begin,
    Commit,
    Insert,
    RelationColumn,
    RelationMessage,
    TupleData,
    Update,
    encode,
)

# The C formatter against its Python reference: nothing to compare under PGDECODE_IMPL=python
pytestmark = pytest.mark.native


def test_the_fast_path_is_built() -> None:
    """`pip install` compiles it (gcc is on every machine here): without it, nothing below
    would test anything and `pgdecode stream` would be slow."""
    from emitters.json.native import _jsonrow

    assert _jsonrow.RowFormat is not None


# --- values: the server's text of each type, and text it never writes ------------------------


@st.composite
def examples(draw: st.DrawFn) -> tuple[RelationMessage, list[Any]]:
    relation = draw(relations(TYPES))
    return relation, draw(changes(relation, VALUES.__getitem__))


def declines(m: Any) -> bool:
    """Whether the fast path may leave this change to the callback: binary columns, and text
    that is not UTF-8 in a column it writes as a string."""
    for row in (getattr(m, "new", None), getattr(m, "key", None), getattr(m, "old", None)):
        if row is not None and (b"b" in row.kinds
                                or any(v is not None and not decodes(v) for v in row.values)):
            return True
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples(), st.sampled_from([{}, {"numeric-as": "number"}, {"bytea": "base64"}]))
def test_fast_lines_equal_the_callbacks(example: tuple[RelationMessage, list[Any]],
                                        options: dict[str, str | None]) -> None:
    relation, body = example
    fast = both(JsonEmitter, transaction(relation, body), options)
    # The fast path is offered every change, and writes every one it can.
    if fast.error is None:
        assert fast.used["fast"] + fast.used["declined"] == len(body)
        assert fast.used["fast"] >= sum(not declines(m) for m in body)


def _server_like(types: list[int]) -> st.SearchStrategy[TupleData]:
    """Rows as the server sends them: text columns, valid values, some nulls."""
    return st.tuples(*(st.one_of(st.none(), SERVER[t]) for t in types)).map(
        lambda vs: TupleData(bytes(ord("n") if v is None else ord("t") for v in vs), vs))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_server_like_rows_all_take_the_fast_path(data: st.DataObject) -> None:
    relation = data.draw(relations(TYPES))
    types = [c.type_oid for c in relation.columns]
    body = [Insert(relation.relation_id, data.draw(_server_like(types))) for _ in range(4)]
    fast = both(JsonEmitter, transaction(relation, body), {})
    assert fast.error is None
    assert fast.used == {"fast": 4}


@settings(max_examples=300, deadline=None)
@given(examples(), st.data())
def test_damaged_messages_are_left_to_the_decoder(example: tuple[RelationMessage, list[Any]],
                                                  data: st.DataObject) -> None:
    damaged_outcomes_agree(JsonEmitter, *example, data, {})


@pytest.mark.parametrize("raw", [
    b"{}", b"{{}}", b"{a,b}", b'{"a\\"b",NULL,"NULL"}', b"{{a,b},{c,d}}", b"{{a},b}",
    b"{a,{b}}", b"{ a }", b"[0:1]={a,b}", b'{""}', b"{a", b"{a}}", b"{a}x", b'{"a}',
    b"{" * 7 + b"a" + b"}" * 7,
])
def test_array_shapes(raw: bytes) -> None:
    relation = RelationMessage(16400, "public", "t", "d",
                               (RelationColumn(True, "a", 1009, -1),))
    row = TupleData(b"t", (raw,))
    both(JsonEmitter, transaction(relation, [Insert(16400, row), Insert(16400, row)]), {})


# --- each native code against the converter that declares it -----------------------------------

OPTION_SETS: list[dict[str, str | None]] = [{}, {"numeric-as": "number"}, {"bytea": "base64"}]


def _selected_by(conv: Any) -> list[tuple[int, dict[str, str | None]]]:
    """The (type, options) drawn here whose column converter is ``conv``."""
    return [(t, options) for options in OPTION_SETS for t in TYPES
            if TypeConverters(numeric_as=options.get("numeric-as") or "string",
                              bytea=options.get("bytea") or "hex").text(t) == conv]


def test_every_c_code_is_declared_by_one_converter() -> None:
    """The C module's codes and pgtypes' declarations name the same conversions: none is
    declared twice, none the C code has is left undeclared (then unused), none declared is
    missing from the C code."""
    from emitters.json.native import _jsonrow

    codes = {name for name in dir(_jsonrow)
             if name.isupper() and isinstance(getattr(_jsonrow, name), int)}
    declared = list(NATIVE_KIND.values())
    assert len(declared) == len(set(declared))
    assert set(declared) == codes - {"PYCALL"}
    for conv, name in NATIVE_KIND.items():
        assert native_code(conv) == getattr(_jsonrow, name)


@pytest.mark.parametrize("conv", list(NATIVE_KIND), ids=list(NATIVE_KIND.values()))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_native_code_writes_what_its_converter_does(conv: Any, data: st.DataObject) -> None:
    """Every converter that declares a native code, against the C code it declares, on the
    values the server writes for the types that use it and on text it never writes."""
    selected = _selected_by(conv)
    assert selected, f"no type drawn here converts by {NATIVE_KIND[conv]}: add one to SERVER"
    t, options = data.draw(st.sampled_from(selected))
    relation = RelationMessage(16400, "public", "t", "d", (RelationColumn(True, "v", t, -1),))
    values = data.draw(st.lists(VALUES[t], min_size=1, max_size=4))
    body = [Insert(16400, TupleData(b"t", (v,))) for v in values]
    fast = both(JsonEmitter, transaction(relation, body), options)
    if fast.error is None:
        assert fast.used["fast"] + fast.used["declined"] == len(body)


# What a JSON string escapes or checks, and what it keeps (a space, DEL), as the server's
# text of a text column: put_string scans eight bytes at a time, so each is tried at every
# place in and around two words, and run together.
_SPECIALS = [b'"', b"\\", b"\n", b"\x01", b"\x1f", b" ", b"\x7f", "é".encode(), "€".encode(),
             "😀".encode(), b"\xc3", b"\xff", b"\xed\xa0\x80", b"\xe0\x80\x80"]


@pytest.mark.parametrize("special", _SPECIALS, ids=repr)
def test_strings_are_written_alike_wherever_a_special_character_falls(special: bytes) -> None:
    relation = RelationMessage(16400, "public", "t", "d", (RelationColumn(True, "v", 25, -1),))
    values = [b"a" * i + special + b"b" * (24 - i) for i in range(25)]
    values += [special * 9, b"x" * 7 + special * 3 + b"y" * 9, special + b"\xc3\xa9" * 8]
    for value in values:  # one transaction each: text that is not UTF-8 fails its own
        fast = both(JsonEmitter, transaction(relation, [Insert(16400, TupleData(b"t", (value,)))]),
                    {})
        if decodes(value):
            assert fast.error is None and fast.used["fast"] == 1
        else:
            assert fast.error is not None


# --- where the pipeline uses a fast_change, and where not --------------------------------------

TABLE = RelationMessage(16401, "public", "items", "d", (RelationColumn(True, "id", 20, -1),
                                                        RelationColumn(False, "name", 25, -1)))
WIDER = RelationMessage(16401, "public", "items", "d", (*TABLE.columns,
                                                        RelationColumn(False, "n", 23, -1)))


def _row(*values: bytes | None) -> TupleData:
    return TupleData(bytes(ord("n") if v is None else ord("t") for v in values), values)


def _feed(pipeline: Pipeline, messages: list[Any]) -> None:
    lsn = 0x1000000
    for m in messages:
        lsn += 0x100
        pipeline.feed(m if isinstance(m, bytes) else encode(m), LSN(lsn))


WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _begin(xid: int = 741) -> Begin:
    return Begin(LSN(0x2000000 + xid), WHEN, xid)


def _commit() -> Commit:
    return Commit(LSN(0x2000000), LSN(0x2000100), WHEN)


def _json_pipeline(fast: bool, output: Any, *, extra: Any = None) -> tuple[Pipeline, Counter[str]]:
    pipeline = Pipeline(proto_version=1)
    used: Counter[str] = Counter()
    pipeline.add(with_fast_path(JsonEmitter(), used, fast), output=output)
    if extra is not None:
        pipeline.add(extra[0], output=extra[1])
    pipeline.startup()
    return pipeline, used


def _both(messages: list[Any]) -> tuple[list[str], Counter[str]]:
    """The fast pipeline's lines, checked against the reference's, and its counts."""
    outs = []
    used: Counter[str] = Counter()
    for fast in (True, False):
        out = MemoryOutput()
        pipeline, counts = _json_pipeline(fast, out)
        _feed(pipeline, messages)
        outs.append(out.lines)
        used += counts
    assert outs[0] == outs[1]
    return outs[0], used


def test_a_relation_redescribed_mid_transaction_gets_a_new_formatter() -> None:
    lines, used = _both([TABLE, _begin(), Insert(16401, _row(b"1", b"a")), WIDER,
                         Insert(16401, _row(b"2", b"b", b"7")), _commit()])
    assert [orjson.loads(x)["new"] for x in lines] == [{"id": 1, "name": "a"},
                                                        {"id": 2, "name": "b", "n": 7}]
    assert used == {"fast": 2}


def test_prepared_transactions_take_the_fast_path_with_their_fields() -> None:
    from plugin_framework.protocol import BeginPrepare, Prepare

    out = MemoryOutput()
    pipeline = Pipeline(proto_version=3)
    pipeline.add(JsonEmitter(), options={"two-phase": "on"}, output=out)
    pipeline.startup()
    assert pipeline.members[0].fast_change is not None
    messages = [TABLE, BeginPrepare(LSN(0x2000000), LSN(0x2000100), WHEN, 742, "g1"),
                Insert(16401, _row(b"1", b"a")), Prepare(LSN(0x2000000), LSN(0x2000100), WHEN,
                                                          742, "g1")]
    _feed(pipeline, messages)
    slow = MemoryOutput()
    reference = Pipeline(proto_version=3)
    reference.add(with_fast_path(JsonEmitter(), Counter(), fast=False),
                  options={"two-phase": "on"}, output=slow)
    reference.startup()
    _feed(reference, messages)
    assert out.lines == slow.lines
    assert orjson.loads(out.lines[0])["phase"] == "prepare"


def test_a_plugin_without_a_formatter_still_gets_its_change_callback() -> None:
    from emitters.text import TestDecodingEmitter

    messages = [TABLE, _begin(), Insert(16401, _row(b"1", b"a")),
                Insert(16401, _row(b"2", None)), _commit()]
    json_out, text_out, text_alone = MemoryOutput(), MemoryOutput(), MemoryOutput()
    text = with_fast_path(TestDecodingEmitter(), Counter(), fast=False)  # no formatter
    pipeline, used = _json_pipeline(True, json_out, extra=(text, text_out))
    _feed(pipeline, messages)
    alone = Pipeline(proto_version=1)
    alone.add(TestDecodingEmitter(), output=text_alone)
    alone.startup()
    _feed(alone, messages)
    assert text_out.lines == text_alone.lines
    assert len(text_out.lines) == 4  # BEGIN, two INSERTs, COMMIT
    assert used == {"fast": 2}
    assert json_out.lines == _both(messages)[0]


def test_under_a_change_filter_only_unaltered_changes_take_the_fast_path() -> None:
    """Row filters and column lists decide on the decoded change; one the filter passes
    unaltered (the very object it was given) is formatted from its raw message, one it
    alters (a column list, an UPDATE published as an INSERT) goes to the callback."""
    from dataclasses import replace

    from plugin_framework.framework import Action

    def only_some(change: Any) -> Any:
        ident = change.new.text("id")
        if ident == "2":
            return None
        if ident == "3":
            return replace(change, action=Action.INSERT, old=None, old_is_key=False)
        return change

    messages = [TABLE, _begin(), Insert(16401, _row(b"1", b"a")),
                Insert(16401, _row(b"2", b"b")),
                Update(16401, _row(b"3", b"c"), key=_row(b"3", None)),
                Insert(16401, _row(b"4", b"d")), _commit()]
    outs = []
    for fast in (True, False):
        out = MemoryOutput()
        pipeline, used = _json_pipeline(fast, out)
        pipeline.change_filter = only_some
        _feed(pipeline, messages)
        outs.append(out.lines)
        if fast:
            assert used == {"fast": 2}
    assert outs[0] == outs[1]
    assert [(orjson.loads(x)["op"], orjson.loads(x)["new"]["id"]) for x in outs[0]] == [
        ("insert", 1), ("insert", 3), ("insert", 4)]


def test_a_cut_short_transaction_is_taken_back_from_the_file(tmp_path: Any) -> None:
    """Lines written by the fast path are taken back by reset() like any other."""
    from plugin_framework import FileOutput

    path = tmp_path / "out.jsonl"
    output = FileOutput(path)
    pipeline, used = _json_pipeline(True, output)
    _feed(pipeline, [TABLE, _begin(), Insert(16401, _row(b"1", b"a")),
                     Insert(16401, _row(b"2", b"b"))])
    pipeline.reset()  # the connection was lost: the server sends the transaction again
    _feed(pipeline, [TABLE, _begin(), Insert(16401, _row(b"1", b"a")),
                     Insert(16401, _row(b"2", b"b")), _commit()])
    pipeline.shutdown()
    assert [orjson.loads(x)["new"]["id"] for x in path.read_text().splitlines()] == [1, 2]
    assert used == {"fast": 4}


class _Declining(JsonEmitter):
    """A third-party fast_change: declines odd ids, writes bad UTF-8 for id 13."""

    def fast_change(self, ctx: Any, relation: Any) -> Any:
        def write(data: bytes, lsn: LSN, txn: Any) -> bytes | None:
            if b"13" in data:
                return b"\xff"
            return None if data[-1:] in b"13579" else b"fast"

        return write


def test_formatters_may_decline_and_are_held_to_textual_output() -> None:
    out = MemoryOutput()
    pipeline = Pipeline(proto_version=1)
    pipeline.add(_Declining(), output=out)
    pipeline.startup()
    ids = RelationMessage(16402, "public", "ids", "d", (RelationColumn(True, "id", 20, -1),))
    _feed(pipeline, [ids, _begin(), Insert(16402, TupleData(b"t", (b"2",))),
                     Insert(16402, TupleData(b"t", (b"3",))), _commit()])
    assert out.lines[0] == "fast" and orjson.loads(out.lines[1])["new"] == {"id": 3}
    with pytest.raises(CallbackError, match=r"in the change callback.*invalid UTF-8"):
        _feed(pipeline, [_begin(742), Insert(16402, TupleData(b"t", (b"13",)))])


FORMATTERS = {
    "json": ("json.native._jsonrow", ((1, (b"",) * 6, (b'"a"',), b"\0", (bytes,), (), bytes), {})),
    "text": ("text.native._textrow", ((1, (b"a", b"b", b"c"), b"\0", (b"x",), (b"y",), False), {})),
    "wal2json": ("wal2json.native._wal2jsonrow",
                 ((1, (b"a", b"b", b"c"), b"", (b"x",), (b"y",), (b"z",), b"\0", (0,), (), 7,
                   False, False, True), {})),
}


@pytest.mark.parametrize("name", list(FORMATTERS))
def test_formatters_are_initialised_once(name: str) -> None:
    """line() sizes its column arrays before it calls into Python: a second __init__ (or a
    line() before any) must be refused, not read out of bounds."""
    import importlib

    module_name, (args, kwargs) = FORMATTERS[name]
    module = importlib.import_module(f"emitters.{module_name}")
    bare = module.RowFormat.__new__(module.RowFormat)
    with pytest.raises(TypeError, match="not called"):
        bare.line(b"I\0\0\0\1N\0\0", 0, None)
    made = module.RowFormat(*args, **kwargs)
    with pytest.raises(TypeError, match="runs once"):
        made.__init__(*args, **kwargs)
