"""The glue to the change builder's C fast path, plugin_framework/spark/changes/
native/_changerows.c.

A ``ChangeRows`` appends a raw row-change message to a ``ChangeBuilder``'s column lists as
``ChangeBuilder.add_change`` would append the decoded change (tests/spark/test_spark_changerows.py
holds them equal). A column's JSON value is made in C when its text converter declares a
native code in ``plugin_framework.pgtypes.NATIVE_KIND`` (the json emitter's C values, shared
through ``pgtypes/native/_jsonvalue.h``); any other converter the C code calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import orjson

from plugin_framework._native import load_native
from plugin_framework.pgtypes import Converter, native_codes

if TYPE_CHECKING:
    from plugin_framework.spark.changes.native import _changerows
else:
    _changerows = load_native("plugin_framework.spark.changes.native._changerows")

__all__ = ["FAST_PATH_BUILT", "change_rows"]

FAST_PATH_BUILT: Final = _changerows is not None
"""Whether the C module is built (``pip install`` compiles it where there is a compiler)."""

_dumps: Final = orjson.dumps

# How the C module converts a column whose text converter is ``conv`` (pgtypes.native_codes)
_code: Final[Callable[[Converter], int] | None] = (
    None if _changerows is None else native_codes(_changerows))


def change_rows(relation_id: int, names: Sequence[str], converters: tuple[Converter, ...],
                key_idx: tuple[int, ...], empty: list[str]) -> _changerows.ChangeRows | None:
    """The C appender of one relation description's changes (``empty``: the list a row
    without unchanged TOAST values gets, shared), or None without the C module."""
    if _changerows is None or _code is None:
        return None
    return _changerows.ChangeRows(
        relation_id, tuple(names), tuple(_dumps(name) for name in names),
        bytes(map(_code, converters)), converters, key_idx, _dumps, empty)
