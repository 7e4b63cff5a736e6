"""The replication protocol's CopyData framing around pgoutput messages.

Server to client: XLogData ('w') carrying one pgoutput message, and the primary keepalive
('k'). Client to server: the standby status update ('r').
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from plugin_framework.protocol.errors import (
    InvalidFieldError,
    TruncatedMessageError,
    UnknownMessageTypeError,
)
from plugin_framework.protocol.lsn import LSN
from plugin_framework.protocol.pgtime import from_pg_micros, to_pg_micros
from plugin_framework.protocol.tags import CopyDataTag

# The type bytes as plain ints: the hot paths compare with ==, and the structs pack them ("B").
XLOGDATA_TAG: Final = int(CopyDataTag.XLOGDATA)  # 'w'
_KEEPALIVE_TAG: Final = int(CopyDataTag.PRIMARY_KEEPALIVE)  # 'k'
_STATUS_TAG: Final = int(CopyDataTag.STANDBY_STATUS_UPDATE)  # 'r'

_XLOGDATA = struct.Struct(">BQQq")
_KEEPALIVE = struct.Struct(">BQqB")
_STATUS = struct.Struct(">BQQQqB")

# For readers that take XLogData apart in their hot loop without building an XLogData (the
# walsender source): the type byte (XLOGDATA_TAG, above), the header's size (the pgoutput
# message follows it), and the start LSN, read at offset 1. A payload shorter than the header
# goes to decode_copy_data, which raises the proper error.
XLOGDATA_HEADER_SIZE = _XLOGDATA.size
xlogdata_wal_start = struct.Struct(">Q").unpack_from


@dataclass(frozen=True, slots=True)
class XLogData:
    """One pgoutput message and where it is in the WAL.

    ``wal_start`` is the LSN of the WAL record behind the message (0/0 for Relation and Type,
    which have none); ``wal_end`` is the server's current end of WAL.
    """

    wal_start: LSN
    wal_end: LSN
    send_time: datetime
    data: bytes


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """The server's keepalive ('k'): its WAL end, and whether it wants a status update now."""

    wal_end: LSN
    send_time: datetime
    reply_requested: bool


@dataclass(frozen=True, slots=True)
class StandbyStatusUpdate:
    """What the client has written, flushed and applied; the server keeps WAL after ``flush``."""

    written: LSN
    flushed: LSN
    applied: LSN
    client_time: datetime
    reply_requested: bool = False


def _time(micros: int, offset: int, tag: str) -> datetime:
    try:
        return from_pg_micros(micros)
    except ValueError as exc:
        raise InvalidFieldError(str(exc), offset, tag) from None


def decode_copy_data(data: bytes | bytearray | memoryview) -> XLogData | PrimaryKeepalive:
    """Decode a CopyData payload the server sends on a logical replication connection."""
    if not data:
        raise TruncatedMessageError("empty CopyData: no type byte", 0)
    tag = data[0]
    if tag == XLOGDATA_TAG:
        if len(data) < _XLOGDATA.size:
            raise TruncatedMessageError(
                f"XLogData header needs {_XLOGDATA.size} bytes, got {len(data)}", len(data), "w"
            )
        _, start, end, sent = _XLOGDATA.unpack_from(data)
        return XLogData(LSN(start), LSN(end), _time(sent, 17, "w"),
                        bytes(data[_XLOGDATA.size:]))
    if tag == _KEEPALIVE_TAG:
        if len(data) != _KEEPALIVE.size:
            raise TruncatedMessageError(
                f"keepalive is {_KEEPALIVE.size} bytes, got {len(data)}", len(data), "k"
            )
        _, end, sent, reply = _KEEPALIVE.unpack_from(data)
        if reply > 1:
            raise InvalidFieldError(f"reply-requested byte is {reply}, expected 0 or 1", 17, "k")
        return PrimaryKeepalive(LSN(end), _time(sent, 9, "k"), bool(reply))
    raise UnknownMessageTypeError(
        f"unknown replication message type 0x{tag:02x}, expected 'w' or 'k'", 0
    )


def encode_copy_data(message: XLogData | PrimaryKeepalive | StandbyStatusUpdate) -> bytes:
    if isinstance(message, XLogData):
        return _XLOGDATA.pack(
            XLOGDATA_TAG, message.wal_start, message.wal_end, to_pg_micros(message.send_time)
        ) + message.data
    if isinstance(message, PrimaryKeepalive):
        return _KEEPALIVE.pack(
            _KEEPALIVE_TAG, message.wal_end, to_pg_micros(message.send_time),
            message.reply_requested,
        )
    return _STATUS.pack(
        _STATUS_TAG, message.written, message.flushed, message.applied,
        to_pg_micros(message.client_time), message.reply_requested,
    )


def decode_standby_status(data: bytes | bytearray | memoryview) -> StandbyStatusUpdate:
    """Decode a standby status update (what a server receives; used by tests and tools)."""
    if len(data) != _STATUS.size or data[0] != _STATUS_TAG:
        raise InvalidFieldError(
            f"standby status update is 'r' and {_STATUS.size} bytes", 0, "r"
        )
    _, written, flushed, applied, at, reply = _STATUS.unpack_from(data)
    if reply > 1:
        raise InvalidFieldError(f"reply-requested byte is {reply}, expected 0 or 1", 33, "r")
    return StandbyStatusUpdate(
        LSN(written), LSN(flushed), LSN(applied), _time(at, 25, "r"), bool(reply)
    )
