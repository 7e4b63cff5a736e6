"""The Spark change builder's C fast path (plugin_framework/spark/changes/native/_changerows.c)
appends exactly what ``ChangeBuilder.add_change`` appends for the decoded change, or declines
and leaves the change to it.

Each example runs the same messages through the data source's collector (a plain output
plugin around a ChangeBuilder, no Spark needed) twice: with its ``fast_change`` formatter,
as the spark emitter and the data source run it, and without (every change through
``add_change``, the reference). The builders' column lists, their Arrow tables, or their
errors, must be the same. Hypothesis makes the values (the server's text of each type and
text it never writes, from test_json_native.py); the last test takes every type and value
the parity workload makes on a real server, streamed and two-phase transactions included.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.capture import peek, pgoutput_options
from support.native import SERVER, TYPES, VALUES, WHEN, changes, relations, transaction
from support.parity_workload import run_parity_workload, setup_parity
from support.recorders import with_fast_path

from plugin_framework import LSN
from plugin_framework.framework import CallbackError, Pipeline
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
from plugin_framework.spark.changes.builder import ChangeBuilder
from plugin_framework.spark.changes.plans import PlanCache
from plugin_framework.spark.datasource.peek import _Collector

pytestmark = pytest.mark.native

LISTS = ("lsn", "seq", "op", "rel", "txn", "key_len", "key_k", "key_v", "before_len",
         "before_k", "before_v", "after_len", "after_k", "after_v", "before_json",
         "after_json", "toast")


def test_the_fast_path_is_built() -> None:
    """`pip install` compiles it (gcc is on every machine here): without it, nothing below
    would test anything and the spark emitter would be slower."""
    from plugin_framework.spark.changes.native import _changerows

    assert _changerows.ChangeRows is not None


class Collected:
    """The builder after the messages, or the error; the formatter's counts."""

    def __init__(self, messages: list[tuple[bytes, LSN]], fast: bool, proto: int = 1) -> None:
        self.builder = ChangeBuilder(PlanCache())
        self.used: Counter[str] = Counter()
        pipeline = Pipeline(proto_version=proto)
        pipeline.add(with_fast_path(_Collector(self.builder, LSN(0), None, None), self.used,
                                    fast))
        pipeline.startup()
        self.error: str | None = None
        try:
            for data, lsn in messages:
                pipeline.feed(data, lsn)
        except CallbackError as exc:
            self.error = f"{type(exc.cause).__name__}: {exc.cause}"

    def lists(self) -> dict[str, list[Any]]:
        return {name: getattr(self.builder, name) for name in LISTS}


def both(messages: list[tuple[bytes, LSN]], proto: int = 1) -> Collected:
    """The run with the C appender, checked against the run without it (the reference)."""
    fast = Collected(messages, True, proto)
    reference = Collected(messages, False, proto)
    assert fast.error == reference.error
    assert not reference.used
    if fast.error is None:
        assert fast.lists() == reference.lists()
        assert fast.builder.nbytes == reference.builder.nbytes
        assert fast.builder.to_arrow().equals(reference.builder.to_arrow())
    return fast


def _at_lsns(messages: list[bytes]) -> list[tuple[bytes, LSN]]:
    return [(data, LSN(0x16B3748 + 0x100 * i)) for i, data in enumerate(messages, 1)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_appended_rows_equal_add_changes(data: st.DataObject) -> None:
    """Random relations and changes (keys, whole old rows, NULLs, unchanged TOAST, now and
    then a binary column, text the server never writes), in two transactions: the C appender
    and add_change fill the same builder in turns where the appender declines."""
    relation = data.draw(relations(TYPES))
    first = data.draw(changes(relation, VALUES.__getitem__))
    second = data.draw(changes(relation, VALUES.__getitem__))
    messages = transaction(relation, first) + transaction(relation, second, xid=742)[1:]
    fast = both(_at_lsns(messages))
    if fast.error is None:
        assert fast.used["fast"] + fast.used["declined"] == len(first) + len(second)


def _server_like(types: list[int]) -> st.SearchStrategy[TupleData]:
    """Rows as the server sends them: text columns, valid values, some NULLs and unchanged
    TOAST values."""
    return st.tuples(*(st.one_of(st.none(), st.just(b"u"), SERVER[t]) for t in types)).map(
        lambda vs: TupleData(bytes(ord("n") if v is None else ord("u") if v == b"u"
                                   else ord("t") for v in vs),
                             tuple(None if v == b"u" else v for v in vs)))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_server_like_rows_all_take_the_fast_path(data: st.DataObject) -> None:
    relation = data.draw(relations(TYPES))
    types = [c.type_oid for c in relation.columns]
    body: list[Any] = [Insert(relation.relation_id, data.draw(_server_like(types)))
                       for _ in range(3)]
    body.append(Update(relation.relation_id, data.draw(_server_like(types)),
                       old=data.draw(_server_like(types))))
    fast = both(_at_lsns(transaction(relation, body)))
    assert fast.error is None
    assert fast.used == {"fast": 4}


def test_a_relation_redescribed_mid_transaction_gets_a_new_appender() -> None:
    """A Relation message inside a transaction (ALTER TABLE) describes the changes after it:
    their names, types and key come from it."""
    one = RelationMessage(16400, "public", "t", "d", (RelationColumn(True, "a", 23, -1),))
    two = RelationMessage(16400, "public", "t", "d", (RelationColumn(True, "a", 23, -1),
                                                      RelationColumn(False, "b", 25, -1)))
    end = LSN(0x3000000)
    messages = [encode(one), encode(Begin(end, WHEN, 900)),
                encode(Insert(16400, TupleData(b"t", (b"1",)))), encode(two),
                encode(Insert(16400, TupleData(b"tt", (b"2", b"x")))),
                encode(Commit(end, LSN(end + 0x100), WHEN))]
    fast = both(_at_lsns(messages))
    assert fast.used == {"fast": 2}
    assert fast.builder.after_json == [b'{"a":1}', b'{"a":2,"b":"x"}']


# --- on a real server: every type and value the parity workload makes ------------------------


@pytest.fixture(scope="module")
def parity(pg_module_db: Any) -> Any:
    slots = setup_parity(pg_module_db)
    run_parity_workload(pg_module_db)
    return pg_module_db, slots.pgoutput


@pytest.mark.server
@pytest.mark.parametrize("streaming", [False, True], ids=["unstreamed", "streamed"])
def test_server_changes_append_as_add_change_does(parity: Any, streaming: bool) -> None:
    """Every change of the parity workload (every type, TOAST, replica identities, two-phase
    and, streamed, large transactions the collector gets replayed from the spool) takes the
    fast path and gives the builder what add_change gives it."""
    db, slot = parity
    proto = 4 if db.major_version >= 16 else 3
    options = pgoutput_options(proto, streaming="on" if streaming else "off",
                               publication="parity_pub")
    with db.connect(autocommit=True) as conn:
        captured = peek(conn, slot, options)
    fast = both([(item.data, item.lsn) for item in captured], proto)
    assert fast.error is None
    assert fast.used["declined"] == 0
    assert fast.used["fast"] == fast.builder.rows - fast.builder.op.count("TRUNCATE") > 100
