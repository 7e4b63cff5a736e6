"""Row filters decided on raw row changes (plugin_framework/rowfilter/native/_rawfilter.c,
compiled by rowfilter/raw.py) agree with ``PublicationFilters.filter_change``, the reference:
a PASS verdict is a change it returns unaltered, DROP one it drops; UNSURE leaves it to it.

Random filters over the expressions C evaluates (integers of every width with overflow and
division by zero, booleans, text equality, NULLs, AND/OR/NOT, the boolean tests) on random
rows, as INSERT, UPDATE (unchanged TOAST values included) and DELETE messages, analyzed
against a real server's catalog; rows hold values the server writes and some it never does.
test_rowfilter_cli.py runs the whole path (``pgdecode stream --row-filter``) against the
server's own filtered publication.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import sql_bool_combinations

from plugin_framework.framework.model import Action, Relation, Row, new_change
from plugin_framework.framework.reorder.txn import RAW_DROP, RAW_PASS, RAW_UNSURE
from plugin_framework.protocol import (
    LSN,
    Delete,
    Insert,
    RelationColumn,
    RelationMessage,
    TupleData,
    Update,
    encode,
)
from plugin_framework.rowfilter import PublicationFilters, RowFilterError
from plugin_framework.rowfilter.raw import RAW_FILTER_BUILT

TABLE = ("CREATE TABLE rf (id int PRIMARY KEY, a int, b bigint, s smallint, flag bool, t text,"
         " v varchar(6)); ALTER TABLE rf REPLICA IDENTITY FULL")
COLUMNS = [("id", 23), ("a", 23), ("b", 20), ("s", 21), ("flag", 16), ("t", 25), ("v", 1043)]


@pytest.mark.native
def test_the_raw_filter_is_built() -> None:
    from plugin_framework.rowfilter.native import _rawfilter

    assert RAW_FILTER_BUILT
    # the framework's names for the verdicts are the C module's
    assert (_rawfilter.DROP, _rawfilter.PASS, _rawfilter.UNSURE) == (RAW_DROP, RAW_PASS,
                                                                      RAW_UNSURE)


# --- filters -------------------------------------------------------------------------------------

int_leaf = st.sampled_from(["id", "a", "b", "s", "0", "1", "-3", "7", "2147483647",
                            "(-2147483648)", "5000000000", "32767", "NULL::int", "(-1)"])
text_leaf = st.sampled_from(["t", "v", "'NSW'", "''", "'É'", "'ab'", "NULL::text", "'a  '"])


def int_exprs() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(
                lambda x: f"({x[0]} {x[1]} {x[2]})"),
            st.tuples(inner, st.sampled_from(["int2", "int4", "int8"])).map(
                lambda x: f"({x[0]})::{x[1]}"))
    return st.recursive(int_leaf, extend, max_leaves=3)


CMP = st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "IS DISTINCT FROM",
                       "IS NOT DISTINCT FROM"])


def bool_exprs() -> st.SearchStrategy[str]:
    ints = int_exprs()
    leaf = st.one_of(
        st.tuples(ints, CMP, ints).map(lambda x: f"({x[0]} {x[1]} {x[2]})"),
        st.tuples(text_leaf, st.sampled_from(["=", "<>", "IS DISTINCT FROM",
                                              "IS NOT DISTINCT FROM"]), text_leaf).map(
            lambda x: f"({x[0]} {x[1]} {x[2]})"),
        st.tuples(st.one_of(ints, text_leaf), st.sampled_from(["IS NULL", "IS NOT NULL"])).map(
            lambda x: f"({x[0]} {x[1]})"),
        st.sampled_from(["flag", "(NOT flag)", "(flag = true)", "(flag <> false)", "true",
                         "NULL::bool", "(flag IS DISTINCT FROM true)", "(flag < true)"]),
    )

    return st.recursive(leaf, sql_bool_combinations, max_leaves=4)


# --- rows: the server's texts, and some it never writes ------------------------------------------

def _ints(extremes: list[int]) -> st.SearchStrategy[bytes | None]:
    # mostly the constants' values, so that comparisons meet their boundaries
    return st.one_of(st.none(), st.sampled_from([b"-3", b"0", b"1", b"7", b"2", b"-1"]),
                     st.sampled_from([str(i).encode() for i in extremes]),
                     st.sampled_from([b"+5", b" 5", b"05", b"-0", b"x", b"",
                                      b"99999999999999999999"]))


VALUES: dict[str, st.SearchStrategy[bytes | None]] = {
    "id": _ints([2147483647, -2147483648]),
    "a": _ints([2147483647, -2147483648, 1000000]),
    "b": _ints([9223372036854775807, -9223372036854775808, 4294967296]),
    "s": _ints([32767, -32768]),
    "flag": st.sampled_from([None, b"t", b"f", b"x"]),
    "t": st.one_of(st.none(), st.sampled_from(
        [b"NSW", b"", b"\xc3\x89", b"ab", b"a  ", b"nsw", b"\xff", b"\xed\xa0\x80"])),
    "v": st.one_of(st.none(), st.sampled_from([b"NSW", b"ab", b"", b"a  "])),
}


@st.composite
def tuples(draw: st.DrawFn, toast: bool = False) -> TupleData:
    kinds, values = bytearray(), []
    for name, _ in COLUMNS:
        value = draw(VALUES[name])
        if toast and name == "t" and draw(st.booleans()):
            kinds += b"u"
            values.append(None)
        else:
            kinds += b"n" if value is None else b"t"
            values.append(value)
    return TupleData(bytes(kinds), tuple(values))


@pytest.fixture(scope="module")
def relation(pg_module_db: Any) -> Iterator[tuple[Any, Relation]]:
    pg_module_db.execute(TABLE)
    with pg_module_db.connect() as conn:
        relid = conn.execute("SELECT 'rf'::regclass::oid").fetchone()[0]
    message = RelationMessage(relid, "public", "rf", "f", tuple(
        RelationColumn(True, name, oid, -1) for name, oid in COLUMNS))
    yield pg_module_db, Relation.from_message(message, {})


def outcome(filters: PublicationFilters, change: Any) -> str:
    try:
        out = filters.filter_change(change)
    except RowFilterError:
        return "error"
    return "drop" if out is None else "pass" if out is change else "altered"


SETTINGS = settings(max_examples=int(os.environ.get("PGDECODE_ROWFILTER_EXAMPLES", "150")),
                    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                          HealthCheck.too_slow])
SEEN: Counter[str] = Counter()


@SETTINGS
@given(expr=bool_exprs(), new=tuples(toast=True), old=tuples(toast=True),
       old_kind=st.sampled_from(["O", "K", None]))
def test_verdicts_are_filter_changes(relation: tuple[Any, Relation], expr: str,
                                     new: TupleData, old: TupleData,
                                     old_kind: str | None) -> None:
    """``old_kind``: the UPDATE's and DELETE's old tuple, whole ("O": REPLICA IDENTITY FULL,
    as the server sends for this table), the key's ("K") or, for an UPDATE, none."""
    db, rel = relation
    try:
        filters = PublicationFilters.from_spec(db.conninfo, {"public.rf": expr})
    except RowFilterError:
        return  # refused, or not supported: no filter at all
    with filters:
        try:
            raw = filters.raw_filter_for(rel)
        except RowFilterError:  # an error in a constant part: raised at the first change
            return
        if raw is None:
            SEEN["no program"] += 1
            return
        insert_new = TupleData(new.kinds.replace(b"u", b"n"), new.values)
        key = old_kind == "K"
        before = {"O": {"old": old}, "K": {"key": old}, None: {}}[old_kind]
        update_old = None if old_kind is None else Row(rel, old)
        messages = [
            (Insert(rel.relation_id, insert_new),
             new_change(Action.INSERT, rel, Row(rel, insert_new), None, False, LSN(1), None)),
            (Update(rel.relation_id, new, **before),
             new_change(Action.UPDATE, rel, Row(rel, new), update_old, key, LSN(1), None)),
            (Delete(rel.relation_id, **(before or {"old": old})),
             new_change(Action.DELETE, rel, None, Row(rel, old), key, LSN(1), None)),
        ]
        for message, change in messages:
            verdict = raw.verdict(encode(message))
            expected = outcome(filters, change)
            SEEN[f"{verdict}:{expected}"] += 1
            if verdict == RAW_PASS:
                assert expected == "pass", (expr, message)
            elif verdict == RAW_DROP:
                assert expected == "drop", (expr, message)
            else:
                assert verdict == RAW_UNSURE


