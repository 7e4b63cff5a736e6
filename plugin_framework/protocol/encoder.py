"""Encoding of typed messages back to pgoutput bytes: the inverse of the Decoder.

``encode(decode(data)) == data`` for everything a server sends. A message's ``xid`` is written
when set, which is exactly when the server sends it (inside a stream block).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from plugin_framework.protocol.messages import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    RelationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)
from plugin_framework.protocol.pgtime import to_pg_micros
from plugin_framework.protocol.tags import MessageTag

_pack = struct.pack

# Each tag as the one byte that starts its message.
_BEGIN = bytes((MessageTag.BEGIN,))
_COMMIT = bytes((MessageTag.COMMIT,))
_ORIGIN = bytes((MessageTag.ORIGIN,))
_RELATION = bytes((MessageTag.RELATION,))
_TYPE = bytes((MessageTag.TYPE,))
_INSERT = bytes((MessageTag.INSERT,))
_UPDATE = bytes((MessageTag.UPDATE,))
_DELETE = bytes((MessageTag.DELETE,))
_TRUNCATE = bytes((MessageTag.TRUNCATE,))
_MESSAGE = bytes((MessageTag.MESSAGE,))
_BEGIN_PREPARE = bytes((MessageTag.BEGIN_PREPARE,))
_PREPARE = bytes((MessageTag.PREPARE,))
_COMMIT_PREPARED = bytes((MessageTag.COMMIT_PREPARED,))
_ROLLBACK_PREPARED = bytes((MessageTag.ROLLBACK_PREPARED,))
_STREAM_START = bytes((MessageTag.STREAM_START,))
_STREAM_STOP = bytes((MessageTag.STREAM_STOP,))
_STREAM_COMMIT = bytes((MessageTag.STREAM_COMMIT,))
_STREAM_ABORT = bytes((MessageTag.STREAM_ABORT,))
_STREAM_PREPARE = bytes((MessageTag.STREAM_PREPARE,))


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else _pack(">I", xid)


def _string(text: str) -> bytes:
    raw = text.encode()
    if b"\0" in raw:
        raise ValueError(f"string {text!r} contains a NUL byte, which the protocol cannot carry")
    return raw + b"\0"


def encode_tuple(row: TupleData) -> bytes:
    if len(row.kinds) != len(row.values):
        raise ValueError("TupleData kinds and values differ in length")
    parts = [_pack(">H", len(row.kinds))]
    for kind, value in zip(row.kinds, row.values, strict=True):
        if kind == KIND_TEXT or kind == KIND_BINARY:
            if value is None:
                raise ValueError(f"column kind {chr(kind)!r} needs a value")
            parts.append(_pack(">BI", kind, len(value)))
            parts.append(value)
        elif kind == KIND_NULL or kind == KIND_UNCHANGED_TOAST:
            parts.append(bytes((kind,)))
        else:
            raise ValueError(f"unknown column kind {kind!r}")
    return b"".join(parts)


def _before(key: TupleData | None, old: TupleData | None) -> bytes:
    if key is not None and old is not None:
        raise ValueError("a change carries an old key or an old tuple, not both")
    if key is not None:
        return b"K" + encode_tuple(key)
    if old is not None:
        return b"O" + encode_tuple(old)
    return b""


def _begin(m: Begin) -> bytes:
    return _pack(">cQqI", _BEGIN, m.final_lsn, to_pg_micros(m.commit_time), m.xid)


def _commit(m: Commit) -> bytes:
    return _pack(">cBQQq", _COMMIT, 0, m.commit_lsn, m.end_lsn, to_pg_micros(m.commit_time))


def _origin(m: Origin) -> bytes:
    return _pack(">cQ", _ORIGIN, m.origin_lsn) + _string(m.name)


def _relation(m: RelationMessage) -> bytes:
    parts = [
        _RELATION, _xid(m.xid), _pack(">I", m.relation_id), _string(m.namespace), _string(m.name),
        _pack(">cH", m.replica_identity.encode(), len(m.columns)),
    ]
    for col in m.columns:
        parts += [
            _pack(">B", 1 if col.is_key else 0), _string(col.name),
            _pack(">Ii", col.type_oid, col.type_modifier),
        ]
    return b"".join(parts)


def _type(m: Type) -> bytes:
    return (
        _TYPE + _xid(m.xid) + _pack(">I", m.type_oid) + _string(m.namespace) + _string(m.name)
    )


def _insert(m: Insert) -> bytes:
    return _INSERT + _xid(m.xid) + _pack(">Ic", m.relation_id, b"N") + encode_tuple(m.new)


def _update(m: Update) -> bytes:
    return (
        _UPDATE + _xid(m.xid) + _pack(">I", m.relation_id) + _before(m.key, m.old)
        + b"N" + encode_tuple(m.new)
    )


def _delete(m: Delete) -> bytes:
    before = _before(m.key, m.old)
    if not before:
        raise ValueError("a Delete needs an old key or an old tuple")
    return _DELETE + _xid(m.xid) + _pack(">I", m.relation_id) + before


def _truncate(m: Truncate) -> bytes:
    flags = (1 if m.cascade else 0) | (2 if m.restart_identity else 0)
    n = len(m.relation_ids)
    return _TRUNCATE + _xid(m.xid) + _pack(f">IB{n}I", n, flags, *m.relation_ids)


def _message(m: LogicalMessage) -> bytes:
    return (
        _MESSAGE + _xid(m.xid) + _pack(">BQ", 1 if m.transactional else 0, m.lsn)
        + _string(m.prefix) + _pack(">I", len(m.content)) + bytes(m.content)
    )


def _stream_start(m: StreamStart) -> bytes:
    return _pack(">cIB", _STREAM_START, m.xid, 1 if m.first_segment else 0)


def _stream_stop(m: StreamStop) -> bytes:
    return _STREAM_STOP


def _stream_commit(m: StreamCommit) -> bytes:
    return _pack(
        ">cIBQQq", _STREAM_COMMIT, m.xid, 0, m.commit_lsn, m.end_lsn, to_pg_micros(m.commit_time)
    )


def _stream_abort(m: StreamAbort) -> bytes:
    head = _pack(">cII", _STREAM_ABORT, m.xid, m.subxid)
    if m.abort_lsn is None and m.abort_time is None:
        return head
    if m.abort_lsn is None or m.abort_time is None:
        raise ValueError("Stream Abort carries both abort_lsn and abort_time, or neither")
    return head + _pack(">Qq", m.abort_lsn, to_pg_micros(m.abort_time))


def _prepare_like(tag: bytes, flags: bool, m: BeginPrepare | Prepare | CommitPrepared
                  | StreamPrepare) -> bytes:
    if isinstance(m, CommitPrepared):
        lsn, at = m.commit_lsn, m.commit_time
    else:
        lsn, at = m.prepare_lsn, m.prepare_time
    head = tag + (b"\0" if flags else b"")
    return head + _pack(">QQqI", lsn, m.end_lsn, to_pg_micros(at), m.xid) + _string(m.gid)


def _rollback_prepared(m: RollbackPrepared) -> bytes:
    return _pack(
        ">cBQQqqI", _ROLLBACK_PREPARED, 0, m.prepare_end_lsn, m.rollback_end_lsn,
        to_pg_micros(m.prepare_time), to_pg_micros(m.rollback_time), m.xid,
    ) + _string(m.gid)


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    Begin: _begin,
    Commit: _commit,
    Origin: _origin,
    RelationMessage: _relation,
    Type: _type,
    Insert: _insert,
    Update: _update,
    Delete: _delete,
    Truncate: _truncate,
    LogicalMessage: _message,
    StreamStart: _stream_start,
    StreamStop: _stream_stop,
    StreamCommit: _stream_commit,
    StreamAbort: _stream_abort,
    BeginPrepare: lambda m: _prepare_like(_BEGIN_PREPARE, False, m),
    Prepare: lambda m: _prepare_like(_PREPARE, True, m),
    CommitPrepared: lambda m: _prepare_like(_COMMIT_PREPARED, True, m),
    StreamPrepare: lambda m: _prepare_like(_STREAM_PREPARE, True, m),
    RollbackPrepared: _rollback_prepared,
}


def encode(message: Message) -> bytes:
    """The pgoutput bytes of a message."""
    try:
        encoder = _ENCODERS[type(message)]
    except KeyError:
        raise TypeError(f"not a pgoutput message: {type(message).__name__}") from None
    return encoder(message)
