"""The wal2json emitter's C fast path (emitters/wal2json/native/_wal2jsonrow.c, format versions
1 and 2) writes exactly the objects of its Python change callback, or declines and leaves the
change to it.

Each example runs transactions through two pipelines (tests/support/native.py): the fast path on, as
``pgdecode stream`` runs it, and off (every change through the Python callback, the
reference). test_emitter_wal2json.py diffs both against wal2json 2.5 itself
(``test_fast_path_on_and_off_match_wal2json``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.native import both, changes, damaged_outcomes_agree, relations, transaction

from emitters.wal2json import Wal2JsonEmitter
from plugin_framework.protocol import (
    Delete,
    Insert,
    RelationColumn,
    RelationMessage,
    TupleData,
    Update,
)

# The C formatter against its Python reference: nothing to compare under PGDECODE_IMPL=python
pytestmark = pytest.mark.native


def test_the_fast_path_is_built() -> None:
    from emitters.wal2json.native import _wal2jsonrow

    assert _wal2jsonrow.RowFormat is not None
    assert _wal2jsonrow.V1RowFormat is not None


# Every converter (numbers, booleans, bytea, strings) and a type that is not built in.
TYPES = [20, 21, 23, 26, 700, 701, 1700, 16, 17, 25, 1043, 3802, 1009, 1184, 16500]

VALUES = st.one_of(
    st.binary(max_size=12),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12).map(str.encode),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"infinity", b"t", b"f", b"\\x",
                     b"\\x00ff", b"x", b"", b'"', b"\\", b"\x7f", b"\xe2\x80\xa8", b"-1.5e3"]))

_flags = ["include-xids", "include-timestamp", "include-lsn", "include-pk", "include-types",
          "include-type-oids", "include-schemas", "include-transaction",
          "numeric-data-types-as-string"]
options = st.builds(
    lambda on, actions: {"format-version": "2", **{f: "1" if f in on else "0" for f in _flags},
                         **({} if actions is None else {"actions": actions})},
    st.sets(st.sampled_from(_flags)),
    st.sampled_from([None, None, None, "insert,delete", "update"]))


@st.composite
def examples(draw: st.DrawFn) -> tuple[RelationMessage, list[Any]]:
    relation = draw(relations(TYPES, identities="dfin"))
    return relation, draw(changes(relation, lambda oid: VALUES))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples(), options)
def test_fast_objects_equal_the_callbacks(example: tuple[RelationMessage, list[Any]],
                                          opts: dict[str, str | None]) -> None:
    relation, body = example
    messages = transaction(relation, body) + transaction(relation, body, xid=742)[1:]
    fast = both(Wal2JsonEmitter, messages, opts)
    if fast.error is None:
        # no formatter: output held for the commit's LSN, or a table whose plan needs a
        # catalog (its error is the callback's, for a change it prints)
        held = opts["include-lsn"] == "1" and opts["include-transaction"] == "1"
        no_plan = opts["include-pk"] == "1" and relation.replica_identity != "d"
        offered = fast.used["fast"] + fast.used["declined"]
        if held or no_plan:
            assert not fast.used
        elif opts.get("actions") is not None:
            # Some actions left out: the callback plans the table at the first change it
            # prints, and the formatter takes the transactions after that one.
            kinds = {"insert": Insert, "update": Update, "delete": Delete}
            selected = tuple(kinds[a] for a in str(opts["actions"]).split(","))
            assert offered == (len(body) if any(isinstance(m, selected) for m in body) else 0)
        else:
            assert offered == 2 * len(body)


def test_rows_the_server_sends_all_take_the_fast_path() -> None:
    relation = RelationMessage(16401, "public", "t", "d", (
        RelationColumn(True, "id", 23, -1), RelationColumn(False, "n", 1700, -1),
        RelationColumn(False, "b", 17, -1), RelationColumn(False, "ok", 16, -1),
        RelationColumn(False, "s", 25, -1)))
    body = [Insert(16401, TupleData(b"ttttt", (b"1", b"NaN", b"\\x00", b"t", b'a"\n\xc3\xa9'))),
            Update(16401, TupleData(b"ttntu", (b"1", b"2.50", None, b"f", None))),
            Delete(16401, key=TupleData(b"tnnnn", (b"1", None, None, None, None)))]
    opts: dict[str, str | None] = {"format-version": "2", "include-pk": "1",
                                   "include-xids": "1"}
    fast = both(Wal2JsonEmitter, transaction(relation, body), opts)
    assert fast.used == {"fast": 3}
    assert fast.lines[1] == (
        '{"action":"I","xid":741,"schema":"public","table":"t","columns":['
        '{"name":"id","type":"integer","value":1},{"name":"n","type":"numeric","value":null},'
        '{"name":"b","type":"bytea","value":"00"},{"name":"ok","type":"boolean","value":true},'
        '{"name":"s","type":"text","value":"a\\"\\n\u00e9"}],'
        '"pk":[{"name":"id","type":"integer"}]}')


@settings(max_examples=300, deadline=None)
@given(examples(), st.data())
def test_damaged_messages_are_left_to_the_decoder(example: tuple[RelationMessage, list[Any]],
                                                  data: st.DataObject) -> None:
    damaged_outcomes_agree(Wal2JsonEmitter, *example, data, {"format-version": "2"})


# format version 1's options (but those that need a catalog: test_emitter_wal2json's)
_v1_flags = ["include-xids", "include-timestamp", "include-lsn", "include-pk", "include-types",
             "include-type-oids", "include-schemas", "include-typmod",
             "numeric-data-types-as-string", "pretty-print", "write-in-chunks"]
v1_options = st.builds(
    lambda on, actions: {"format-version": "1", **{f: "1" if f in on else "0" for f in _v1_flags},
                         **({} if actions is None else {"actions": actions})},
    st.sets(st.sampled_from(_v1_flags)),
    st.sampled_from([None, None, None, "insert,delete", "update"]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples(), v1_options)
def test_fast_v1_documents_equal_the_callbacks(example: tuple[RelationMessage, list[Any]],
                                               opts: dict[str, str | None]) -> None:
    """Format version 1: one document per transaction (or a write per change with
    write-in-chunks), each change's part made in C, the document's bookkeeping in Python."""
    relation, body = example
    messages = transaction(relation, body) + transaction(relation, body, xid=742)[1:]
    fast = both(Wal2JsonEmitter, messages, opts)
    if fast.error is None:
        offered = fast.used["fast"] + fast.used["declined"]
        if opts["include-lsn"] == "1" and opts["write-in-chunks"] == "1":
            assert not fast.used  # held for the commit's LSN: no formatter
        elif opts.get("actions") is None:
            assert offered == 2 * len(body)


def test_v1_rows_the_server_sends_all_take_the_fast_path() -> None:
    relation = RelationMessage(16401, "public", "t", "d", (
        RelationColumn(True, "id", 23, -1), RelationColumn(False, "n", 1700, -1),
        RelationColumn(False, "s", 25, -1)))
    body = [Insert(16401, TupleData(b"ttt", (b"1", b"NaN", b'a"\n\xc3\xa9'))),
            Update(16401, TupleData(b"ttn", (b"1", b"2.50", None))),
            Delete(16401, key=TupleData(b"tnn", (b"1", None, None)))]
    fast = both(Wal2JsonEmitter, transaction(relation, body), {"format-version": "1",
                                                                "include-xids": "0"})
    assert fast.used == {"fast": 3}  # and both() compared the lines with the callbacks'
    (document,) = (json.loads(line) for line in fast.lines)
    assert [(c["kind"], c.get("columnvalues"), c.get("oldkeys", {}).get("keyvalues"))
            for c in document["change"]] == [("insert", [1, None, 'a"\né'], None),
                                              ("update", [1, 2.5, None], [1]),
                                              ("delete", None, [1])]


@settings(max_examples=300, deadline=None)
@given(examples(), st.data())
def test_damaged_v1_messages_are_left_to_the_decoder(
        example: tuple[RelationMessage, list[Any]], data: st.DataObject) -> None:
    damaged_outcomes_agree(Wal2JsonEmitter, *example, data, {"format-version": "1"})


@pytest.mark.parametrize("bad", [
    dict(heads=(b"a", b"b")),
    dict(codes=b"\x09"),
    dict(key=(3,)),
    dict(pks=("x",)),
])
def test_the_formatter_checks_what_it_is_made_of(bad: dict[str, Any]) -> None:
    from emitters.wal2json.native import _wal2jsonrow

    args: dict[str, Any] = dict(relid=1, heads=(b"a", b"b", b"c"), schema_table=b"",
                                befores=(b"x",), afters=(b"y",), pks=(b"z",), codes=b"\0",
                                key=(0,), pk=(), actions=7, with_lsn=False, with_pk=False,
                                has_identity=True)
    with pytest.raises(ValueError):
        _wal2jsonrow.RowFormat(**(args | bad))


@pytest.mark.parametrize("bad", [
    dict(heads=(b"a", b"b")),
    dict(pieces=(b"",) * 11),
    dict(codes=b"\x09"),
    dict(key=(3,)),
    dict(names=("x",)),
])
def test_the_v1_formatter_checks_what_it_is_made_of(bad: dict[str, Any]) -> None:
    from emitters.wal2json.native import _wal2jsonrow

    args: dict[str, Any] = dict(relid=1, heads=(b"a", b"b", b"c"), pieces=(b"",) * 12,
                                names=(b"x",), types=(b"y",), oids=(b"z",), codes=b"\0",
                                key=(0,), actions=7, has_identity=True)
    _wal2jsonrow.V1RowFormat(**args)
    with pytest.raises(ValueError):
        _wal2jsonrow.V1RowFormat(**(args | bad))


def test_a_table_is_planned_only_for_a_change_that_is_printed(
        caplog: pytest.LogCaptureFixture) -> None:
    """With ``actions`` leaving some out, the formatter does not plan a table (catalog
    queries, warnings) that the callback would not plan: it waits for the callback to."""
    relation = RelationMessage(16401, "public", "t", "d", (
        RelationColumn(True, "id", 23, -1), RelationColumn(False, "u", 16500, -1)))
    deletes = [Delete(16401, key=TupleData(b"tn", (str(i).encode(), None))) for i in range(3)]
    opts: dict[str, str | None] = {"format-version": "2", "actions": "insert"}
    with caplog.at_level("WARNING", logger="pgdecode.wal2json"):
        fast = both(Wal2JsonEmitter, transaction(relation, deletes), opts)
    assert not caplog.records  # the "no catalog: the types ..." warning of a plan
    assert fast.lines == ['{"action":"B"}', '{"action":"C"}'] and not fast.used
    inserts = [Insert(16401, TupleData(b"tt", (b"1", b"x")))] * 2
    fast = both(Wal2JsonEmitter, transaction(relation, inserts) + transaction(
        relation, inserts, xid=742)[1:], opts)
    assert fast.used == {"fast": 2}  # the second transaction's, once the callback planned it
