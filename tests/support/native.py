"""What the emitters' fast-path tests share (test_json_native.py, test_text_native.py,
test_wal2json_native.py): hypothesis-made relations and row changes, a transaction around
them, and a run of an emitter through a pipeline with its C formatter on or off; and the
values of each type as the server writes them, or as it never does (``SERVER``, ``VALUES``,
also drawn by test_spark_changerows.py).

Each test runs the same messages both ways and requires the same output or the same error:
the Python change callback is the reference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import strategies as st

from emitters.wal2json.fast import V1Parts
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
from support.recorders import with_fast_path
from support.scripted import feed_in_runs

WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
RELID = 16400

names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                min_size=1, max_size=8)


@st.composite
def relations(draw: st.DrawFn, types: Sequence[int], identities: str = "dfi"
              ) -> RelationMessage:
    """A table of 1 to 7 columns of ``types`` under one of the replica ``identities``
    (pgoutput flags every column of a FULL identity, none of NOTHING)."""
    chosen = draw(st.lists(st.sampled_from(types), min_size=1, max_size=7))
    width = len(chosen)
    column_names = draw(st.lists(names, min_size=width, max_size=width, unique=True))
    identity = draw(st.sampled_from(identities))
    keys = draw(st.lists(st.booleans(), min_size=width, max_size=width))
    if identity in "fn":
        keys = [identity == "f"] * width
    columns = tuple(RelationColumn(k, n, t, -1)
                    for k, n, t in zip(keys, column_names, chosen, strict=True))
    return RelationMessage(RELID, draw(names), draw(names), identity, columns)


@st.composite
def rows(draw: st.DrawFn, relation: RelationMessage,
         values: Callable[[int], st.SearchStrategy[bytes]]) -> TupleData:
    """A tuple of ``relation``: mostly text columns (``values`` by type OID), some null and
    unchanged-TOAST ones, rarely a binary one."""
    kinds, out = [], []
    for column in relation.columns:
        kind = draw(st.sampled_from("ttttttnu" + ("b" if draw(st.integers(0, 30)) == 0 else "")))
        kinds.append(ord(kind))
        out.append(draw(values(column.type_oid)) if kind in "tb" else None)
    return TupleData(bytes(kinds), tuple(out))


@st.composite
def changes(draw: st.DrawFn, relation: RelationMessage,
            values: Callable[[int], st.SearchStrategy[bytes]]) -> list[Any]:
    """1 to 4 row changes of ``relation``, with a key, a whole old row, or no old tuple."""
    out: list[Any] = []
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["I", "U", "D"]))
        before = draw(st.sampled_from(["key", "old", "none"]))
        old, new = draw(rows(relation, values)), draw(rows(relation, values))
        if action == "I":
            out.append(Insert(relation.relation_id, new))
        elif action == "U":
            out.append(Update(relation.relation_id, new,
                              key=old if before == "key" else None,
                              old=old if before == "old" else None))
        else:
            out.append(Delete(relation.relation_id, key=old if before != "old" else None,
                              old=old if before == "old" else None))
    return out


def transaction(relation: RelationMessage, body: list[Any], xid: int = 741) -> list[bytes]:
    """The encoded Relation message, then ``body`` in a transaction (a later xid commits
    later: a transaction sent again would be skipped as delivered)."""
    end = LSN(0x2000000 + 0x1000 * (xid - 741))
    return [encode(relation), encode(Begin(end, WHEN, xid)),
            *(encode(m) for m in body), encode(Commit(end, LSN(end + 0x100), WHEN))]


def binary(change: Any) -> bool:
    """Whether a change has a binary-format column (the C formatters leave those to Python)."""
    return any(row is not None and b"b" in row.kinds
               for row in (getattr(change, "new", None), getattr(change, "key", None),
                           getattr(change, "old", None)))


def decodes(raw: bytes) -> bool:
    """Whether ``raw`` is UTF-8 as Python's strict decoder takes it: the reference of the
    textual checks and of the C formatters' string columns."""
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


class Run:
    """An emitter's records for some messages, or its error; how many changes its formatter
    wrote ("fast") and left to the change callback ("declined"). With ``in_runs``, the
    messages go in as the walsender source hands them over: framed as XLogData, each run of
    row changes (protocol/runs.py) in one ``feed_run``."""

    def __init__(self, plugin: Callable[[], Any], messages: list[bytes], fast: bool,
                 options: dict[str, str | None], proto: int = 1, in_runs: bool = False
                 ) -> None:
        self.used: Counter[str] = Counter()
        self.formatters: list[Any] = []
        pipeline = Pipeline(proto_version=proto)
        out = MemoryOutput()
        pipeline.add(with_fast_path(plugin(), self.used, fast, seen=self.formatters),
                     options=dict(options), output=out)
        pipeline.startup()
        self.error: str | None = None
        lsns = [LSN(0x16B3748 + 0x100 * (i + 1)) for i in range(len(messages))]
        try:
            if in_runs:
                feed_in_runs(pipeline, list(zip(messages, lsns, strict=True)))
            else:
                for lsn, data in zip(lsns, messages, strict=True):
                    pipeline.feed(data, lsn)
        except CallbackError as exc:
            self.error = f"{type(exc.cause).__name__}: {exc.cause}"
        self.lines = out.lines