@SETTINGS
@given(expr=bool_exprs(), new=tuples(), publish=st.sampled_from([["update"], ["insert"]]))
def test_snapshot_verdicts_are_the_snapshot_filter_s(relation: tuple[Any, Relation], expr: str,
                                                    new: TupleData, publish: list[str]) -> None:
    """A snapshot's row (an Insert message) through ``raw_snapshot_filter_for``: the decision
    of ``filter_snapshot_row`` wherever C gives one, under the row filter whatever the
    publication publishes (a table sync copies the rows of one that publishes no INSERT)."""
    db, rel = relation
    try:
        filters = PublicationFilters.from_spec(db.conninfo, {"public.rf": expr},
                                               publish=publish)
    except RowFilterError:
        return
    with filters:
        try:
            raw = filters.raw_snapshot_filter_for(rel)
        except RowFilterError:
            return
        if raw is None:
            return
        change = new_change(Action.INSERT, rel, Row(rel, new), None, False, LSN(1), None)
        try:
            out = filters.filter_snapshot_row(change)
        except RowFilterError:
            return
        expected = "drop" if out is None else "pass" if out is change else "altered"
        if publish == ["update"]:  # as a change, an INSERT is not published
            assert filters.filter_change(change) is None
        verdict = raw.verdict(encode(Insert(rel.relation_id, new)))
        SEEN[f"copy {verdict}:{expected}"] += 1
        if verdict == RAW_PASS:
            assert expected == "pass", (expr, new)
        elif verdict == RAW_DROP:
            assert expected == "drop", (expr, new)
        else:
            assert verdict == RAW_UNSURE


