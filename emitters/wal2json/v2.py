"""wal2json's format version 2: a JSON object per change, "B" and "C" objects for the
transaction boundaries."""

from __future__ import annotations

import logging
from typing import Any

from emitters.wal2json.relation import binary_error, escape_json, row_values
from emitters.wal2json.state import Rel, State
from plugin_framework import LSN, Action
from plugin_framework.framework import (
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    Relation,
    Row,
    Transaction,
    TruncateChange,
)

log = logging.getLogger("pgdecode.wal2json")


def v2_boundary(st: State, action: bytes, txn: Transaction, lsn: LSN | None) -> bytes:
    out = b'{"action":"' + action + b'"' + st.txn_fields
    if st.include_lsn:
        out += (b',"lsn":"' + str(LSN(lsn or 0)).encode() + b'","nextlsn":"'
                + str(LSN(txn.end_lsn or 0)).encode() + b'"')
    return out + b"}"


def v2_change(st: State, r: Rel, change: Any) -> bytes | None:
    action = change.action
    new: Row | None = change.new
    old: Row | None = change.old
    rel = r.relation
    if action is Action.INSERT:
        head = b'{"action":"I"'
    else:
        if old is None and not r.has_identity:
            log.warning('wal2json: no tuple identifier for %s in table "%s"."%s"',
                        action, rel.namespace, rel.name)
            return None
        head = b'{"action":"U"' if action is Action.UPDATE else b'{"action":"D"'
    parts = [head, st.txn_fields]
    if st.include_lsn:
        parts.append(b',"lsn":"' + str(change.lsn).encode() + b'"')
    parts.append(r.schema_table)
    cols = r.cols
    if new is not None:
        values = row_values(r, new)
        if values is not None:
            interleaved = [b""] * (2 * len(values) + 1)
            interleaved[::2] = r.v2_columns
            interleaved[1::2] = values
            parts += interleaved
        else:
            parts.append(b',"columns":[')
            kinds, raws = new.data.kinds, new.data.values
            sep = b""
            for i, col in enumerate(cols):
                kind = kinds[i]
                if kind == KIND_TEXT:
                    raw = raws[i]
                    assert raw is not None
                    value = col.convert(raw)
                elif kind == KIND_NULL:
                    value = b"null"
                elif kind == KIND_UNCHANGED_TOAST:
                    continue
                else:
                    raise binary_error(rel, i)
                before, after = col.v2_change
                parts += (sep, before, value, after)
                sep = b","
            parts.append(b"]")
    identity: Row | None = old
    if identity is None and action is Action.UPDATE:
        if r.key:
            identity = new  # the key did not change: wal2json takes it from the new row
        else:
            log.warning('wal2json: no old tuple data for UPDATE in table "%s"."%s"',
                        rel.namespace, rel.name)
    if identity is not None:
        parts.append(b',"identity":[')
        kinds, raws = identity.data.kinds, identity.data.values
        sep = b""
        for i in r.key:
            kind = kinds[i]
            if kind == KIND_TEXT:
                raw = raws[i]
                assert raw is not None
                value = cols[i].convert(raw)
            elif kind == KIND_NULL:
                value = b"null"
            elif kind == KIND_UNCHANGED_TOAST:
                continue
            else:
                raise binary_error(rel, i)
            parts += (sep, cols[i].v2_identity, value, b"}")
            sep = b","
        parts.append(b"]")
    if st.include_pk:
        parts.append(b',"pk":[')
        if r.pk is not None:
            source = old if old is not None else new
            assert source is not None
            kinds = source.data.kinds
            parts.append(b",".join(cols[i].v2_pk for i in r.pk
                                   if kinds[i] != KIND_UNCHANGED_TOAST))
        parts.append(b"]")
    parts.append(b"}")
    return b"".join(parts)


def v2_truncate(st: State, relation: Relation, change: TruncateChange) -> bytes:
    """A "T" object for one table of a TRUNCATE."""
    lsn = b',"lsn":"%s"' % str(change.lsn).encode() if st.include_lsn else b""
    schema = b',"schema":' + escape_json(relation.namespace) if st.include_schemas else b""
    return (b'{"action":"T"' + st.txn_fields + lsn + schema
            + b',"table":' + escape_json(relation.name) + b"}")


def v2_message(st: State, message_lsn: LSN, transactional: bool, prefix_json: bytes,
               content: bytes) -> bytes:
    """An "M" object: a non-transactional message has null transaction fields."""
    out = b'{"action":"M"'
    if transactional:
        out += st.txn_fields
    else:
        if st.include_xids:
            out += b',"xid":null'
        if st.include_timestamp:
            out += b',"timestamp":null'
        if st.include_origin:
            out += b',"origin":null'
    if st.include_lsn:
        out += b',"lsn":"%s"' % str(message_lsn).encode()
    out += (b',"transactional":true' if transactional else b',"transactional":false')
    return out + b',"prefix":' + prefix_json + b',"content":' + content + b"}"
