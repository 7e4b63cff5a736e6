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

A table keyed by every column (REPLICA IDENTITY FULL, or no replica identity, or a key of
every column) may hold equal rows, which no key tells apart: PostgreSQL's own subscriber
inserts each and deletes one at a time. Its batches are netted as counts instead
(``counted_net``): each row the batch adds or takes away, with how many ``copies``.

The result has one row per key the batch touched: ``deleted`` (the target's row under it
goes), or the row to put there, with ``fill``: the columns to take from the target's row
under ``origin``; ``copies`` is 1 (a count only for ``counted_net``). ``truncated``: the
target's rows go before these. Rows are in the change schema's text form (``row``: a map
of the server's text, ``row_json``: the json emitter's typed JSON), so that
``tables.typed_changes``' conversions type them.

This runs in the driver over the batch's rows of the table (the batch is there already:
both ways in build it there): its cost grows with the batch, not with the target. A batch
with no update's old row, no unchanged TOAST value and no TRUNCATE (the usual batch of a
table with a primary key) is netted a column at a time in Arrow (``simple_net``: each key's
last change); the replay is the reference, and tests/spark/test_spark_netchange.py proves the two
equal on random batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from plugin_framework.spark.changes.rows import TableRows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Counts", "NetChanges", "counted_net", "net_changes", "simple_net"]

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


def net_schema() -> pa.Schema:
    """The schema of ``NetChanges.table``."""
    import pyarrow as pa

    return pa.schema([*put_schema(), ("commit_lsn", pa.int64()), ("lsn", pa.int64()),
                      ("copies", pa.int64())])


def fill_columns(entries: Sequence[Put | Gone]) -> list[str]:
    return sorted({c for v in entries if isinstance(v, Put) for c in v.fill})


def _map(value: Any) -> dict[str, str | None] | None:
    return None if value is None else dict(value)


def net_changes(rows: Sequence[dict[str, Any]], key_columns: Sequence[str], *,
                counted: bool = False) -> NetChanges:
    """The net effect of one table's change rows (dicts of NET_COLUMNS, in ``(commit_lsn,
    seq)`` order); ``key_columns``: the replica identity (every column under FULL).
    ``counted``: the table is keyed by every column and held as a multiset (``counted_net``)."""
    if counted:
        return counted_net(rows, key_columns)
    if isinstance(rows, TableRows) and rows.pristine:
        simple = simple_net(rows.arrow, key_columns)
        if simple is not None:
            return simple
    replay = Replay(tuple(key_columns))
    for change in rows:
        replay.apply(change)
    return _net_table(list(replay.state.values()), [1] * len(replay.state), replay.truncated)


def _net_table(entries: Sequence[Put | Gone], copies: Sequence[int],
               truncated: bool) -> NetChanges:
    import pyarrow as pa

    out = {**put_columns(entries), "commit_lsn": [v.commit_lsn for v in entries],
           "lsn": [v.lsn for v in entries], "copies": list(copies)}
    return NetChanges(pa.table(out, schema=net_schema()), truncated, fill_columns(entries))


def counted_net(rows: Sequence[dict[str, Any]], key_columns: Sequence[str]) -> NetChanges:
    """``net_changes`` of a table keyed by every column, as a multiset (``Counts``): one
    row per distinct row whose count the batch changed, in the order of their last changes:
    ``deleted`` with the ``copies`` to take away from the target, or the ``copies`` to
    add."""
    counts = Counts(tuple(key_columns))
    for change in rows:
        counts.apply(change)
    changed = counts.changed()
    return _net_table([entry for _, entry, _ in changed], [abs(n) for _, _, n in changed],
                      counts.truncated)


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
            self.truncate()
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

    def truncate(self) -> None:
        self.state.clear()
        self.truncated = True

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


