"""The versions a batch makes of a table's rows, for its history (history.py): each
transaction's rows as the other transactions saw them after its commit (``history_changes``;
equal rows of a table keyed by every column each a version of their own,
``counted_history``), and the target's current versions they end; typed in Python
(``versions_arrow``, ``ends_arrow``), and ended in Arrow (``ended_copies``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.columns.arrowtyped import typed_arrays, typed_rows
from plugin_framework.spark.columns.descriptions import TableInfo
from plugin_framework.spark.mirrors.keys import key_names, key_tuples
from plugin_framework.spark.mirrors.netchange import (
    Counts,
    Gone,
    Key,
    Put,
    Replay,
    fill_columns,
    put_columns,
    put_schema,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["VERSION_COLUMNS", "At", "HistoryChanges", "counted_history", "ended_copies",
           "ends_arrow", "history_changes", "versions_arrow"]

At = tuple[int, datetime]  # a transaction's commit LSN and time

VERSION_COLUMNS = (("_op", "string"), ("_valid_from_lsn", "bigint"),
                   ("_valid_from", "timestamp"), ("_valid_to_lsn", "bigint"),
                   ("_valid_to", "timestamp"), ("_is_current", "boolean"))


@dataclass
class _Version:
    put: Put
    since: At
    until: At | None = None


@dataclass
class HistoryChanges:
    versions: pa.Table  # the versions the batch made (put_columns, op, since, until)
    ends: pa.Table  # the keys whose version in the target ends, when, and how many of
    # their current versions (row, at, copies: 1 but for a counted table's equal rows)
    truncated_at: At | None  # the target's other current versions end here
    fills: list[str] = field(default_factory=list)  # columns some versions take from the target


def history_changes(rows: Sequence[dict[str, Any]], key_columns: Sequence[str], *,
                    counted: bool = False) -> HistoryChanges:
    """The versions one table's change rows of a batch make (dicts of NET_COLUMNS, in
    ``(commit_lsn, seq)`` order), and the target's versions they end. ``counted``: the
    table is keyed by every column and may hold equal rows (``counted_history``)."""
    if counted:
        return counted_history(rows, key_columns)
    replay = Replay(tuple(key_columns))
    versions: list[_Version] = []
    current: dict[Key, _Version] = {}  # the batch's open versions
    ends: dict[Key, tuple[Put | Gone | None, Key, At]] = {}
    truncated_at: At | None = None
    for at, changes in _transactions(rows):
        replay.touched = []
        truncates = False
        for change in changes:
            truncates = truncates or change["op"] == "TRUNCATE"
            replay.apply(change)
        if truncates:
            truncated_at = truncated_at or at
            for version in current.values():
                version.until = at
            current.clear()
        for key in dict.fromkeys(replay.touched):
            entry = replay.state.get(key)  # None: truncated after
            if key not in ends:  # the target's version ends at the first touch (or TRUNCATE)
                ends[key] = (entry, key, truncated_at or at)
            if key in current:
                current.pop(key).until = at
            if isinstance(entry, Put):
                version = _Version(entry, at)
                versions.append(version)
                current[key] = version
    return _history_changes(versions, [(key, None if entry is None else entry.row_json, at, 1)
                                       for entry, key, at in ends.values()],
                            truncated_at, key_columns)


def counted_history(rows: Sequence[dict[str, Any]], key_columns: Sequence[str]
                    ) -> HistoryChanges:
    """``history_changes`` of a table keyed by every column, whose equal rows are counted
    (netchange.Counts): each copy a transaction adds is a version of its own; each copy it
    takes away ends a version of that row, the batch's own first, else ``copies`` of the
    target's current ones (the ends)."""
    versions: list[_Version] = []
    current: dict[Key, list[_Version]] = {}  # the batch's open versions of each row
    ends: list[tuple[Key, str | None, At, int]] = []
    truncated_at: At | None = None
    for at, changes in _transactions(rows):
        counts = Counts(tuple(key_columns))
        for change in changes:
            counts.apply(change)
        if counts.truncated:
            truncated_at = truncated_at or at
            for version in itertools.chain.from_iterable(current.values()):
                version.until = at
            current.clear()
        for key, entry, n in counts.changed():
            if n > 0:
                assert isinstance(entry, Put)
                for _ in range(n):
                    versions.append(_Version(entry, at))
                    current.setdefault(key, []).append(versions[-1])
                continue
            mine = current.get(key, [])
            while n and mine:
                mine.pop(0).until = at
                n += 1
            if n and truncated_at is None:  # after a TRUNCATE the target has none
                ends.append((key, entry.row_json, at, -n))
    return _history_changes(versions, ends, truncated_at, key_columns)


def _transactions(rows: Sequence[dict[str, Any]]
                  ) -> Iterator[tuple[At, list[dict[str, Any]]]]:
    for _, group in itertools.groupby(rows, key=lambda r: int(r["commit_lsn"])):
        changes = list(group)
        yield (int(changes[0]["commit_lsn"]), changes[0]["commit_time"]), changes


