"""Decoding of pgoutput messages: bytes in, typed messages out. No I/O.

One ``Decoder`` per replication stream: it knows the negotiated protocol version and whether it
is inside a stream block (Stream Start .. Stream Stop), because only there do the change
messages carry a transaction id.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import datetime
from typing import Final

from plugin_framework._frozen import frozen_setters, new_object
from plugin_framework.protocol.errors import (
    InvalidFieldError,
    ProtocolError,
    TruncatedMessageError,
    UnexpectedMessageError,
    UnknownMessageTypeError,
)
from plugin_framework.protocol.lsn import LSN
from plugin_framework.protocol.messages import (
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
    RelationColumn,
    RelationMessage,
    ReplicaIdentity,
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
from plugin_framework.protocol.pgtime import from_pg_micros
from plugin_framework.protocol.tags import STREAMING_TAGS, MessageTag
from plugin_framework.protocol.tuples import read_tuple as _read_tuple
from plugin_framework.protocol.tuples import show as _show
from plugin_framework.protocol.tuples import truncated as _truncated

MIN_PROTO_VERSION: Final = 1
MAX_PROTO_VERSION: Final = 4

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_BEGIN = struct.Struct(">QqI")  # final lsn, commit time, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit lsn, end lsn, commit time
_STREAM_COMMIT = struct.Struct(">IBQQq")  # xid, flags, commit lsn, end lsn, commit time
_STREAM_START = struct.Struct(">IB")  # xid, first segment
_STREAM_ABORT = struct.Struct(">II")  # xid, subxid
_ABORT_INFO = struct.Struct(">Qq")  # abort lsn, abort time
_PREPARE_HEAD = struct.Struct(">QQqI")  # prepare lsn, end lsn, prepare time, xid
_FLAGGED_PREPARE_HEAD = struct.Struct(">BQQqI")  # flags + the above
_ROLLBACK_HEAD = struct.Struct(">BQQqqI")  # flags, prepare end, rollback end, 2 times, xid
_MESSAGE_HEAD = struct.Struct(">BQ")  # flags, lsn
_TRUNCATE_HEAD = struct.Struct(">IB")  # nrelids, flags
_COLUMN_TAIL = struct.Struct(">Ii")  # type oid, typmod

_MESSAGE_TRANSACTIONAL: Final = 1
_TRUNCATE_CASCADE: Final = 1
_TRUNCATE_RESTART_SEQS: Final = 2
_COLUMN_IS_KEY: Final = 1
_REPLICA_IDENTITIES: Final = frozenset("dnfi")

_Reader = Callable[[bytes], Message]
_NO_XID: Final = (None, 1)  # (xid, offset after it) of a change message outside a stream


class Decoder:
    """Decodes the pgoutput messages of one replication stream, in order."""

    __slots__ = ("_readers", "in_stream", "proto_version")

    def __init__(self, proto_version: int = MAX_PROTO_VERSION) -> None:
        if not MIN_PROTO_VERSION <= proto_version <= MAX_PROTO_VERSION:
            raise ValueError(
                f"proto_version {proto_version} is not supported: pgoutput speaks versions "
                f"{MIN_PROTO_VERSION} to {MAX_PROTO_VERSION}"
            )
        self.proto_version = proto_version
        self.in_stream = False
        # Keyed by plain ints, not MessageTag members: a lookup with data[0] then finds its
        # key by identity (small ints are cached) without calling IntEnum's __eq__.
        self._readers: dict[int, _Reader] = {
            int(tag): reader for tag, reader in (
                (MessageTag.BEGIN, self._begin),
                (MessageTag.COMMIT, self._commit),
                (MessageTag.ORIGIN, self._origin),
                (MessageTag.RELATION, self._relation),
                (MessageTag.TYPE, self._type),
                (MessageTag.INSERT, self._insert),
                (MessageTag.UPDATE, self._update),
                (MessageTag.DELETE, self._delete),
                (MessageTag.TRUNCATE, self._truncate),
                (MessageTag.MESSAGE, self._message),
                (MessageTag.BEGIN_PREPARE, self._begin_prepare),
                (MessageTag.PREPARE, self._prepare),
                (MessageTag.COMMIT_PREPARED, self._commit_prepared),
                (MessageTag.ROLLBACK_PREPARED, self._rollback_prepared),
            )
        }
        if proto_version >= 2:
            # Stream Prepare belongs to protocol 3, but through the SQL interface a slot with
            # two_phase sends it to any streaming version, as it sends Begin Prepare and
            # friends to version 1.
            self._readers.update({
                int(tag): reader for tag, reader in (
                    (MessageTag.STREAM_START, self._stream_start),
                    (MessageTag.STREAM_STOP, self._stream_stop),
                    (MessageTag.STREAM_COMMIT, self._stream_commit),
                    (MessageTag.STREAM_ABORT, self._stream_abort),
                    (MessageTag.STREAM_PREPARE, self._stream_prepare),
                )
            })

    def decode(self, data: bytes | bytearray | memoryview) -> Message:
        """Decode exactly one message; raise a ProtocolError for anything malformed."""
        if type(data) is not bytes:
            data = bytes(data)
        try:
            reader = self._readers[data[0]]
        except IndexError:
            raise TruncatedMessageError("empty message: no type byte", 0) from None
        except KeyError:
            raise _unknown_type(data[0], self.proto_version) from None
        return reader(data)

    # --- transaction control ----------------------------------------------------------------

    def _outside_stream(self, data: bytes) -> None:
        if self.in_stream:
            raise UnexpectedMessageError(
                "transaction control message inside a stream block (Stream Stop missing)",
                0, chr(data[0]),
            )

    def _begin(self, data: bytes) -> Begin:
        self._outside_stream(data)
        final_lsn, commit_time, xid = _fixed(_BEGIN, data)
        _nonzero(final_lsn, "final_lsn", 1, data)
        return Begin(LSN(final_lsn), _time(commit_time, 9, data), xid)

    def _commit(self, data: bytes) -> Commit:
        self._outside_stream(data)
        flags, commit_lsn, end_lsn, commit_time = _fixed(_COMMIT, data)
        _zero_flags(flags, data)
        return Commit(LSN(commit_lsn), LSN(end_lsn), _time(commit_time, 18, data))

    def _origin(self, data: bytes) -> Origin:
        if len(data) < 9:
            raise _truncated(data, "origin LSN")
        name, pos = _string(data, 9, "origin name")
        _end(data, pos)
        return Origin(LSN(_U64.unpack_from(data, 1)[0]), name)

    def _begin_prepare(self, data: bytes) -> BeginPrepare:
        self._outside_stream(data)
        lsn, end_lsn, at, xid, gid = _prepare_fields(data, 1, _PREPARE_HEAD)
        return BeginPrepare(lsn, end_lsn, at, xid, gid)

    def _prepare(self, data: bytes) -> Prepare:
        self._outside_stream(data)
        lsn, end_lsn, at, xid, gid = _prepare_fields(data, 1, _FLAGGED_PREPARE_HEAD)
        return Prepare(lsn, end_lsn, at, xid, gid)

    def _commit_prepared(self, data: bytes) -> CommitPrepared:
        self._outside_stream(data)
        lsn, end_lsn, at, xid, gid = _prepare_fields(data, 1, _FLAGGED_PREPARE_HEAD)
        return CommitPrepared(lsn, end_lsn, at, xid, gid)

    def _stream_prepare(self, data: bytes) -> StreamPrepare:
        self._outside_stream(data)
        lsn, end_lsn, at, xid, gid = _prepare_fields(data, 1, _FLAGGED_PREPARE_HEAD)
        return StreamPrepare(lsn, end_lsn, at, xid, gid)

    def _rollback_prepared(self, data: bytes) -> RollbackPrepared:
        self._outside_stream(data)
        size = 1 + _ROLLBACK_HEAD.size
        if len(data) < size:
            raise _truncated(data, "fixed fields")
        flags, prep_end, rb_end, prep_time, rb_time, xid = _ROLLBACK_HEAD.unpack_from(data, 1)
        _zero_flags(flags, data)
        _nonzero(prep_end, "prepare_end_lsn", 2, data)
        _nonzero(rb_end, "rollback_end_lsn", 10, data)
        gid, pos = _string(data, size, "gid")
        _end(data, pos)
        return RollbackPrepared(
            LSN(prep_end), LSN(rb_end), _time(prep_time, 18, data), _time(rb_time, 26, data),
            xid, gid,
        )

    # --- streaming --------------------------------------------------------------------------

    def _stream_start(self, data: bytes) -> StreamStart:
        if self.in_stream:
            raise UnexpectedMessageError("Stream Start inside a stream block", 0,
                                         MessageTag.STREAM_START.char)
        xid, first = _fixed(_STREAM_START, data)
        if first > 1:
            raise InvalidFieldError(f"first-segment flag is {first}, expected 0 or 1", 5,
                                    MessageTag.STREAM_START.char)
        self.in_stream = True
        return StreamStart(xid, bool(first))

    def _stream_stop(self, data: bytes) -> StreamStop:
        if not self.in_stream:
            raise UnexpectedMessageError("Stream Stop outside a stream block", 0,
                                         MessageTag.STREAM_STOP.char)
        _end(data, 1)
        self.in_stream = False
        return StreamStop()

    def _stream_commit(self, data: bytes) -> StreamCommit:
        self._outside_stream(data)
        xid, flags, commit_lsn, end_lsn, commit_time = _fixed(_STREAM_COMMIT, data)
        if flags:
            raise InvalidFieldError(f"unrecognized flags {flags}, expected 0", 5,
                                    MessageTag.STREAM_COMMIT.char)
        return StreamCommit(xid, LSN(commit_lsn), LSN(end_lsn), _time(commit_time, 22, data))

    def _stream_abort(self, data: bytes) -> StreamAbort:
        self._outside_stream(data)
        short = 1 + _STREAM_ABORT.size
        if len(data) == short:
            xid, subxid = _STREAM_ABORT.unpack_from(data, 1)
            return StreamAbort(xid, subxid)
        if len(data) == short + _ABORT_INFO.size and self.proto_version >= 4:
            xid, subxid = _STREAM_ABORT.unpack_from(data, 1)
            abort_lsn, abort_time = _ABORT_INFO.unpack_from(data, short)
            return StreamAbort(xid, subxid, LSN(abort_lsn), _time(abort_time, short + 8, data))
        expected = f"{short} or {short + _ABORT_INFO.size}" if self.proto_version >= 4 else short
        if len(data) < short:
            raise _truncated(data, "xid and subxid")
        raise InvalidFieldError(
            f"Stream Abort is {len(data)} bytes, expected {expected} "
            f"for protocol version {self.proto_version}",
            short, MessageTag.STREAM_ABORT.char,
        )

    # --- catalog ----------------------------------------------------------------------------

    def _relation(self, data: bytes) -> RelationMessage:
        xid, pos = self._xid(data)
        if len(data) < pos + 4:
            raise _truncated(data, "relation id")
        relid = _U32.unpack_from(data, pos)[0]
        namespace, pos = _string(data, pos + 4, "namespace")
        name, pos = _string(data, pos, "relation name")
        if len(data) < pos + 3:
            raise _truncated(data, "replica identity and column count")
        identity = chr(data[pos])
        if identity not in _REPLICA_IDENTITIES:
            raise InvalidFieldError(
                f"unknown replica identity {identity!r}, expected one of d, n, f, i", pos,
                MessageTag.RELATION.char,
            )
        ncols = _U16.unpack_from(data, pos + 1)[0]
        pos += 3
        columns = []
        for i in range(ncols):
            if len(data) <= pos:
                raise _truncated(data, f"flags of column {i}")
            flags = data[pos]
            if flags & ~_COLUMN_IS_KEY:
                raise InvalidFieldError(f"unrecognized flags {flags} of column {i}", pos,
                                        MessageTag.RELATION.char)
            colname, pos = _string(data, pos + 1, f"name of column {i}")
            if len(data) < pos + 8:
                raise _truncated(data, f"type of column {i}")
            type_oid, typmod = _COLUMN_TAIL.unpack_from(data, pos)
            pos += 8
            columns.append(RelationColumn(bool(flags), colname, type_oid, typmod))
        _end(data, pos)
        replica_identity: ReplicaIdentity = identity  # type: ignore[assignment]
        return RelationMessage(relid, namespace, name, replica_identity, tuple(columns), xid)

    def _type(self, data: bytes) -> Type:
        xid, pos = self._xid(data)
        if len(data) < pos + 4:
            raise _truncated(data, "type oid")
        type_oid = _U32.unpack_from(data, pos)[0]
        namespace, pos = _string(data, pos + 4, "namespace")
        name, pos = _string(data, pos, "type name")
        _end(data, pos)
        return Type(type_oid, namespace, name, xid)

    # --- changes ----------------------------------------------------------------------------

    def _xid(self, data: bytes) -> tuple[int | None, int]:
        if not self.in_stream:
            return None, 1
        if len(data) < 5:
            raise _truncated(data, "transaction id")
        return _U32.unpack_from(data, 1)[0], 5

    def _insert(self, data: bytes) -> Insert:
        xid, pos = self._xid(data) if self.in_stream else _NO_XID
        if len(data) < pos + 5:
            raise _truncated(data, "relation id and tuple marker")
        if data[pos + 4] != 0x4E:  # 'N'
            raise InvalidFieldError(
                f"expected new tuple 'N', got {_show(data[pos + 4])}", pos + 4,
                MessageTag.INSERT.char,
            )
        new, end = _read_tuple(data, pos + 5)
        if end != len(data):
            raise _trailing(data, end)
        return _make_insert(_U32.unpack_from(data, pos)[0], new, xid)

    def _update(self, data: bytes) -> Update:
        xid, pos = self._xid(data) if self.in_stream else _NO_XID
        if len(data) < pos + 5:
            raise _truncated(data, "relation id and tuple marker")
        relid = _U32.unpack_from(data, pos)[0]
        pos += 4
        marker = data[pos]
        key = old = None
        if marker == 0x4B or marker == 0x4F:  # 'K' or 'O'
            before, pos = _read_tuple(data, pos + 1)
            if marker == 0x4B:
                key = before
            else:
                old = before
            if len(data) <= pos:
                raise _truncated(data, "new tuple marker")
            marker = data[pos]
            if marker == 0x4B or marker == 0x4F:
                raise InvalidFieldError(
                    "old key and old tuple both present: expected 'N' after the first", pos,
                    MessageTag.UPDATE.char,
                )
        if marker != 0x4E:
            raise InvalidFieldError(
                f"expected 'K', 'O' or 'N', got {_show(marker)}", pos, MessageTag.UPDATE.char
            )
        new, end = _read_tuple(data, pos + 1)
        if end != len(data):
            raise _trailing(data, end)
        return _make_update(relid, new, key, old, xid)

    def _delete(self, data: bytes) -> Delete:
        xid, pos = self._xid(data) if self.in_stream else _NO_XID
        if len(data) < pos + 5:
            raise _truncated(data, "relation id and tuple marker")
        marker = data[pos + 4]
        if marker != 0x4B and marker != 0x4F:
            raise InvalidFieldError(f"expected 'K' or 'O', got {_show(marker)}", pos + 4,
                                    MessageTag.DELETE.char)
        before, end = _read_tuple(data, pos + 5)
        if end != len(data):
            raise _trailing(data, end)
        relid = _U32.unpack_from(data, pos)[0]
        if marker == 0x4B:
            return _make_delete(relid, before, None, xid)
        return _make_delete(relid, None, before, xid)

    def _truncate(self, data: bytes) -> Truncate:
        xid, pos = self._xid(data)
        if len(data) < pos + 5:
            raise _truncated(data, "relation count and flags")
        nrelids, flags = _TRUNCATE_HEAD.unpack_from(data, pos)
        if flags & ~(_TRUNCATE_CASCADE | _TRUNCATE_RESTART_SEQS):
            raise InvalidFieldError(f"unrecognized truncate flags {flags}", pos + 4,
                                    MessageTag.TRUNCATE.char)
        pos += 5
        if len(data) - pos != 4 * nrelids:
            if len(data) - pos < 4 * nrelids:
                raise _truncated(data, f"{nrelids} relation ids")
            raise _trailing(data, pos + 4 * nrelids)
        relids = struct.unpack_from(f">{nrelids}I", data, pos)
        return Truncate(
            relids, bool(flags & _TRUNCATE_CASCADE), bool(flags & _TRUNCATE_RESTART_SEQS), xid
        )

    def _message(self, data: bytes) -> LogicalMessage:
        xid, pos = self._xid(data)
        if len(data) < pos + _MESSAGE_HEAD.size:
            raise _truncated(data, "flags and LSN")
        flags, lsn = _MESSAGE_HEAD.unpack_from(data, pos)
        if flags & ~_MESSAGE_TRANSACTIONAL:
            raise InvalidFieldError(f"unrecognized message flags {flags}", pos,
                                    MessageTag.MESSAGE.char)
        prefix, pos = _string(data, pos + _MESSAGE_HEAD.size, "prefix")
        if len(data) < pos + 4:
            raise _truncated(data, "content length")
        size = _U32.unpack_from(data, pos)[0]
        pos += 4
        if len(data) - pos != size:
            if len(data) - pos < size:
                raise _truncated(data, f"{size} bytes of content")
            raise _trailing(data, pos + size)
        return LogicalMessage(bool(flags), LSN(lsn), prefix, data[pos:], xid)


# --- helpers --------------------------------------------------------------------------------


# The change messages are built by setting their slots (see _frozen.py).
_INS_RELID, _INS_NEW, _INS_XID = frozen_setters(Insert, "relation_id", "new", "xid")
_UPD_RELID, _UPD_NEW, _UPD_KEY, _UPD_OLD, _UPD_XID = frozen_setters(
    Update, "relation_id", "new", "key", "old", "xid")
_DEL_RELID, _DEL_KEY, _DEL_OLD, _DEL_XID = frozen_setters(
    Delete, "relation_id", "key", "old", "xid")


def _make_insert(relation_id: int, new: TupleData, xid: int | None) -> Insert:
    message: Insert = new_object(Insert)
    _INS_RELID(message, relation_id)
    _INS_NEW(message, new)
    _INS_XID(message, xid)
    return message


def _make_update(
    relation_id: int, new: TupleData, key: TupleData | None, old: TupleData | None,
    xid: int | None,
) -> Update:
    message: Update = new_object(Update)
    _UPD_RELID(message, relation_id)
    _UPD_NEW(message, new)
    _UPD_KEY(message, key)
    _UPD_OLD(message, old)
    _UPD_XID(message, xid)
    return message


def _make_delete(
    relation_id: int, key: TupleData | None, old: TupleData | None, xid: int | None
) -> Delete:
    message: Delete = new_object(Delete)
    _DEL_RELID(message, relation_id)
    _DEL_KEY(message, key)
    _DEL_OLD(message, old)
    _DEL_XID(message, xid)
    return message


def _fixed(layout: struct.Struct, data: bytes) -> tuple[int, ...]:
    expected = 1 + layout.size
    if len(data) != expected:
        if len(data) < expected:
            raise _truncated(data, "fixed fields")
        raise _trailing(data, expected)
    return layout.unpack_from(data, 1)


def _prepare_fields(
    data: bytes, pos: int, head: struct.Struct
) -> tuple[LSN, LSN, datetime, int, str]:
    if len(data) < pos + head.size:
        raise _truncated(data, "fixed fields")
    fields = head.unpack_from(data, pos)
    if len(fields) == 5:
        _zero_flags(fields[0], data)
        fields = fields[1:]
        pos += 1
    lsn, end_lsn, at, xid = fields
    _nonzero(lsn, "prepare/commit LSN", pos, data)
    _nonzero(end_lsn, "end_lsn", pos + 8, data)
    gid, end = _string(data, 1 + head.size, "gid")
    _end(data, end)
    return LSN(lsn), LSN(end_lsn), _time(at, pos + 16, data), xid, gid


def _string(data: bytes, pos: int, what: str) -> tuple[str, int]:
    end = data.find(0, pos)
    if end < 0:
        raise _truncated(data, f"{what} (no terminating NUL)")
    try:
        return data[pos:end].decode(), end + 1
    except UnicodeDecodeError as exc:
        raise InvalidFieldError(
            f"{what} is not valid UTF-8: {exc.reason}", pos + exc.start, chr(data[0])
        ) from None


def _time(micros: int, offset: int, data: bytes) -> datetime:
    try:
        return from_pg_micros(micros)
    except ValueError as exc:
        raise InvalidFieldError(str(exc), offset, chr(data[0])) from None


def _zero_flags(flags: int, data: bytes) -> None:
    if flags:
        raise InvalidFieldError(f"unrecognized flags {flags}, expected 0", 1, chr(data[0]))


def _nonzero(lsn: int, what: str, offset: int, data: bytes) -> None:
    if lsn == 0:
        raise InvalidFieldError(f"{what} is not set (0/0)", offset, chr(data[0]))


def _end(data: bytes, pos: int) -> None:
    if pos != len(data):
        raise _trailing(data, pos)


def _trailing(data: bytes, pos: int) -> ProtocolError:
    return InvalidFieldError(
        f"{len(data) - pos} unexpected trailing bytes after the message", pos, chr(data[0])
    )


def _unknown_type(byte: int, proto_version: int) -> ProtocolError:
    if byte in STREAMING_TAGS:
        tag = MessageTag(byte)
        return UnexpectedMessageError(
            f"{_show(byte)} ({tag.title}, {tag.c_name}) needs protocol version 2 or later; "
            f"this stream speaks version {proto_version}",
            0, tag.char,
        )
    return UnknownMessageTypeError(f"unknown message type {_show(byte)}", 0)