def _row(**values: bytes | None) -> TupleData:
    texts = [values.get(name) for name, _ in COLUMNS]
    return TupleData(b"".join(b"n" if v is None else b"t" for v in texts), tuple(texts))


def _agree(db: Any, rel: Relation, expr: str, rows: list[TupleData]) -> Counter[int]:
    """Every row as an INSERT through the raw filter and filter_change: the same decision
    wherever C gives one; returns the verdicts."""
    verdicts: Counter[int] = Counter()
    with PublicationFilters.from_spec(db.conninfo, {"public.rf": expr}) as filters:
        raw = filters.raw_filter_for(rel)
        assert raw is not None, expr
        for row in rows:
            verdict = raw.verdict(encode(Insert(rel.relation_id, row)))
            change = new_change(Action.INSERT, rel, Row(rel, row), None, False, LSN(1), None)
            expected = outcome(filters, change)
            verdicts[verdict] += 1
            assert verdict == RAW_UNSURE or expected == ("pass" if verdict == RAW_PASS
                                                          else "drop"), (expr, row)
    return verdicts


INTS = [None, b"-1", b"0", b"1", b"2147483647", b"-2147483648", b"9223372036854775807"]


@pytest.mark.native  # raw verdicts are the C raw filter's
def test_operators_on_their_boundaries(relation: tuple[Any, Relation]) -> None:
    """Every operator over every pair of boundary values (and NULL), at every width: the
    cases a random search rarely meets."""
    db, rel = relation
    pairs = [_row(a=x, b=y, s=x if x is None or len(x) < 3 else b"5") for x in INTS
             for y in INTS]
    for op in ("=", "<>", "<", "<=", ">", ">=", "IS DISTINCT FROM", "IS NOT DISTINCT FROM"):
        for left, right in (("a", "b"), ("s", "a"), ("b", "s")):
            verdicts = _agree(db, rel, f"{left} {op} {right}", pairs)
            assert verdicts[RAW_UNSURE] == 0 and verdicts[RAW_PASS] and verdicts[RAW_DROP]
    for op in ("+", "-", "*", "/", "%"):
        for left, right in (("a", "b"), ("a", "s"), ("b", "a"), ("s", "b")):
            verdicts = _agree(db, rel, f"{left} {op} {right} > 0", pairs)
            assert verdicts[RAW_PASS] and verdicts[RAW_DROP]  # overflow: UNSURE
    texts = [None, b"", b"NSW", b"nsw", b"NSW ", b"\xc3\x89"]
    text_rows = [_row(t=x, v=y) for x in texts for y in texts]
    for op in ("=", "<>", "IS DISTINCT FROM", "IS NOT DISTINCT FROM"):
        verdicts = _agree(db, rel, f"t {op} v", text_rows)
        assert verdicts[RAW_UNSURE] == 0 and verdicts[RAW_PASS] and verdicts[RAW_DROP]
    logic = [_row(flag=f, a=a) for f in (None, b"t", b"f") for a in (None, b"0", b"1")]
    for expr in ("flag AND a > 0", "flag OR a > 0", "NOT flag", "(flag AND a > 0) IS NOT TRUE",
                 "(flag OR a > 0) IS FALSE", "(a > 0) IS UNKNOWN", "flag IS NOT FALSE",
                 "flag = (a > 0)", "flag IS NULL OR a IS NOT NULL", "flag < (a > 0)"):
        verdicts = _agree(db, rel, expr, logic)
        assert verdicts[RAW_UNSURE] == 0 and verdicts[RAW_PASS] and verdicts[RAW_DROP]


