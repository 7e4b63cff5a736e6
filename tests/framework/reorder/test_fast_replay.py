"""Held transactions replayed from the spool take the emitters' C fast paths as live ones do:
a large transaction the server streamed, for an emitter that receives it whole (the json
emitter has no stream callbacks; the text emitter with stream-changes off), and a prepared
transaction delivered at COMMIT PREPARED. Each example runs through two pipelines, the fast
path on and off (every change through the Python change callback, the reference): the same
lines, and the fast path writes every change it is offered.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from support.recorders import with_fast_path

from emitters.json import JsonEmitter
from emitters.text import TestDecodingEmitter
from emitters.wal2json import Wal2JsonEmitter
from plugin_framework import LSN
from plugin_framework.framework import MemoryOutput, Pipeline
from plugin_framework.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Prepare,
    RelationColumn,
    RelationMessage,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    TupleData,
    Update,
    encode,
)

# The C formatters against their Python references: nothing to compare under
# PGDECODE_IMPL=python
pytestmark = pytest.mark.native

WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TOP, SUB = 900, 901

# emitter -> (plugin class, options under which it receives streamed and prepared
# transactions whole)
EMITTERS: dict[str, tuple[Any, dict[str, str | None]]] = {
    "json": (JsonEmitter, {}),
    "text": (TestDecodingEmitter, {"stream-changes": "0"}),
    # the first change of each transaction through Python, which prints the BEGIN first
    "text, skip-empty-xacts": (TestDecodingEmitter, {"stream-changes": "0",
                                                    "skip-empty-xacts": "1"}),
    "wal2json v1": (Wal2JsonEmitter, {"format-version": "1"}),
    "wal2json v2": (Wal2JsonEmitter, {"format-version": "2"}),
}
GATED = {"text, skip-empty-xacts"}

PEOPLE = RelationMessage(16401, "public", "people", "d", (
    RelationColumn(True, "id", 23, -1), RelationColumn(False, "name", 25, -1),
    RelationColumn(False, "ok", 16, -1)))
WIDER = RelationMessage(16401, "public", "people", "d", (
    *PEOPLE.columns, RelationColumn(False, "score", 1700, -1)), xid=TOP)
NOTES = RelationMessage(16402, "s", "notes", "f", (
    RelationColumn(False, "n", 20, -1), RelationColumn(False, "body", 25, -1)))


def row(kinds: str, *values: bytes | None) -> TupleData:
    return TupleData(kinds.encode(), values)


def run(name: str, messages: list[Any], fast: bool, proto: int,
        change_filter: Any = None) -> tuple[list[tuple[int, int | None, str]], Counter[str]]:
    """The records (LSN, xid, line) the emitter writes for ``messages``, with or without its
    fast path, and what its formatters did."""
    plugin, options = EMITTERS[name]
    used: Counter[str] = Counter()
    pipeline = Pipeline(proto_version=proto)
    pipeline.change_filter = change_filter
    out = MemoryOutput()
    pipeline.add(with_fast_path(plugin(), used, fast), options=options, output=out)
    pipeline.startup()
    lsn = 0x3000000
    for m in messages:
        lsn += 0x100
        pipeline.feed(encode(m), LSN(lsn))
    assert not pipeline.in_flight
    return [(r.lsn, r.xid, r.data.decode()) for r in out.records], used


def both(name: str, messages: list[Any], proto: int,
         change_filter: Any = None) -> tuple[list[str], Counter[str]]:
    """The lines of the fast path, which must be the change callback's, each record at the
    same LSN and xid (a replayed run of changes is written at each one's LSN)."""
    records, used = run(name, messages, True, proto, change_filter)
    reference, unused = run(name, messages, False, proto, change_filter)
    assert records == reference
    assert not unused
    return [line for _, _, line in records], used


def streamed() -> list[Any]:
    """A streamed transaction in three blocks: a subtransaction aborted after the first,
    a column added in the second (the rest of the transaction with its new description)."""
    return [
        PEOPLE, NOTES,
        StreamStart(TOP, True),
        Insert(16401, row("ttt", b"1", b"it's", b"t"), xid=TOP),
        Insert(16402, row("tt", b"7", b"x" * 300), xid=TOP),
        Insert(16401, row("ttt", b"2", b"aborted", b"f"), xid=SUB),  # aborted below
        StreamStop(),
        StreamAbort(TOP, SUB),
        StreamStart(TOP, False),
        Update(16401, row("tut", b"1", None, b"f"), key=row("tnn", b"1", None, None), xid=TOP),
        WIDER,
        Insert(16401, row("tttt", b"3", b"c", b"t", b"1.50"), xid=TOP),
        StreamStop(),
        StreamStart(TOP, False),
        Update(16402, row("tt", b"8", b"y"), old=row("tt", b"7", b"x" * 300), xid=TOP),
        Delete(16401, key=row("tnnn", b"3", None, None, None), xid=TOP),
        StreamStop(),
        StreamCommit(TOP, LSN(0x3000F00), LSN(0x3001000), WHEN),
    ]


@pytest.mark.parametrize("name", list(EMITTERS))
def test_a_streamed_transaction_replays_through_the_fast_path(name: str) -> None:
    lines, used = both(name, streamed(), proto=2)
    # every change but the aborted subtransaction's, formatted in C, in runs (``lines``);
    # but the first under skip-empty-xacts, and wal2json's v1 (whose formatter keeps the
    # changes for the transaction's document, a run at a time too) declines the UPDATE
    # with an unchanged TOAST value
    assert used == ({"fast": 5, "batched": 5, "declined": 1}
                    if name in GATED or name == "wal2json v1"
                    else {"fast": 6, "batched": 6})
    assert not any("aborted" in line for line in lines)
    assert sum("1.50" in line for line in lines) == 1  # the new description was used


def some_altered(change: Any) -> Any:
    """A change filter: drops the change of id 1's row, publishes the notes UPDATE as an
    INSERT (altered: the callback's), passes the others as they are (the formatters')."""
    from dataclasses import replace

    from plugin_framework.framework import Action

    row = change.new if change.new is not None else change.old
    if change.relation.name == "people" and row.text("id") == "1":
        return None
    if change.relation.name == "notes" and change.action is Action.UPDATE:
        return replace(change, action=Action.INSERT, old=None, old_is_key=False)
    return change


@pytest.mark.parametrize("name", list(EMITTERS))
def test_a_replay_under_a_change_filter_formats_what_it_passes_unaltered(name: str) -> None:
    lines, used = both(name, streamed(), proto=2, change_filter=some_altered)
    # of six changes: the UPDATE of id 1 dropped, the notes UPDATE altered (callback)
    assert used == ({"fast": 2, "declined": 1} if name in GATED else {"fast": 3})
    text = "\n".join(lines)
    assert "it's" not in text and "it''s" not in text  # dropped
    assert len(re.findall(r'INSERT|"insert"|"action":"I"', text)) == 3
    assert not re.search(r'UPDATE|"update"|"action":"U"', text)


def prepared(gid: str) -> list[Any]:
    return [
        PEOPLE,
        BeginPrepare(LSN(0x3000E00), LSN(0x3000F00), WHEN, TOP, gid),
        Insert(16401, row("ttt", b"1", b"a", b"t")),
        Delete(16401, key=row("tnn", b"1", None, None)),
        Prepare(LSN(0x3000E00), LSN(0x3000F00), WHEN, TOP, gid),
        Begin(LSN(0x3001000), WHEN, 950),
        Insert(16401, row("ttt", b"5", b"between", b"f")),
        Commit(LSN(0x3001000), LSN(0x3001100), WHEN),
        CommitPrepared(LSN(0x3002000), LSN(0x3002100), WHEN, TOP, gid),
    ]


@pytest.mark.parametrize("name", list(EMITTERS))
def test_a_prepared_transaction_held_to_commit_prepared_replays_through_the_fast_path(
        name: str) -> None:
    # json: two-phase is off by default; text: test_decoding leaves out "_nodecode" gids
    lines, used = both(name, prepared("g_nodecode"), proto=3)
    # the prepared transaction's two changes replayed in a run, the one committed in
    # between formatted as it came
    assert used == ({"fast": 1, "batched": 1, "declined": 2} if name in GATED
                    else {"fast": 3, "batched": 2})
    # held: delivered after the transaction that committed in between
    assert [i for i, line in enumerate(lines) if "between" in line] < \
        [i for i, line in enumerate(lines) if "'a'" in line or '"a"' in line]


def test_a_member_without_a_formatter_gets_the_change_callback_in_the_replay() -> None:
    json_out, text_out = MemoryOutput(), MemoryOutput()
    used: Counter[str] = Counter()
    pipeline = Pipeline(proto_version=2)
    pipeline.add(with_fast_path(JsonEmitter(), used), output=json_out)
    pipeline.add(with_fast_path(TestDecodingEmitter(), Counter(), fast=False),
                 options={"stream-changes": "0"}, output=text_out)
    pipeline.startup()
    lsn = 0x3000000
    for m in streamed():
        lsn += 0x100
        pipeline.feed(encode(m), LSN(lsn))
    assert used == {"fast": 6, "batched": 6}
    assert json_out.lines == both("json", streamed(), proto=2)[0]
    assert text_out.lines == both("text", streamed(), proto=2)[0]