class Counts(Replay):
    """How a batch's changes of a table keyed by every column change the count of each row:
    INSERT and SNAPSHOT add a copy of their row, DELETE takes a copy of the old row away,
    UPDATE both (its new row's unchanged TOAST values from the old row, which has them
    all), TRUNCATE every copy. An UPDATE without its old row left every column, so the row,
    as it was (a key of every column that did not change)."""

    def __init__(self, key_columns: tuple[str, ...]) -> None:
        super().__init__(key_columns)
        self.counts: dict[Key, int] = {}  # in the order of each row's last change
        self.puts: dict[Key, Put] = {}  # each row's last copy added ...
        self.gones: dict[Key, Gone] = {}  # ... and taken away

    def changed(self) -> list[tuple[Key, Put | Gone, int]]:
        """Each row whose count changed (since a TRUNCATE, if any): its last copy added
        (the count went up) or taken away (down), and by how much."""
        return [(key, self.puts[key] if n > 0 else self.gones[key], n)
                for key, n in self.counts.items() if n]

    def put(self, key: Key, entry: Put | Gone) -> None:
        """A copy of the row added (a Put) or taken away (a Gone)."""
        self.counts[key] = self.counts.pop(key, 0) + (1 if isinstance(entry, Put) else -1)
        if isinstance(entry, Put):
            self.puts[key] = entry
        else:
            self.gones[key] = entry

    def truncate(self) -> None:
        self.counts.clear()
        self.truncated = True

    def update(self, change: dict[str, Any], commit_lsn: int, lsn: int) -> None:
        before = _map(change["before"])
        if before is None:
            return
        put = Put(_map(change["after"]) or {}, change["after_json"], commit_lsn, lsn, "UPDATE")
        toast = list(change["unchanged_toast"] or ())
        if toast:
            self.fill_toast(put, toast, before, change, None, before)
            if put.fill:
                raise ValueError(
                    f"an UPDATE of {change['schema']}.{change['table']} left "
                    f"{sorted(put.fill)} unchanged without sending the old row's values: "
                    "a table keyed by every column needs them (REPLICA IDENTITY FULL)")
        old_key = self.key_of(before)
        self.put(old_key, Gone(dict(zip(self.key_columns, old_key, strict=True)),
                               change["before_json"], commit_lsn, lsn))
        self.put(self.key_of(put.row), put)


_ROW_OPS = ("INSERT", "SNAPSHOT", "UPDATE", "DELETE")


def simple_net(changes: pa.Table, key_columns: Sequence[str]) -> NetChanges | None:
    """``net_changes`` of a batch with no update's old row (no key change, no REPLICA
    IDENTITY FULL), no unchanged TOAST value and no TRUNCATE, found a column at a time
    (``changes``: an Arrow table of NET_COLUMNS, in order): each key's last change says
    what is left under it, its row put or the key taken away, in the order of those last
    changes (the replay's order). None when the batch is not so (or has a key with a NULL):
    the replay decides."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = changes.num_rows
    if n == 0 or not key_columns:
        return None
    op = changes.column("op")
    if not pc.all(pc.is_in(op, value_set=pa.array(_ROW_OPS))).as_py():
        return None
    moved = pc.and_(pc.equal(op, "UPDATE"), pc.is_valid(changes.column("before")))
    if pc.any(moved).as_py():  # an update with its old row: a key change, or FULL
        return None
    toast = pc.list_value_length(changes.column("unchanged_toast"))
    if pc.max(pc.fill_null(toast, 0)).as_py() not in (None, 0):
        return None
    gone = pc.equal(op, "DELETE")
    rows = pc.if_else(gone, changes.column("key"), changes.column("after"))
    if rows.null_count:
        return None
    keys = [pc.map_lookup(rows, pa.scalar(k), "last") for k in key_columns]
    if any(k.null_count for k in keys):
        return None
    joined = keys[0] if len(keys) == 1 else pc.binary_join_element_wise(*keys, "\x00")
    if pc.count_distinct(joined).as_py() != n:  # a key's last change says what is left
        if isinstance(joined, pa.ChunkedArray):
            joined = joined.combine_chunks()
        encoded = pc.dictionary_encode(joined)
        last = pa.table({"key": encoded.indices,
                         "at": pa.array(range(n), pa.int64())}) \
            .group_by("key", use_threads=False).aggregate([("at", "max")])
        kept = pc.sort_indices(last.column("at_max"))
        at = last.column("at_max").take(kept)
        changes, gone, rows = changes.take(at), gone.take(at), rows.take(at)
        n = changes.num_rows
    text_map = pa.map_(pa.string(), pa.string())
    out = {
        "deleted": gone, "row": rows,
        "row_json": pc.if_else(gone, changes.column("before_json"), changes.column("after_json")),
        "fill": pa.ListArray.from_arrays(pa.array([0] * (n + 1), pa.int32()),
                                         pa.array([], pa.string())),
        "origin": pa.nulls(n, text_map), "origin_json": pa.nulls(n, pa.string()),
        "commit_lsn": changes.column("commit_lsn").cast(pa.int64()),
        "lsn": changes.column("lsn").cast(pa.int64()),
        "copies": pa.repeat(pa.scalar(1, pa.int64()), n),
    }
    return NetChanges(pa.table(out, schema=net_schema()), False, [])
