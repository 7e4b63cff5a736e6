"""What the change builder needs of each Relation: its column names, converters, fixed
fields, and the C appender of its raw changes (changerows.py), made once per Relation
message."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Final

import orjson

from plugin_framework.pgtypes import TypeConverters
from plugin_framework.protocol import KIND_BINARY, KIND_NULL, KIND_TEXT, KIND_UNCHANGED_TOAST
from plugin_framework.spark.changes.changerows import change_rows

__all__ = ["EMPTY", "ArrowRowPlan", "PlanCache", "row_of", "text_of"]

_dumps: Final = orjson.dumps
_call: Final = operator.call
EMPTY: Final[list[str]] = []  # the unchanged TOAST names of most rows (shared: never modify)


class ArrowRowPlan:
    """What the change builder needs of one Relation to fill its Arrow columns: names,
    converters, its fixed fields."""

    __slots__ = ("all_text", "bconv", "descriptor", "fast", "key0", "key_idx", "key_names",
                 "names", "relation", "schema", "table", "tconv", "width")

    def __init__(self, relation: Any, types: Any) -> None:
        columns = relation.columns
        self.relation = relation
        self.names: tuple[str, ...] = tuple(c.name for c in columns)
        self.tconv = tuple(types.text(c.type_oid, c.type_name) for c in columns)
        self.bconv = tuple(types.binary(c.type_oid, c.type_name)[0] for c in columns)
        self.all_text = bytes([KIND_TEXT]) * len(columns)
        self.key_idx = tuple(i for i, c in enumerate(columns) if c.is_key)
        self.key_names = tuple(columns[i].name for i in self.key_idx)
        self.key0 = self.key_idx[0] if len(self.key_idx) == 1 else -1  # the usual single key
        self.width = len(columns)
        self.schema: str = relation.namespace
        self.table: str = relation.name
        self.descriptor = [{"name": c.name, "type": c.type_name, "type_oid": c.type_oid,
                            "key": c.is_key} for c in columns]
        # the C appender of raw changes (ChangeBuilder.raw_writer), None where not built
        self.fast = change_rows(relation.relation_id, self.names, self.tconv, self.key_idx,
                                EMPTY)


class PlanCache:
    """Per-relation plans, made once per Relation message (a new message, a new plan)."""

    def __init__(self, catalog: Any = None) -> None:
        self.types = TypeConverters(catalog=catalog)
        self._plans: dict[int, ArrowRowPlan] = {}

    def plan(self, relation: Any) -> ArrowRowPlan:
        plan = self._plans.get(relation.relation_id)
        if plan is None or plan.relation is not relation:
            plan = self._plans[relation.relation_id] = ArrowRowPlan(relation, self.types)
        return plan


def text_of(value: Any) -> bytes:
    """A converted value (binary format) as map text."""
    if isinstance(value, str):
        return value.encode()
    return _dumps(value)  # numbers, booleans, arrays, json: their JSON text


def row_of(plan: ArrowRowPlan, kinds: bytes, values: Sequence[bytes | None],
           columns: Sequence[int] | None = None
           ) -> tuple[Sequence[str], Sequence[bytes | None], dict[str, Any], list[str]]:
    """A tuple as (map keys, map text values, typed-value dict, unchanged TOAST names)."""
    if columns is None and kinds == plan.all_text:
        names = plan.names
        return names, values, dict(zip(names, map(_call, plan.tconv, values), strict=True)), []
    keys: list[str] = []
    texts: list[bytes | None] = []
    typed: dict[str, Any] = {}
    toast: list[str] = []
    names, tconv = plan.names, plan.tconv
    for i in (range(len(kinds)) if columns is None else columns):
        k = kinds[i]
        name = names[i]
        if k == KIND_TEXT:
            raw = values[i]
            assert raw is not None
            keys.append(name)
            texts.append(raw)
            typed[name] = tconv[i](raw)
        elif k == KIND_NULL:
            keys.append(name)
            texts.append(None)
            typed[name] = None
        elif k == KIND_BINARY:
            raw = values[i]
            assert raw is not None
            value = plan.bconv[i](raw)
            keys.append(name)
            texts.append(text_of(value))
            typed[name] = value
        elif k == KIND_UNCHANGED_TOAST:
            toast.append(name)
    return keys, texts, typed, toast
