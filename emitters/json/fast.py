"""The glue to the json emitter's C fast path, emitters/json/native/_jsonrow.c.

A column is formatted in C when its text converter declares a native code in
``plugin_framework.pgtypes.NATIVE_KIND``; any other converter the C code calls. Nothing here
looks at which Python function a converter is: a converter without a declaration is simply
called, and tests/emitters/test_json_native.py holds each declared code equal to its converter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import orjson

from plugin_framework import load_native
from plugin_framework.pgtypes import Converter, native_codes

if TYPE_CHECKING:
    from emitters.json.native import _jsonrow
else:
    _jsonrow = load_native("emitters.json.native._jsonrow")

__all__ = ["FAST_PATH_BUILT", "native_code", "row_format"]

FAST_PATH_BUILT: Final = _jsonrow is not None
"""Whether the C module is built (``pip install`` compiles it where there is a compiler)."""

_dumps: Final = orjson.dumps

_code: Final[Callable[[Converter], int] | None] = (
    None if _jsonrow is None else native_codes(_jsonrow))


def native_code(conv: Converter) -> int:
    """How emitters.json.native._jsonrow converts a column whose text converter is ``conv``:
    by the code the converter declares, else by calling ``conv`` (PYCALL)."""
    assert _code is not None
    return _code(conv)


def row_format(relation_id: int, heads: tuple[bytes, ...], names: Sequence[str],
               converters: tuple[Converter, ...], key_idx: tuple[int, ...],
               ) -> _jsonrow.RowFormat | None:
    """The C formatter of one relation's row-change lines (called as its ``line(data, lsn,
    txn)``; ``lines`` formats a run of messages in one call), or None without the C
    module."""
    if _jsonrow is None:
        return None
    return _jsonrow.RowFormat(
        relation_id, heads, tuple(_dumps(name) for name in names),
        bytes(map(native_code, converters)), converters, key_idx, _dumps)
