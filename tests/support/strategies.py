"""Hypothesis strategies for pgoutput messages."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import strategies as st

from plugin_framework.protocol import (
    LSN,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Prepare,
    RelationColumn,
    RelationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    Truncate,
    TupleData,
    Type,
    Update,
)

u32 = st.integers(0, 2**32 - 1)
lsns = st.integers(1, 2**64 - 1).map(LSN)
any_lsns = st.integers(0, 2**64 - 1).map(LSN)
times = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59),
    timezones=st.just(UTC),
)
names = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=20)

_column = st.one_of(
    st.just((ord("n"), None)),
    st.just((ord("u"), None)),
    st.tuples(st.just(ord("t")), st.binary(max_size=40)),
    st.tuples(st.just(ord("b")), st.binary(max_size=40)),
)
tuples = st.lists(_column, max_size=12).map(
    lambda cols: TupleData(bytes(k for k, _ in cols), tuple(v for _, v in cols))
)
columns = st.builds(RelationColumn, st.booleans(), names, u32, st.integers(-(2**31), 2**31 - 1))


def transactional(in_stream: bool) -> st.SearchStrategy[object]:
    """Messages that may appear inside a transaction; with an xid exactly when in a stream."""
    xid = u32 if in_stream else st.none()
    identity = st.sampled_from("dnfi")
    return st.one_of(
        st.builds(RelationMessage, u32, names, names, identity,
                  st.lists(columns, max_size=8).map(tuple), xid),
        st.builds(Type, u32, names, names, xid),
        st.builds(Insert, u32, tuples, xid),
        st.builds(Update, u32, tuples, st.none(), st.none(), xid),
        st.builds(Update, u32, tuples, tuples, st.none(), xid),
        st.builds(Update, u32, tuples, st.none(), tuples, xid),
        st.builds(Delete, u32, tuples, st.none(), xid),
        st.builds(Delete, u32, st.none(), tuples, xid),
        st.builds(Truncate, st.lists(u32, max_size=6).map(tuple), st.booleans(), st.booleans(),
                  xid),
        st.builds(LogicalMessage, st.booleans(), any_lsns, names, st.binary(max_size=60), xid),
        st.builds(Origin, any_lsns, names),
    )


def control(proto_version: int) -> st.SearchStrategy[object]:
    """Messages that appear outside stream blocks."""
    options = [
        st.builds(Begin, lsns, times, u32),
        st.builds(Commit, any_lsns, any_lsns, times),
        st.builds(BeginPrepare, lsns, lsns, times, u32, names),
        st.builds(Prepare, lsns, lsns, times, u32, names),
        st.builds(CommitPrepared, lsns, lsns, times, u32, names),
        st.builds(RollbackPrepared, lsns, lsns, times, times, u32, names),
    ]
    if proto_version >= 2:
        options += [
            st.builds(StreamCommit, u32, any_lsns, any_lsns, times),
            st.builds(StreamAbort, u32, u32),
            st.builds(StreamPrepare, lsns, lsns, times, u32, names),
        ]
    if proto_version >= 4:
        options.append(st.builds(StreamAbort, u32, u32, any_lsns, times))
    return st.one_of(*options)


# --- SQL boolean expressions (the row-filter tests) ----------------------------------------------


def sql_bool_combinations(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``st.recursive``'s extension for SQL boolean expressions: AND, OR, NOT and the boolean
    tests over ``inner``."""
    return st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda x: f"({x[0]} {x[1]} {x[2]})"),
        inner.map(lambda x: f"(NOT {x})"),
        st.tuples(inner, st.sampled_from(["IS TRUE", "IS NOT TRUE", "IS FALSE", "IS NOT FALSE",
                                          "IS UNKNOWN", "IS NOT UNKNOWN"])).map(
            lambda x: f"({x[0]} {x[1]})"))
