"""The json emitter's Debezium envelope (``-o envelope=debezium``): each line is the value of
the change event that Debezium's PostgreSQL connector (3.x, pgoutput, default settings)
publishes for the same change, as Kafka's JsonConverter writes it without schemas:

    {"before":null,"after":{"id":1,...},"source":{"version":...,"connector":"postgresql",
     "name":"PREFIX","ts_ms":...,"snapshot":"false","db":"shop","sequence":"[\"...\",\"...\"]",
     "ts_us":...,"ts_ns":...,"schema":"public","table":"items","txId":741,"lsn":24109040,
     "xmin":null,"origin":null,"origin_lsn":null},"transaction":null,"op":"c",
     "ts_ms":...,"ts_us":...,"ts_ns":...}

What Debezium does, this does: ``c``/``u``/``d`` per change, ``r`` for snapshot rows, ``t``
per truncated table, ``m`` per logical message; an UPDATE that changes the primary key is a
``d`` of the old key and a ``c`` of the new row; unchanged TOASTed values are a placeholder;
``source.sequence`` is the end of the last transaction seen and the change's LSN. Where it
differs, docs/json-format.md says so: no Kafka tombstones (a line has no key), columns of
types Debezium drops (name, pg_lsn...) kept as their text, and values Debezium cannot hold
(numeric NaN, infinite dates) an error unless ``unrepresentable=null``.
tests/emitters/test_debezium.py diffs these lines with Debezium's own events on the same WAL.
"""

from __future__ import annotations

import binascii
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import orjson

from emitters.json.debezium_values import (
    Converter,
    Unrepresentable,
    column_converter,
    placeholder_value,
)
from plugin_framework.framework import KIND_BINARY, KIND_NULL, KIND_TEXT, KIND_UNCHANGED_TOAST
from plugin_framework.pgtypes import TypeConverters

__all__ = ["DebeziumEnvelope"]

_dumps: Final = orjson.dumps
# Debezium's message key: the primary key, else the replica identity's index
_KEY: Final = (
    "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s "
    "AND a.attnum = ANY ((SELECT i.indkey FROM pg_catalog.pg_index i "
    "WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident) "
    "ORDER BY i.indisprimary DESC LIMIT 1)::int2[])")


def _version() -> str:
    try:
        return f"pgdecode {metadata.version('pgdecode')}"
    except metadata.PackageNotFoundError:
        return "pgdecode"


@dataclass(frozen=True)
class _Plan:
    """One relation description's columns, converters and primary key."""

    relation: Any
    names: tuple[str, ...]
    converters: tuple[Converter, ...]
    placeholders: tuple[Any, ...]
    key: tuple[int, ...]  # Debezium's message key (none: no primary key or identity index)


