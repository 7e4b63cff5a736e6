"""What the row-filter test modules share (test_rowfilter.py, test_rowfilter_collation.py,
test_rowfilter_workload.py): a slot's transactions decoded through a publication, behind
client-side filters or not, and the tables a subscriber would hold after them."""

from __future__ import annotations

from typing import Any

import psycopg

from plugin_framework import MemoryOutput, Pipeline
from plugin_framework.rowfilter import PublicationFilters
from support.capture import peek, pgoutput_options
from support.recorders import Event, Recorder, changes_by_transaction


class FilteringRecorder(Recorder):
    """A Recorder behind PublicationFilters: TRUNCATE goes through truncate_filter, as
    ``pgdecode stream`` wires it."""

    def __init__(self, filters: PublicationFilters | None = None) -> None:
        self.filters = filters

    def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        if self.filters is not None:
            relations = self.filters.truncate_filter(relations)
            if not relations:
                return
        super().truncate(ctx, txn, relations, change)


def proto_for(db: Any) -> int:
    return 4 if db.major_version >= 16 else 2


def decode(db: Any, slot: str, publication: str, filters: PublicationFilters | None = None,
           *, streaming: bool = False, binary: bool = False) -> list[list[Event]]:
    """The slot's transactions through ``publication`` (after ``filters``), each as its list
    of change and truncate events; transactions left empty are dropped, as pgoutput skips
    them."""
    proto = proto_for(db)
    with db.connect(autocommit=True) as conn:
        captured = peek(conn, slot, pgoutput_options(
            proto, publication=publication, streaming="on" if streaming else "off",
            binary=binary, messages=False))
    pipeline = Pipeline(proto_version=proto)
    rec = FilteringRecorder(filters)
    pipeline.add(rec, output=MemoryOutput())
    if filters is not None:
        pipeline.change_filter = filters.as_change_filter()
    pipeline.startup()
    for item in captured:
        pipeline.feed(item.data, item.lsn)
    pipeline.shutdown()
    return changes_by_transaction(rec.events)


def subscriber(txns: list[list[Event]], keys: dict[str, tuple[str, ...]]) -> dict[str, set[Any]]:
    """The tables a subscriber would hold after applying the changes (rows as tuples of
    (column, text) pairs)."""
    tables: dict[str, dict[Any, dict[str, Any]]] = {}
    for txn in txns:
        for ev in txn:
            if ev[0] == "truncate":
                for name in ev[1]:
                    tables[name] = {}
                continue
            _, table, action, new, old, _ = ev
            rows = tables.setdefault(table, {})
            key = keys[table]

            def k(items: Any, key: tuple[str, ...] = key) -> Any:
                d = dict(items)
                return tuple(d[c] for c in key)

            if action in ("UPDATE", "DELETE"):
                rows.pop(k(old if old is not None else new), None)
            if action in ("INSERT", "UPDATE"):
                rows[k(new)] = dict(new)
    return {t: {tuple(sorted(r.items())) for r in rows.values()} for t, rows in tables.items()}


def rows(*dicts: dict[str, Any]) -> set[Any]:
    return {tuple(sorted((k, None if v is None else str(v)) for k, v in d.items()))
            for d in dicts}


def create_slot(db: Any, name: str) -> None:
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))


def workload_conn(db: Any) -> psycopg.Connection[Any]:
    conn = db.connect(autocommit=True)
    conn.execute("SET synchronous_commit = on")
    return conn