@pytest.mark.native  # raw verdicts are the C raw filter's
def test_common_filters_are_decided_in_c(relation: tuple[Any, Relation]) -> None:
    """The filters people write compile to programs, and ordinary rows get a verdict without
    Python (this also shows the random test above is not vacuous)."""
    db, rel = relation
    row = TupleData(b"tttttnt", (b"12", b"7", b"5000000000", b"-2", b"t", None, b"NSW"))
    cases = {"id % 10 <> 0": RAW_PASS, "v = 'NSW' AND id > 2": RAW_PASS,
             "flag IS NOT TRUE OR a IS NULL": RAW_DROP, "b / a > 1000": RAW_PASS,
             "t IS NOT DISTINCT FROM NULL AND NOT flag": RAW_DROP, "s::int8 * 2 = -4": RAW_PASS,
             "v <> 'NSW'": RAW_DROP}
    for expr, verdict in cases.items():
        with PublicationFilters.from_spec(db.conninfo, {"public.rf": expr}) as filters:
            raw = filters.raw_filter_for(rel)
            assert raw is not None, expr
            message = Insert(rel.relation_id, row)
            assert raw.verdict(encode(message)) == verdict, expr
            change = new_change(Action.INSERT, rel, Row(rel, row), None, False, LSN(1), None)
            assert outcome(filters, change) == ("pass" if verdict == RAW_PASS else "drop")
    # outside C's expressions: no program, the Python filter decides
    for expr in ("t < 'b'", "length(t) > 2", "a::numeric > 1.5"):
        with PublicationFilters.from_spec(db.conninfo, {"public.rf": expr}) as filters:
            assert filters.raw_filter_for(rel) is None, expr
    # a column list (insert only: a FULL identity allows none otherwise): the change is
    # altered, never passed as it is
    with PublicationFilters.from_spec(db.conninfo, {"public.rf": "id > 0"},
                                      {"public.rf": ["id", "a"]},
                                      publish=("insert",)) as filters:
        assert filters.raw_filter_for(rel) is None


def test_a_filter_too_long_for_c_is_evaluated_in_python(relation: tuple[Any, Relation]
                                                        ) -> None:
    """A filter of more nodes than C takes has no program; it filters as before."""
    db, rel = relation
    expr = " OR ".join(f"a = {i}" for i in range(1, 1101))
    with PublicationFilters.from_spec(db.conninfo, {"public.rf": expr}) as filters:
        assert filters.raw_filter_for(rel) is None
        row = _row(id=b"1", a=b"1100")
        change = new_change(Action.INSERT, rel, Row(rel, row), None, False, LSN(1), None)
        assert outcome(filters, change) == "pass"


