"""How the mirrors key a table's rows: by its replica identity, else by every column, and
then (``counted``) as a multiset of equal rows; keys compared across the batch's types and a
target's (``key_tuples``), and the copies of equal rows a batch takes away (``staying``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.columns.descriptions import TableInfo
from plugin_framework.spark.columns.types import column

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["counted", "first_rows", "key_names", "key_tuples", "same_keys", "staying"]


def key_names(info: TableInfo) -> list[str]:
    """The columns a table's rows are keyed by in a mirror: the replica identity, else all."""
    return list(info.key_columns) or [name for name, _, _ in info.columns]


def counted(info: TableInfo) -> bool:
    """Whether the mirrors hold the table as a multiset: its key is every column
    (REPLICA IDENTITY FULL, none, or a key of every column), so equal rows can only be
    counted (netchange.counted_net)."""
    return not info.primary and len(key_names(info)) == len(info.columns)


def same_keys(keys: Sequence[str], left: str, right: str) -> Any:
    """The join condition of two key column sets (``<prefix><key>``), NULLs equal."""
    from functools import reduce

    return reduce(lambda a, b: a & b,
                  [column(f"{left}{k}").eqNullSafe(column(f"{right}{k}")) for k in keys])


def first_rows(rows: pa.Table, names: Sequence[str]) -> dict[tuple[Any, ...], int]:
    """Each key (``key_tuples``) of ``rows`` with the index of its first row."""
    first: dict[tuple[Any, ...], int] = {}
    for i, key in enumerate(key_tuples(rows, names)):
        first.setdefault(key, i)
    return first


def key_tuples(rows: pa.Table, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """Each row's values of columns ``names``, comparable across the batch's types and a
    target's (timestamps as UTC microseconds, dates as days, lists as tuples; NULLs equal,
    as fill_from's join takes them)."""
    import pyarrow as pa

    columns = []
    for name in names:
        values = _comparable(rows.column(name)).to_pylist()
        dtype = rows.schema.field(name).type
        columns.append([_hashable(v) for v in values]
                       if pa.types.is_nested(dtype) or pa.types.is_floating(dtype) else values)
    return list(zip(*columns, strict=True)) if columns else [()] * rows.num_rows


def _hashable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"  # equal to every NaN, as PostgreSQL's float equality has it
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _comparable(values: pa.ChunkedArray) -> pa.ChunkedArray:
    import pyarrow as pa

    t = values.type
    if pa.types.is_timestamp(t):
        return values.cast(pa.timestamp(t.unit, "UTC") if t.tz else t).cast(pa.int64())
    if pa.types.is_date32(t):
        return values.cast(pa.int32())
    return values


def staying(base: pa.Table, changes: pa.Table, info: TableInfo) -> pa.Array:
    """Which rows of ``base`` (a target's, of a ``counted`` table) stay when ``changes``
    (its typed net changes) take their copies away: of equal rows, the first go. A copy the
    target does not have is not taken (as a key the target does not have)."""
    import pyarrow as pa

    names = key_names(info)
    gone: dict[tuple[Any, ...], int] = {}
    for key, deleted, copies in zip(key_tuples(changes, names),
                                    changes.column("_deleted").to_pylist(),
                                    changes.column("_copies").to_pylist(), strict=True):
        if deleted:
            gone[key] = gone.get(key, 0) + copies
    keep = []
    for key in key_tuples(base, names):
        left = gone.get(key, 0)
        if left:
            gone[key] = left - 1
        keep.append(not left)
    return pa.array(keep, pa.bool_())
