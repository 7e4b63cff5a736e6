"""The net effect of a batch of changes on each row of a table: what a mirror applies.

A batch's changes of one table, in ``(commit_lsn, seq)`` order, are replayed over the keys
they touch, as a subscriber would apply them:

- INSERT and SNAPSHOT put a row under its key; DELETE takes the key away; TRUNCATE takes
  every row away (those of the target too).
- UPDATE takes the row away from its old key (the ``before`` key of a key change; the same
  key otherwise) and puts the new row under its new key. An unchanged TOAST value (the
  server did not send it) comes from the old row: from ``before`` where it has the value
  (REPLICA IDENTITY FULL), else from the row the batch put under the old key, else from the
  target's row under the key the chain of key changes began with (``origin``): a value is
  followed through any number of key changes in the batch.
- Under REPLICA IDENTITY FULL every column is the key, and the new key is taken once the
  unchanged TOAST values are filled in.

The result has one row per key the batch touched: ``deleted`` (the target's row under it
goes), or the row to put there, with ``fill``: the columns to take from the target's row
under ``origin``. ``truncated``: the target's rows go before these. Rows are in the change
schema's text form (``row``: a map of the server's text, ``row_json``: the json emitter's
typed JSON), so that ``tables.typed_changes``' conversions type them.

This runs in the driver over the batch's rows of the table (the batch is there already:
both ways in build it there): its cost grows with the batch, not with the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["NET_COLUMNS", "NetChanges", "net_changes"]

# What net_changes needs of a batch's change rows
NET_COLUMNS = ("schema", "table", "op", "lsn", "commit_lsn", "commit_time", "seq", "key",
               "before", "after", "before_json", "after_json", "unchanged_toast", "columns")

Key = tuple[str | None, ...]


@dataclass
class Put:
    """A row the batch put under a key."""

    row: dict[str, str | None]
    row_json: str | None
    commit_lsn: int
    lsn: int
    op: str  # INSERT, UPDATE or SNAPSHOT
    fill: set[str] = field(default_factory=set)  # columns to take from the target ...
    origin: dict[str, str | None] | None = None  # ... row under this key
    origin_json: str | None = None


@dataclass
class Gone:
    """A key the batch took away."""

    row: dict[str, str | None]  # its key columns
    row_json: str | None
    commit_lsn: int
    lsn: int


@dataclass
class NetChanges:
    table: pa.Table  # one row per key the batch touched (see the module's text)
    truncated: bool  # a TRUNCATE: the target's rows go first
    fills: list[str]  # the columns some rows take from the target


def put_columns(entries: Sequence[Put | Gone]) -> dict[str, list[Any]]:
    """The columns of ``entries`` that say what to put (or take away) under each key."""
    return {
        "deleted": [isinstance(v, Gone) for v in entries],
        "row": [list(v.row.items()) for v in entries],
        "row_json": [v.row_json for v in entries],
        "fill": [sorted(v.fill) if isinstance(v, Put) else [] for v in entries],
        "origin": [list(v.origin.items()) if isinstance(v, Put) and v.origin is not None
                   else None for v in entries],
        "origin_json": [v.origin_json if isinstance(v, Put) else None for v in entries],
    }


def put_schema() -> list[tuple[str, pa.DataType]]:
    import pyarrow as pa

    text_map = pa.map_(pa.string(), pa.string())
    return [("deleted", pa.bool_()), ("row", text_map), ("row_json", pa.string()),
            ("fill", pa.list_(pa.string())), ("origin", text_map), ("origin_json", pa.string())]


def fill_columns(entries: Sequence[Put | Gone]) -> list[str]:
    return sorted({c for v in entries if isinstance(v, Put) for c in v.fill})


def _map(value: Any) -> dict[str, str | None] | None:
    return None if value is None else dict(value)


def net_changes(rows: Sequence[dict[str, Any]], key_columns: Sequence[str]) -> NetChanges:
    """The net effect of one table's change rows (dicts of NET_COLUMNS, in ``(commit_lsn,
    seq)`` order); ``key_columns``: the replica identity (every column under FULL)."""
    import pyarrow as pa

    replay = Replay(tuple(key_columns))
    for change in rows:
        replay.apply(change)
    entries = list(replay.state.values())
    out = {**put_columns(entries), "commit_lsn": [v.commit_lsn for v in entries],
           "lsn": [v.lsn for v in entries]}
    schema = pa.schema([*put_schema(), ("commit_lsn", pa.int64()), ("lsn", pa.int64())])
    return NetChanges(pa.table(out, schema=schema), replay.truncated, fill_columns(entries))


class Replay:
    """The keys a batch touched, as its changes leave them."""

    def __init__(self, key_columns: tuple[str, ...]) -> None:
        self.key_columns = key_columns
        self.state: dict[Key, Put | Gone] = {}
        self.truncated = False
        self.touched: list[Key] = []  # keys put, in order (history.py reads and resets it)

    def key_of(self, values: dict[str, str | None]) -> Key:
        return tuple(values.get(k) for k in self.key_columns)

    def put(self, key: Key, entry: Put | Gone) -> None:
        self.state.pop(key, None)  # the newest goes last (dicts keep insertion order)
        self.state[key] = entry
        self.touched.append(key)

    def apply(self, change: dict[str, Any]) -> None:
        op = change["op"]
        commit_lsn, lsn = int(change["commit_lsn"]), int(change["lsn"])
        if op == "TRUNCATE":
            self.state.clear()
            self.truncated = True
        elif op in ("INSERT", "SNAPSHOT"):
            after = _map(change["after"]) or {}
            self.put(self.key_of(after), Put(after, change["after_json"], commit_lsn, lsn, op))
        elif op == "DELETE":
            old = _map(change["key"]) or {}
            self.put(self.key_of(old), Gone(old, change["before_json"], commit_lsn, lsn))
        elif op == "UPDATE":
            self.update(change, commit_lsn, lsn)
        else:
            raise ValueError(f"unknown change op {op!r}")

    def update(self, change: dict[str, Any], commit_lsn: int, lsn: int) -> None:
        before = _map(change["before"])
        after = _map(change["after"]) or {}
        identity = before if before is not None else (_map(change["key"]) or after)
        old_key = self.key_of(identity)
        put = Put(after, change["after_json"], commit_lsn, lsn, "UPDATE")
        toast = list(change["unchanged_toast"] or ())
        if toast:
            self.fill_toast(put, toast, before, change, self.state.get(old_key), identity)
        new_key = self.key_of(after)
        if new_key != old_key:
            self.put(old_key, Gone(dict(zip(self.key_columns, old_key, strict=True)),
                                    change["before_json"], commit_lsn, lsn))
        self.put(new_key, put)

    def fill_toast(self, put: Put, toast: list[str], before: dict[str, str | None] | None,
                   change: dict[str, Any], prev: Put | Gone | None,
                   identity: dict[str, str | None]) -> None:
        """The unchanged TOAST values of an update, from the old row where it has them,
        else the previous version in the batch, else (``fill``) the target."""
        known: dict[str, Any] = {}
        if before is not None:  # REPLICA IDENTITY FULL: the old row has them
            before_json = orjson.loads(change["before_json"] or "{}")
            for c in toast:
                if before.get(c) is not None:
                    put.row[c] = before[c]
                    known[c] = before_json.get(c)
        missing = [c for c in toast if c not in known]
        if missing and isinstance(prev, Put):
            prev_json = orjson.loads(prev.row_json or "{}")
            for c in missing:
                if c in prev.fill:  # the previous version waits for it from the target too
                    put.fill.add(c)
                else:
                    put.row[c] = prev.row.get(c)
                    known[c] = prev_json.get(c)
            put.origin, put.origin_json = prev.origin, prev.origin_json
        elif missing:  # the target has the row as it was before the batch
            put.fill.update(missing)
            put.origin = {k: identity.get(k) for k in self.key_columns}
            put.origin_json = change["before_json"] if before is not None \
                else change["after_json"]
        if known:
            row_json = orjson.loads(put.row_json or "{}")
            row_json.update(known)
            put.row_json = orjson.dumps(row_json).decode()