@pytest.mark.native  # raw verdicts are the C raw filter's
def test_an_unpublished_table_is_dropped_raw(relation: tuple[Any, Relation]) -> None:
    db, rel = relation
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION only_other FOR TABLE other")
    with PublicationFilters.from_publication(db.conninfo, "only_other") as filters:
        raw = filters.raw_filter_for(rel)
        row = TupleData(b"tnnnnnn", (b"1", None, None, None, None, None, None))
        change = new_change(Action.INSERT, rel, Row(rel, row), None, False, LSN(1), None)
        assert outcome(filters, change) == "drop"
        assert raw is not None and raw.verdict(encode(Insert(rel.relation_id, row))) == RAW_DROP


def counting(raw_filter_for: Any, used: Counter[str]) -> Any:
    """A raw change filter that counts its verdicts in ``used``."""
    class Counted:
        def __init__(self, raw: Any) -> None:
            self.raw = raw

        def verdict(self, data: bytes) -> int:
            used["verdicts"] += 1
            return int(self.raw.verdict(data))

    def make(relation: Relation) -> Any:
        raw = raw_filter_for(relation)
        return None if raw is None else Counted(raw)
    return make


def streamed(relation: RelationMessage, body: list[Any]) -> list[bytes]:
    """``body`` as a transaction the server streamed (in two blocks), for a plugin without
    stream callbacks: replayed from the spool at Stream Commit."""
    from dataclasses import replace as with_xid

    from plugin_framework.protocol import StreamCommit, StreamStart, StreamStop

    xid = 900
    changes = [encode(with_xid(m, xid=xid)) for m in body]
    half = len(changes) // 2
    when = datetime(2024, 5, 1, tzinfo=UTC)
    return [encode(StreamStart(xid, True)), encode(with_xid(relation, xid=xid)),
            *changes[:half], encode(StreamStop()), encode(StreamStart(xid, False)),
            *changes[half:], encode(StreamStop()),
            encode(StreamCommit(xid, LSN(0x3000F00), LSN(0x3001000), when))]


@pytest.mark.native  # raw verdicts are the C raw filter's
@pytest.mark.parametrize("shape", ["ordinary", "streamed"])
def test_a_pipeline_delivers_the_same_with_and_without_raw_verdicts(
        relation: tuple[Any, Relation], shape: str) -> None:
    """Through a pipeline (as ``pgdecode stream --row-filter`` wires it): the raw verdicts
    send passed changes straight to the emitters' formatters and drop the others undecoded;
    changes they are unsure of (an UPDATE entering the filter) are decoded and filtered. The
    output is the same as with the filter alone, for a transaction as it arrives and for one
    replayed from the spool."""
    from support.native import transaction
    from support.recorders import with_fast_path

    from emitters.json import JsonEmitter
    from emitters.text import TestDecodingEmitter
    from plugin_framework.framework import MemoryOutput, Pipeline

    db, rel = relation
    message = RelationMessage(rel.relation_id, "public", "rf", "f", tuple(
        RelationColumn(True, name, oid, -1) for name, oid in COLUMNS))
    rows = [_row(id=str(i).encode(), a=str(i % 3).encode(), t=b"x" * i, v=b"NSW")
            for i in range(1, 7)]
    toast = TupleData(b"tttnnun", (b"5", b"2", b"1", None, None, None, None))
    body = [*(Insert(rel.relation_id, r) for r in rows),
            Update(rel.relation_id, _row(id=b"3", a=b"2", v=b"NSW"), old=rows[2]),  # enters
            Update(rel.relation_id, toast, old=rows[4]),  # unchanged TOAST, the filter's not
            Delete(rel.relation_id, old=rows[2]), Delete(rel.relation_id, old=rows[1])]
    messages = transaction(message, body) if shape == "ordinary" else streamed(message, body)
    for plugin in (JsonEmitter, TestDecodingEmitter):
        outputs, counts = [], []
        for raw_verdicts in (True, False):
            used: Counter[str] = Counter()
            with PublicationFilters.from_spec(db.conninfo, {"public.rf": "a > 0"}) as filters:
                pipeline = Pipeline(proto_version=1 if shape == "ordinary" else 2)
                out = MemoryOutput()
                options = {"stream-changes": "0"} if plugin is TestDecodingEmitter else {}
                pipeline.add(with_fast_path(plugin(), used), output=out, options=options)
                pipeline.change_filter = filters.as_change_filter()
                if raw_verdicts:
                    pipeline.raw_change_filter = counting(filters.raw_filter_for, used)
                pipeline.startup()
                for i, data in enumerate(messages):
                    pipeline.feed(data, LSN(0x1000 + i))
            outputs.append(out.lines)
            counts.append(used)
        assert outputs[0] == outputs[1]
        # 4 inserts, the UPDATE that entered the filter as an INSERT, an UPDATE, a DELETE
        assert sum("rf" in line for line in outputs[0]) == 7
        # the same changes formatted in C either way (decided raw, or decoded and found
        # unaltered); the UPDATE published as an INSERT through the callback
        assert counts[0].pop("verdicts") == len(body)  # every change was judged raw
        # replayed, the changes passed raw go to the formatters in runs; decoded and found
        # unaltered, one at a time
        assert counts[0].pop("batched", 0) == (6 if shape == "streamed" else 0)
        assert "batched" not in counts[1]
        assert counts[0] == counts[1] and counts[0]["fast"] == 6