class DebeziumEnvelope:
    """One decoding context's Debezium events (the JsonEmitter delegates to it)."""

    def __init__(self, options: dict[str, Any], catalog: Any, slot: str | None) -> None:
        self.name = options["topic-prefix"] or slot or "pgdecode"
        self.placeholder: str = options["unavailable-value-placeholder"]
        self.null_unrepresentable = options["unrepresentable"] == "null"
        self.catalog = catalog
        self.database: str | None = options["database"]
        if self.database is None and catalog is not None:
            self.database = catalog.query("SELECT current_database()")[0][0]
        self.types = TypeConverters(catalog=catalog)
        self.version = _version()
        self.plans: dict[Any, _Plan] = {}
        # Debezium's state as it reads the stream: where the last transaction (or
        # non-transactional message) ended, and the last commit time it saw
        self.last_end: int | None = None
        self.commit_micros: int | None = None

    # -- per relation

    def plan(self, relation: Any) -> _Plan:
        plan = self.plans.get(relation)
        if plan is None:
            plan = self.plans[relation] = self._plan(relation)
        return plan

    def _plan(self, relation: Any) -> _Plan:
        columns = relation.columns
        names = tuple(c.name for c in columns)
        return _Plan(
            relation, names,
            tuple(column_converter(self.types, c.type_oid, c.type_name, c.type_modifier)
                  for c in columns),
            tuple(placeholder_value(self.types, c.type_oid, c.type_name, self.placeholder)
                  for c in columns),
            self._key(relation, names))

    def _key(self, relation: Any, names: tuple[str, ...]) -> tuple[int, ...]:
        """Debezium's message key: the primary key's columns, else the replica identity
        index's. A change of it makes an UPDATE a delete and a create. Without the catalog,
        the replica identity stands for it (under FULL, which flags every column: none)."""
        if self.catalog is not None:
            key = {row[0] for row in self.catalog.query(_KEY, (relation.relation_id,) * 2)}
            return tuple(i for i, name in enumerate(names) if name in key)
        if relation.replica_identity == "f":
            return ()
        return tuple(i for i, c in enumerate(relation.columns) if c.is_key)

    def _row(self, plan: _Plan, data: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        kinds, values = data.kinds, data.values
        for i, name in enumerate(plan.names):
            kind = kinds[i]
            if kind == KIND_TEXT:
                try:
                    out[name] = plan.converters[i](values[i])
                except Unrepresentable as exc:
                    if not self.null_unrepresentable:
                        raise ValueError(
                            f"{plan.relation.namespace}.{plan.relation.name}.{name}: {exc}. "
                            "Debezium's type for the column cannot hold it: change the value, "
                            "or give -o unrepresentable=null to send null as Debezium "
                            "does") from None
                    out[name] = None
            elif kind == KIND_NULL:
                out[name] = None
            elif kind == KIND_UNCHANGED_TOAST:
                out[name] = plan.placeholders[i]
            elif kind == KIND_BINARY:
                raise ValueError("the Debezium envelope converts the server's text of values: "
                                 "stream without --binary")
        return out

    # -- events

    def _source(self, txn: Any, lsn: int, schema: str, table: str) -> dict[str, Any]:
        micros = self.commit_micros
        last = "null" if self.last_end is None else f'"{self.last_end}"'
        xid = None if txn is None or txn.is_snapshot else txn.xid
        return {
            "version": self.version, "connector": "postgresql", "name": self.name,
            "ts_ms": None if micros is None else micros // 1000,
            "snapshot": "true" if txn is not None and txn.is_snapshot else "false",
            "db": self.database, "sequence": f'[{last},"{lsn}"]',
            "ts_us": micros, "ts_ns": None if micros is None else micros * 1000,
            "schema": schema, "table": table, "txId": xid, "lsn": lsn, "xmin": None,
            "origin": None if txn is None else txn.origin,
            "origin_lsn": None if txn is None or txn.origin_lsn is None
            else int(txn.origin_lsn),
        }

    def _event(self, before: Any, after: Any, source: dict[str, Any], op: str) -> bytes:
        now = time.time_ns()
        return _dumps({"before": before, "after": after, "source": source,
                       "transaction": None, "op": op, "ts_ms": now // 1_000_000,
                       "ts_us": now // 1000, "ts_ns": now})

    def begin(self, txn: Any) -> None:
        commit = txn.commit_time
        self.commit_micros = None if commit is None else (
            int(commit.timestamp()) * 1_000_000 + commit.microsecond)

    def commit(self, txn: Any) -> None:
        if txn.end_lsn is not None and not txn.is_snapshot:
            self.last_end = int(txn.end_lsn)

    def change(self, txn: Any, relation: Any, change: Any) -> list[bytes]:
        plan = self.plan(relation)
        source = self._source(txn, int(change.lsn), relation.namespace, relation.name)
        action = change.action
        if action == "INSERT":
            return [self._event(None, self._row(plan, change.new.data), source,
                                "r" if txn.is_snapshot else "c")]
        old = None if change.old is None else self._row(plan, change.old.data)
        if action == "DELETE":
            return [self._event(old, None, source, "d")]
        new = self._row(plan, change.new.data)
        if old is not None and plan.key and any(
                change.old.data.values[i] != change.new.data.values[i] for i in plan.key):
            return [self._event(old, None, source, "d"), self._event(None, new, source, "c")]
        return [self._event(old if not change.old_is_key else None, new, source, "u")]

    def truncate(self, txn: Any, relations: Any, lsn: int) -> list[bytes]:
        return [self._event(None, None, self._source(txn, lsn, r.namespace, r.name), "t")
                for r in relations]

    def message(self, txn: Any, lsn: int, prefix: str, content: bytes) -> bytes:
        if txn is None:
            self.last_end = lsn  # a message outside a transaction is complete at once
        return _dumps({"op": "m", "ts_ms": time.time_ns() // 1_000_000,
                       "source": self._source(txn, lsn, "", ""), "transaction": None,
                       "message": {"prefix": prefix, "content": binascii.b2a_base64(
                           content, newline=False).decode()}})
