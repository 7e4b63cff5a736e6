"""The glue to the wal2json emitter's C fast path, emitters/_wal2jsonrow.c (format version 2).

A formatter is made from a table's plan (``Rel``, relation.compile_relation) and the current
transaction's fields, so the C code prints from what the Python ``v2_change`` prints from.
A column whose converter has no C code leaves the whole table to Python.
tests/test_wal2json_native.py holds the two equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from emitters.wal2json.relation import (
    bool_value,
    bytea_value,
    number_string_value,
    number_value,
    string_value,
)
from emitters.wal2json.state import Converter, Rel, State

try:
    from emitters import _wal2jsonrow
except ImportError:  # installed without a C compiler: every object is formatted in Python
    _wal2jsonrow = None  # type: ignore[assignment]

__all__ = ["FAST_PATH_BUILT", "v2_row_format"]

FAST_PATH_BUILT: Final = _wal2jsonrow is not None
"""Whether the C module is built (``pip install`` compiles it where there is a compiler)."""

# relation.py's converters -> the C module's value codes
_CODES: Final[dict[Converter, int]] = {} if _wal2jsonrow is None else {
    string_value: _wal2jsonrow.STRING,
    number_value: _wal2jsonrow.NUMBER,
    number_string_value: _wal2jsonrow.NUMBER_STRING,
    bool_value: _wal2jsonrow.BOOL,
    bytea_value: _wal2jsonrow.BYTEA,
}


def v2_row_format(st: State, r: Rel) -> Callable[[bytes, int, Any], bytes | None] | None:
    """The C formatter of a table's v2 row objects in the current transaction (its
    ``line(data, lsn, txn)``), or None (no C module, or a converter it does not know)."""
    if _wal2jsonrow is None:
        return None
    if not all(col.convert in _CODES for col in r.cols):
        return None
    fields = st.txn_fields
    return _wal2jsonrow.RowFormat(
        r.relation.relation_id,
        (b'{"action":"I"' + fields, b'{"action":"U"' + fields, b'{"action":"D"' + fields),
        r.schema_table,
        tuple(col.v2_change[0] for col in r.cols), tuple(col.v2_change[1] for col in r.cols),
        tuple(col.v2_pk for col in r.cols), bytes(_CODES[col.convert] for col in r.cols),
        tuple(r.key), tuple(r.pk or ()),
        st.do_insert | st.do_update << 1 | st.do_delete << 2,
        st.include_lsn, st.include_pk, r.has_identity).line
