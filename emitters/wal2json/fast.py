"""The glue to the wal2json emitter's C fast path, emitters/wal2json/native/_wal2jsonrow.c.

A formatter is made from a table's plan (``Rel``, relation.compile_relation), so the C code
prints from what the Python ``v2_change`` and ``v1_change`` print from: format version 2's
for the current transaction's fields; format version 1's once per plan, with the document's
bookkeeping (the comma after the previous change, the parts of a document written at the
commit) here, as ``Wal2JsonEmitter.change`` does it. A column whose converter has no C code
leaves the whole table to Python. tests/emitters/test_wal2json_native.py holds the two equal.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any, Final, Literal

from emitters.wal2json.relation import (
    bool_value,
    bytea_value,
    number_string_value,
    number_value,
    string_value,
)
from emitters.wal2json.state import Converter, Rel, State
from plugin_framework import load_native

if TYPE_CHECKING:
    from emitters.wal2json.native import _wal2jsonrow
else:
    _wal2jsonrow = load_native("emitters.wal2json.native._wal2jsonrow")

__all__ = ["FAST_PATH_BUILT", "v1_row_format", "v2_row_format"]

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


def v2_row_format(st: State, r: Rel) -> _wal2jsonrow.RowFormat | None:
    """The C formatter of a table's v2 row objects in the current transaction (called as its
    ``line(data, lsn, txn)``; ``lines`` formats a run of messages in one call), or None (no
    C module, or a converter it does not know)."""
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
        st.include_lsn, st.include_pk, r.has_identity)


def v1_row_format(st: State, r: Rel
                  ) -> Callable[[bytes, int, Any], bytes | Literal[True] | None] | None:
    """The formatter of a table's v1 changes (docs/framework.md, "fast_change"): with
    write-in-chunks, a change's text as ``change`` emits it; otherwise True, the change added
    to the transaction's document (``st.v1_parts``), which the commit writes. None: no C
    module, or a converter it does not know."""
    if _wal2jsonrow is None:
        return None
    if not all(col.convert in _CODES for col in r.cols):
        return None
    ht, nl, sp, comma = st.ht, st.nl, st.sp, st.comma
    h3, h4 = ht * 3, ht * 4
    cols = r.cols
    pk, pk_comma = r.v1_pk_blocks if r.v1_pk else (b"", b"")
    pieces = (
        r.v1_columns_head, comma,
        (b"]," if r.v1_pk else b"]") + nl, b"]," + nl, pk, pk_comma,
        h3 + b'"oldkeys":' + sp + b"{" + nl + h4 + b'"keynames":' + sp + b"[",
        b"]," + nl + h4 + b'"keytypes":' + sp + b"[" if st.include_types else b"",
        b"]," + nl + h4 + b'"keytypeoids":' + sp + b"[" if st.include_type_oids else b"",
        b"]," + nl + h4 + b'"keyvalues":' + sp + b"[",
        b"]" + nl + h3 + b"}" + nl,
        ht + ht + b"}",
    )
    row_format = _wal2jsonrow.V1RowFormat(
        r.relation.relation_id,
        (r.v1_heads["insert"], r.v1_heads["update"], r.v1_heads["delete"]), pieces,
        tuple(c.name for c in cols), tuple(c.v1_type for c in cols),
        tuple(c.v1_oid for c in cols), bytes(_CODES[c.convert] for c in cols), tuple(r.key),
        st.do_insert | st.do_update << 1 | st.do_delete << 2, r.has_identity)
    # what goes before a change: v1_change's newline (the document's, not the chunks') and
    # the comma after the changes before it
    first = (b"" if st.chunks else nl) + ht + ht
    later = first + b","

    if st.chunks:
        body = row_format.line

        def chunk(data: bytes, lsn: int, txn: Any) -> bytes | None:
            text = body(data, lsn, txn)
            if text is None:
                return None
            st.nr_changes += 1
            return (later if st.nr_changes > 1 else first) + text
        return chunk

    return V1Parts(st, row_format.lines, first, later)


class V1Parts:
    """The formatter of a table's v1 changes for a document per transaction: each change's
    text is added to the document (``st.v1_parts``, written at the commit), so it writes no
    record. ``lines`` takes a run of changes in one call (no record for any of them)."""

    __slots__ = ("body", "first", "later", "st")

    def __init__(self, st: State, body: Callable[[list[bytes], int, int | list[int], Any],
                                                 tuple[list[bytes], int]],
                 first: bytes, later: bytes) -> None:
        """``body``: the C formatter's ``lines``, the changes' texts without what goes
        before each in the document (``first`` before the transaction's first change,
        ``later`` before the others)."""
        self.st, self.body, self.first, self.later = st, body, first, later

    def __call__(self, data: bytes, lsn: int, txn: Any) -> Literal[True] | None:
        return True if self.lines([data], 0, lsn, txn)[1] else None

    def lines(self, datas: list[bytes], start: int, lsn: int | list[int], txn: Any
              ) -> tuple[list[bytes], int]:
        """``__call__`` of ``datas[start]``, ``datas[start + 1]``, ...: no records, and the
        index of the first change it leaves to the change callback (``len(datas)`` if
        none)."""
        texts, end = self.body(datas, start, lsn, txn)
        if texts:
            st = self.st
            later = self.later
            if st.nr_changes == 0:
                st.v1_parts.append(self.first + texts[0])
                st.v1_parts.extend(map(later.__add__, islice(texts, 1, None)))
            else:
                st.v1_parts.extend(map(later.__add__, texts))
            st.nr_changes += len(texts)
        return [], end
