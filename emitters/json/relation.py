"""One relation's plan (names, converters, the bytes of its lines' fixed parts), and its rows
as JSON-ready objects."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Final

import orjson

from emitters.json.fast import row_format
from plugin_framework.framework import KIND_BINARY, KIND_NULL, KIND_TEXT, KIND_UNCHANGED_TOAST
from plugin_framework.pgtypes import TypeConverters

__all__ = ["JsonRelationPlan", "opaque_columns", "row", "row_mixed"]

_dumps: Final = orjson.dumps
_call: Final = operator.call

_IDENTITY: Final = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


class JsonRelationPlan:
    """What the json emitter computes once per relation description."""

    __slots__ = ("_fast_snapshot", "all_binary", "all_text", "bconv", "fast", "heads", "key_idx",
                 "names", "opaque", "relation_id", "tconv", "truncate_head")

    def __init__(self, relation: Any, types: TypeConverters) -> None:
        columns = relation.columns
        self.relation_id = relation.relation_id
        self.names = tuple(c.name for c in columns)
        self.tconv = tuple(types.text(c.type_oid, c.type_name) for c in columns)
        binary = [types.binary(c.type_oid, c.type_name) for c in columns]
        self.bconv = tuple(b[0] for b in binary)
        self.opaque = tuple(i for i, b in enumerate(binary) if b[1])
        self.all_text = bytes([KIND_TEXT]) * len(columns)
        self.all_binary = bytes([KIND_BINARY]) * len(columns)
        self.key_idx = tuple(i for i, c in enumerate(columns) if c.is_key)
        where = _dumps({"schema": relation.namespace, "table": relation.name})[1:-1]
        key = (b',"key":' + _dumps([c.name for c in columns if c.is_key])
               + b',"identity":"'
               + _IDENTITY.get(relation.replica_identity, "default").encode() + b'"')
        # (before the LSN, after the transaction's fields) for each action
        self.heads = {action: (b'{"op":"' + action.lower().encode() + b'",' + where, key)
                      for action in ("INSERT", "UPDATE", "DELETE", "SNAPSHOT")}
        self.truncate_head = b'{"op":"truncate",' + where
        self.fast = self._format("INSERT")
        self._fast_snapshot: Any = None

    def _format(self, insert: str) -> Any:
        """The C formatter, with ``insert``'s head for inserts."""
        return row_format(
            self.relation_id,
            tuple(part for action in (insert, "UPDATE", "DELETE") for part in self.heads[action]),
            self.names, self.tconv, self.key_idx)

    def fast_snapshot(self) -> Any:
        """The C formatter of a snapshot transaction's rows (inserts: op snapshot)."""
        if self._fast_snapshot is None:
            self._fast_snapshot = self._format("SNAPSHOT")
        return self._fast_snapshot


_NO_TOAST: Final[list[str]] = []


def row(plan: JsonRelationPlan, data: Any) -> tuple[dict[str, Any], list[str]]:
    """A tuple as {column: value}, and the names of its unchanged TOAST columns (left out).
    The list returned for a row without any is shared: never modify it."""
    kinds, values = data.kinds, data.values
    if kinds == plan.all_text:
        return dict(zip(plan.names, map(_call, plan.tconv, values), strict=True)), _NO_TOAST
    if kinds == plan.all_binary:
        return dict(zip(plan.names, map(_call, plan.bconv, values), strict=True)), _NO_TOAST
    return row_mixed(plan, kinds, values, range(len(kinds)))


def row_mixed(plan: JsonRelationPlan, kinds: bytes, values: Sequence[Any],
              columns: Sequence[int]) -> tuple[dict[str, Any], list[str]]:
    """The ``columns`` of a tuple whose values are not all in one format."""
    out: dict[str, Any] = {}
    toast: list[str] = []
    names, tconv, bconv = plan.names, plan.tconv, plan.bconv
    for i in columns:
        k = kinds[i]
        if k == KIND_TEXT:
            out[names[i]] = tconv[i](values[i])
        elif k == KIND_NULL:
            out[names[i]] = None
        elif k == KIND_BINARY:
            out[names[i]] = bconv[i](values[i])
        elif k == KIND_UNCHANGED_TOAST:
            toast.append(names[i])
    return out, toast


def opaque_columns(plan: JsonRelationPlan, *rows: Any) -> list[str]:
    """The columns of types pgdecode cannot render that came in binary format in ``rows``."""
    found = []
    for i in plan.opaque:
        if any(r is not None and r.data.kinds[i] == KIND_BINARY for r in rows):
            found.append(plan.names[i])
    return found
