"""wal2json's format version 1: one JSON document per transaction (written whole at the commit,
or change by change with write-in-chunks), optionally pretty-printed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from emitters.wal2json.relation import binary_error, row_values, v1_columns_head
from emitters.wal2json.state import Rel, State, txn_origin_id, txn_timestamp
from plugin_framework import LSN, Action
from plugin_framework.framework import (
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    Row,
    Transaction,
)

log = logging.getLogger("pgdecode.wal2json")


def v1_begin(st: State, txn: Transaction) -> bytes:
    ht, nl, sp = st.ht, st.nl, st.sp
    out = b"{" + nl
    if st.include_xids:
        out += ht + b'"xid":' + sp + b"%d" % txn.xid + b"," + nl
    if st.include_lsn:
        out += (ht + b'"nextlsn":' + sp + b'"' + str(LSN(txn.end_lsn or 0)).encode() + b'",'
                + nl)
    if st.include_timestamp:
        out += ht + b'"timestamp":' + sp + b'"' + txn_timestamp(st, txn) + b'",' + nl
    if st.include_origin:
        out += ht + b'"origin":' + sp + b"%d" % txn_origin_id(st, txn) + b"," + nl
    return out + ht + b'"change":' + sp + b"["


def _v1_values(st: State, r: Rel, row: Row, indexes: Sequence[int], skip_nulls: bool
               ) -> tuple[list[int], list[bytes]]:
    """The columns printed and their values: unchanged TOAST is never printed, NULLs are left
    out of old keys."""
    kinds, raws = row.data.kinds, row.data.values
    cols = r.cols
    shown: list[int] = []
    out: list[bytes] = []
    for i in indexes:
        kind = kinds[i]
        if kind == KIND_TEXT:
            raw = raws[i]
            assert raw is not None
            out.append(cols[i].convert(raw))
        elif kind == KIND_NULL:
            if skip_nulls:
                continue
            out.append(b"null")
        elif kind == KIND_UNCHANGED_TOAST:
            continue
        else:
            raise binary_error(r.relation, i)
        shown.append(i)
    return shown, out


def _v1_oldkeys(st: State, r: Rel, row: Row, indexes: Sequence[int]) -> bytes:
    ht, nl, sp, comma = st.ht, st.nl, st.sp, st.comma
    h3, h4 = ht * 3, ht * 4
    shown, values = _v1_values(st, r, row, indexes, skip_nulls=True)
    cols = r.cols
    out = [h3, b'"oldkeys":', sp, b"{", nl,
           h4, b'"keynames":', sp, b"[", comma.join(cols[i].name for i in shown), b"],", nl]
    if st.include_types:
        out += [h4, b'"keytypes":', sp, b"[", comma.join(cols[i].v1_type for i in shown),
                b"],", nl]
    if st.include_type_oids:
        out += [h4, b'"keytypeoids":', sp, b"[", comma.join(cols[i].v1_oid for i in shown),
                b"],", nl]
    out += [h4, b'"keyvalues":', sp, b"[", comma.join(values), b"]", nl, h3, b"}", nl]
    return b"".join(out)


def v1_change(st: State, r: Rel, change: Any) -> bytes | None:
    action = change.action
    rel = r.relation
    new: Row | None = change.new
    old: Row | None = change.old
    if action is not Action.INSERT and not r.has_identity:
        log.warning('wal2json: table "%s" without primary key or replica identity is nothing',
                    rel.name)
        return None
    st.nr_changes += 1
    ht, nl = st.ht, st.nl
    parts: list[bytes] = []
    if not st.chunks:
        parts.append(nl)
    parts.append(ht + ht + b"," if st.nr_changes > 1 else ht + ht)
    if action is Action.INSERT:
        assert new is not None
        parts.append(r.v1_heads["insert"])
        parts.append(_v1_columns(st, r, new, addcomma=r.v1_pk))
        if r.v1_pk:
            parts.append(r.v1_pk_blocks[0])
    elif action is Action.UPDATE:
        assert new is not None
        parts.append(r.v1_heads["update"])
        parts.append(_v1_columns(st, r, new, addcomma=True))
        if r.v1_pk:
            parts.append(r.v1_pk_blocks[1])
        if old is None:
            parts.append(_v1_oldkeys(st, r, new, r.key))
        else:
            parts.append(_v1_oldkeys(st, r, old, range(len(r.cols))))
    else:
        assert old is not None
        parts.append(r.v1_heads["delete"])
        if r.v1_pk:
            parts.append(r.v1_pk_blocks[1])
        parts.append(_v1_oldkeys(st, r, old, r.key))
    parts.append(ht + ht + b"}")
    return b"".join(parts)


def _v1_columns(st: State, r: Rel, row: Row, addcomma: bool) -> bytes:
    values = row_values(r, row)
    if values is not None:
        head = r.v1_columns_head
    else:
        shown, values = _v1_values(st, r, row, range(len(r.cols)), skip_nulls=False)
        head = (r.v1_columns_head if len(shown) == len(r.cols)
                else v1_columns_head(st, [r.cols[i] for i in shown]))
    return b"".join((head, st.comma.join(values), b"]," if addcomma else b"]", st.nl))


def v1_message(st: State, transactional: bool, prefix_json: bytes, content: bytes) -> bytes:
    """A message: a change of the transaction's document, or a document of its own when it is
    not transactional."""
    ht, nl, sp = st.ht, st.nl, st.sp
    h3 = ht * 3
    if transactional:
        st.nr_changes += 1
    parts = []
    if not st.chunks and transactional:
        parts.append(nl)
    if not transactional:
        parts.append(b"{" + nl + ht + b'"change":' + sp + b"[" + nl)
    parts.append(ht + ht)
    # wal2json 2.5 also prints this comma before a non-transactional message, counting the
    # changes of the last transaction decoded before it
    if st.nr_changes > 1:
        parts.append(b",")
    parts += [b"{", nl, h3, b'"kind":', sp, b'"message",', nl,
              h3, b'"transactional":', sp, b"true," if transactional else b"false,", nl,
              h3, b'"prefix":', sp, prefix_json, b",", nl, h3, b'"content":', sp, content,
              nl, ht, ht, b"}"]
    if not transactional:
        parts += [nl, ht, b"]", nl, b"}"]
    return b"".join(parts)