@pytest.mark.native  # raw verdicts are the C raw filter's
def test_snapshot_rows_take_raw_verdicts_in_order(relation: tuple[Any, Relation]) -> None:
    """A snapshot's chunk under a row filter (``Pipeline.snapshot_rows``, a run of inserts
    formatted a run at a time): rows passed raw, dropped raw and left to the filter
    (values the server never writes: C is unsure of them) come out in the order of the
    chunk, as with the filter alone, and as the change callback writes them."""
    from support.recorders import with_fast_path

    from emitters.json import JsonEmitter
    from plugin_framework.framework import MemoryOutput, Pipeline

    db, rel = relation
    message = RelationMessage(rel.relation_id, "public", "rf", "f", tuple(
        RelationColumn(True, name, oid, -1) for name, oid in COLUMNS))
    values = [b"1", b"0", b"+5", b"7", b" 2", b"-1", b"3", b"4", b"05", b"0"] * 3
    inserts = [encode(Insert(rel.relation_id, _row(id=str(i).encode(), a=a, t=b"x")))
               for i, a in enumerate(values)]
    outputs, counts = [], []
    for raw_verdicts, fast in ((True, True), (False, True), (False, False)):
        used: Counter[str] = Counter()
        with PublicationFilters.from_spec(db.conninfo, {"public.rf": "a > 0"}) as filters:
            pipeline = Pipeline(proto_version=1)
            out = MemoryOutput()
            pipeline.add(with_fast_path(JsonEmitter(), used, fast), output=out)
            pipeline.change_filter = filters.as_change_filter()
            if raw_verdicts:
                pipeline.raw_change_filter = counting(filters.raw_filter_for, used)
            pipeline.startup()
            pipeline.snapshot_rows(message, [], inserts, LSN(0x1000),
                                   datetime(2024, 5, 1, tzinfo=UTC))
        outputs.append(out.lines)
        counts.append(used)
    assert outputs[0] == outputs[1] == outputs[2]
    # (the lines are not all JSON: the emitter writes an int's text as the server would)
    ids = [int(m.group(1)) for line in outputs[0] if (m := re.search(r'"id":(\d+)', line))]
    assert ids == [i for i, a in enumerate(values) if int(a) > 0]
    assert counts[0]["verdicts"] == len(inserts)
    # passed raw: a run at a time; unsure: decoded, found unaltered, formatted one by one
    assert counts[0]["fast"] == len(ids) and 0 < counts[0]["batched"] < len(ids)