def both(plugin: Callable[[], Any], messages: list[bytes], options: dict[str, str | None],
         proto: int = 1) -> Run:
    """The run with the formatter, checked against the run without it (the reference)."""
    fast = Run(plugin, messages, True, options, proto)
    reference = Run(plugin, messages, False, options, proto)
    assert fast.error == reference.error
    assert fast.lines == reference.lines
    assert not reference.used
    in_runs = Run(plugin, messages, True, options, proto, in_runs=True)
    assert in_runs.error == reference.error
    assert in_runs.lines == reference.lines
    for formatter in fast.formatters:
        lines_agree(formatter.write, formatter.calls)
        lsns_agree(formatter.write, formatter.calls)
    return fast


# LSNs whose printing (%X/%X) a formatter may get wrong: zero halves, all digits, carries
EDGE_LSNS = [0, 0xF, 0x10, 0xFFFFFFFF, 0x1_0000_0000, 0xA_0000_000B, 0xFFFFFFFF_FFFFFFFF]


def lsns_agree(write: Any, calls: list[tuple[bytes, Any, Any]]) -> None:
    """A formatter's line that holds the change's LSN holds any other LSN as str(LSN) prints
    it, and is otherwise the same."""
    for data, lsn, txn in calls:
        line = write(data, lsn, txn)
        printed = f'"lsn":"{LSN(lsn)}"'.encode()
        if not isinstance(line, bytes) or printed not in line:
            continue
        for other in EDGE_LSNS:
            assert write(data, LSN(other), txn) == line.replace(
                printed, f'"lsn":"{LSN(other)}"'.encode())


def lines_agree(write: Any, calls: list[tuple[bytes, Any, Any]]) -> None:
    """A formatter's ``lines``, from any start in the messages it was given one by one, is
    its ``line`` of each message in turn up to the first it declines (or the same error):
    all at one LSN, and each at its own (a list of LSNs, as a replay hands over)."""
    if not hasattr(write, "lines"):
        return
    if isinstance(write, V1Parts):
        v1_lines_agree(write, calls)
        return
    datas = [data for data, _, _ in calls]
    for start, (_, lsn, txn) in enumerate(calls):
        # the LSN of every message, or of each (distinct ones, the edges among them)
        own = [LSN(EDGE_LSNS[i % len(EDGE_LSNS)]) for i in range(len(datas))]
        for at in (lsn, own):
            expected: list[bytes] = []
            try:
                for i in range(start, len(datas)):
                    line = write(datas[i], at[i] if isinstance(at, list) else at, txn)
                    if line is None:
                        break
                    expected.append(line)
            except Exception as exc:
                with pytest.raises(type(exc)):
                    write.lines(datas, start, at, txn)
                continue
            assert write.lines(datas, start, at, txn) == (expected, start + len(expected))
        if start < len(datas):  # a list that leaves out a message's LSN is refused
            with pytest.raises(ValueError, match="fewer lsns than datas"):
                write.lines(datas, start, own[:start], txn)


def v1_lines_agree(write: V1Parts, calls: list[tuple[bytes, Any, Any]]) -> None:
    """``lines_agree`` for wal2json format 1's formatter, which writes no record but adds
    each change to the transaction's document: ``lines`` from any start adds the parts one
    call per change would, and takes the same changes."""
    datas = [data for data, _, _ in calls]
    parts = write.st.v1_parts
    for start, (_, lsn, txn) in enumerate(calls):
        own = [LSN(EDGE_LSNS[i % len(EDGE_LSNS)]) for i in range(len(datas))]
        for at in (lsn, own):
            count, before = write.st.nr_changes, len(parts)
            taken = start
            while taken < len(datas) and write(
                    datas[taken], at[taken] if isinstance(at, list) else at, txn) is True:
                taken += 1
            expected = parts[before:]
            del parts[before:]
            write.st.nr_changes = count
            assert write.lines(datas, start, at, txn) == ([], taken)
            assert parts[before:] == expected
        if start < len(datas):
            with pytest.raises(ValueError, match="fewer lsns than datas"):
                write.lines(datas, start, own[:start], txn)