def _history_changes(versions: list[_Version], ends: list[tuple[Key, str | None, At, int]],
                     truncated_at: At | None, key_columns: Sequence[str]) -> HistoryChanges:
    """The versions and the ends (key, row_json, at, copies) as HistoryChanges' tables."""
    import pyarrow as pa

    puts = [v.put for v in versions]
    utc = pa.timestamp("us", "UTC")
    table = pa.table({
        **put_columns(puts), "op": [p.op for p in puts],
        "since_lsn": [v.since[0] for v in versions], "since": [v.since[1] for v in versions],
        "until_lsn": [None if v.until is None else v.until[0] for v in versions],
        "until": [None if v.until is None else v.until[1] for v in versions]},
        schema=pa.schema([*put_schema(), ("op", pa.string()), ("since_lsn", pa.int64()),
                          ("since", utc), ("until_lsn", pa.int64()), ("until", utc)]))
    text_map = pa.map_(pa.string(), pa.string())
    end_table = pa.table({
        "row": pa.array([list(zip(key_columns, key, strict=True)) for key, _, _, _ in ends],
                        text_map),
        "row_json": pa.array([row_json for _, row_json, _, _ in ends], pa.string()),
        "at_lsn": pa.array([at[0] for _, _, at, _ in ends], pa.int64()),
        "at": pa.array([at[1] for _, _, at, _ in ends], utc),
        "copies": pa.array([copies for _, _, _, copies in ends], pa.int64())})
    return HistoryChanges(table, end_table, truncated_at, fill_columns(puts))


def versions_arrow(changes: HistoryChanges, info: TableInfo) -> pa.Table:
    """``HistoryWriter._versions`` typed in Python (arrowtyped.py): raises Decline where
    only Spark's expressions are known to type a value as they do."""
    import pyarrow.compute as pc

    v = changes.versions
    out = typed_rows(v, [(name, pg) for name, pg, _ in info.columns], key_names(info))
    for name, values in (("_op", v.column("op")), ("_valid_from_lsn", v.column("since_lsn")),
                         ("_valid_from", v.column("since")),
                         ("_valid_to_lsn", v.column("until_lsn")),
                         ("_valid_to", v.column("until")),
                         ("_is_current", pc.is_null(v.column("until_lsn")))):
        out = out.append_column(name, values)
    return out


def ends_arrow(changes: HistoryChanges, info: TableInfo) -> pa.Table:
    """``HistoryWriter._ends`` typed in Python (arrowtyped.py)."""
    import pyarrow as pa

    e = changes.ends
    types = {name: pg for name, pg, _ in info.columns}
    keys = key_names(info)
    typed = typed_arrays(e.column("row"), e.column("row_json").to_pylist(),
                         [(k, types[k]) for k in keys])
    return pa.table([*typed, e.column("at_lsn"), e.column("at"), e.column("copies")],
                    names=[*keys, "_valid_to_lsn", "_valid_to", "_copies"])


def ended_copies(rows: pa.Table, ends: pa.Table, info: TableInfo,
                 truncated_at: At | None) -> pa.Table:
    """A ``counted`` table's versions ``rows`` with ``ends`` applied (typed: the row,
    ``_valid_to_lsn``, ``_valid_to``, ``_copies``): each ends that many of the row's current
    versions, the oldest first; then, after a TRUNCATE (``truncated_at``), every version
    still current ends there."""
    import pyarrow as pa

    keys = key_names(info)
    since = rows.column("_valid_from_lsn").to_pylist()
    current = rows.column("_is_current").to_pylist()
    row_keys = key_tuples(rows, keys)
    by_row: dict[tuple[Any, ...], list[int]] = {}  # each row's current versions, oldest first
    for i in sorted(range(rows.num_rows), key=lambda i: (since[i], i)):
        if current[i]:
            by_row.setdefault(row_keys[i], []).append(i)
    until_lsn = rows.column("_valid_to_lsn").to_pylist()
    until = rows.column("_valid_to").to_pylist()
    for key, lsn, at, copies in zip(key_tuples(ends, keys),
                                    ends.column("_valid_to_lsn").to_pylist(),
                                    ends.column("_valid_to").to_pylist(),
                                    ends.column("_copies").to_pylist(), strict=True):
        versions = by_row.get(key, [])
        for i in versions[:copies]:
            until_lsn[i], until[i], current[i] = lsn, at, False
        del versions[:copies]
    if truncated_at is not None:
        for i, now in enumerate(current):
            if now:
                until_lsn[i], until[i], current[i] = truncated_at[0], truncated_at[1], False
    out = rows
    for name, values in (("_valid_to_lsn", until_lsn), ("_valid_to", until),
                         ("_is_current", current)):
        position = out.schema.get_field_index(name)
        out = out.set_column(position, out.schema.field(name),
                             pa.array(values, out.schema.field(name).type))
    return out