def damaged_outcomes_agree(plugin: Callable[[], Any], relation: RelationMessage,
                           body: list[Any], data: st.DataObject,
                           options: dict[str, str | None]) -> None:
    """A damaged row change is never formatted: the decoder reports it, as without the fast
    path (or, damaged into another valid message, both print the same)."""
    messages = transaction(relation, body * 2)
    index = data.draw(st.integers(3, len(messages) - 2))  # a change after the first
    raw = bytearray(messages[index])
    cut = data.draw(st.integers(5, max(5, len(raw))))
    messages[index] = bytes(raw[:cut]) + data.draw(st.binary(max_size=6))
    outcomes = []
    for fast in (True, False):
        try:
            run = Run(plugin, messages, fast, options)
            outcomes.append((run.error, run.lines))
        except Exception as exc:  # the decoder's ProtocolError, or the pipeline's
            outcomes.append((f"{type(exc).__name__}: {exc}", None))
    assert outcomes[0] == outcomes[1]


# --- values: the server's text of each type, and text it never writes ------------------------

_plain_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)


def _pg_array(items: Any, element: Any) -> bytes:
    """PostgreSQL's array_out: elements quoted when empty, NULL, or holding specials."""
    if isinstance(items, list):
        return b"{" + b",".join(_pg_array(i, element) for i in items) + b"}"
    if items is None:
        return b"NULL"
    text = element(items)
    if (text == "" or text.upper() == "NULL"
            or any(c in text for c in '{},"\\ \t\n\r\v\f')):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text.encode()


def _arrays(element: st.SearchStrategy[Any], show: Any) -> st.SearchStrategy[bytes]:
    flat = st.lists(st.one_of(st.none(), element), max_size=5)
    square = st.integers(1, 3).flatmap(
        lambda n: st.lists(st.lists(st.one_of(st.none(), element), min_size=n, max_size=n),
                           min_size=1, max_size=3))
    return st.one_of(flat, square).map(lambda items: _pg_array(items, show))


_timestamps = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31))


def _ts_text(with_zone: bool) -> st.SearchStrategy[bytes]:
    def show(t: datetime, offset: str) -> bytes:
        text = t.isoformat(sep=" ")
        return (text + offset if with_zone else text).encode()

    offsets = st.sampled_from(["+00", "-08", "+05:30", "+13", "-03:30:15"])
    return st.one_of(
        st.builds(show, _timestamps, offsets),
        st.sampled_from([b"infinity", b"-infinity", b"0044-03-15 10:00:00 BC",
                         b"0044-03-15 10:00:00+00 BC", b"Sat Jan 01 00:00:00 2000 PST",
                         b"12345-01-01 00:00:00", b"01/02/2024 03:04:05",
                         b"20 4-01-02 03:04:05+00"]),
    )


# type OID -> values of its text as the server writes them
SERVER: dict[int, st.SearchStrategy[bytes]] = {
    20: st.integers(-(2**63), 2**63 - 1).map(lambda i: str(i).encode()),  # int8
    23: st.integers(-(2**31), 2**31 - 1).map(lambda i: str(i).encode()),  # int4
    25: _plain_text.map(str.encode),  # text
    1043: _plain_text.map(str.encode),  # varchar
    1700: st.one_of(st.decimals(allow_nan=False, places=2).map(lambda d: str(d).encode()),
                    st.just(b"NaN"), st.just(b"Infinity")),  # numeric
    701: st.one_of(st.floats().map(repr).map(str.encode),
                   st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e+300", b"-0",
                                    b"0"])),  # float8 (the server prints -0.0 as -0)
    16: st.sampled_from([b"t", b"f"]),  # bool
    114: st.sampled_from([b'{"a": 1,\n "b": [1, 2]}', b"[1,\r\n2]", b'"x"', b"null"]),  # json
    3802: st.sampled_from([b'{"a": 1, "b": "\\u00e9\xc3\xa9"}', b"[]", b"3.5"]),  # jsonb
    1114: _ts_text(False),  # timestamp
    1184: _ts_text(True),  # timestamptz
    1009: _arrays(_plain_text, str),  # text[]
    1016: _arrays(st.integers(-(2**63), 2**63 - 1), str),  # int8[]
    1000: _arrays(st.booleans(), lambda b: "t" if b else "f"),  # bool[]
    17: st.sampled_from([b"\\x00ff", b"a\\\\b\\001"]),  # bytea: Python only
    1186: st.sampled_from([b"1 year 2 mons 3 days 04:05:06.5", b"-00:00:01"]),  # interval
    2950: st.uuids().map(lambda u: str(u).encode()),  # uuid
}


# ... and text it never writes there, which the fast path must leave to Python
ODD: dict[int, st.SearchStrategy[bytes]] = {
    25: st.binary(max_size=8),  # not UTF-8: a decode error in both
    16: st.just(b"x"),  # a KeyError in both
    1009: st.text("{},\"\\ aN", max_size=12).map(str.encode),
    1016: st.sampled_from([b"{007}", b"{-0}", b"{1, 2}", b"[0:1]={1,2}", b"{a}"]),
    1000: st.sampled_from([b"{x}", b'{"t"}']),
}


VALUES = {t: st.one_of(v, ODD[t]) if t in ODD else v for t, v in SERVER.items()}


TYPES = sorted(VALUES)
