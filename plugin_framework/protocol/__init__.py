"""The pgoutput protocol codec, versions 1 to 4. Pure: bytes in, typed messages out, and back.

    >>> from plugin_framework.protocol import Decoder, encode
    >>> message = Decoder(proto_version=4).decode(payload)
    >>> encode(message) == payload
"""

from __future__ import annotations

from plugin_framework.protocol.decoder import MAX_PROTO_VERSION, MIN_PROTO_VERSION, Decoder
from plugin_framework.protocol.encoder import encode, encode_tuple
from plugin_framework.protocol.errors import (
    InvalidFieldError,
    ProtocolError,
    TruncatedMessageError,
    UnexpectedMessageError,
    UnknownMessageTypeError,
)
from plugin_framework.protocol.framing import (
    PrimaryKeepalive,
    StandbyStatusUpdate,
    XLogData,
    decode_copy_data,
    decode_standby_status,
    encode_copy_data,
)
from plugin_framework.protocol.lsn import INVALID_LSN, LSN
from plugin_framework.protocol.messages import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    UNCHANGED_TOAST,
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
from plugin_framework.protocol.pgtime import PG_EPOCH, from_pg_micros, to_pg_micros
from plugin_framework.protocol.raw import (
    ID_AFTER_TAG,
    ROW_CHANGE_MIN_SIZE,
    ROW_CHANGE_TAGS,
    id_after_tag,
    is_row_change,
)
from plugin_framework.protocol.tags import CopyDataTag, MessageTag, TupleKind

__all__ = [
    "ID_AFTER_TAG", "INVALID_LSN", "KIND_BINARY", "KIND_NULL", "KIND_TEXT", "KIND_UNCHANGED_TOAST",
    "LSN", "MAX_PROTO_VERSION", "MIN_PROTO_VERSION", "PG_EPOCH", "ROW_CHANGE_MIN_SIZE",
    "ROW_CHANGE_TAGS",
    "UNCHANGED_TOAST", "Begin", "BeginPrepare", "Commit", "CommitPrepared", "CopyDataTag",
    "Decoder", "Delete",
    "Insert", "InvalidFieldError", "LogicalMessage", "Message", "MessageTag", "Origin", "Prepare",
    "PrimaryKeepalive", "ProtocolError", "RelationColumn", "RelationMessage", "RollbackPrepared",
    "StandbyStatusUpdate", "StreamAbort", "StreamCommit", "StreamPrepare", "StreamStart",
    "StreamStop", "Truncate", "TruncatedMessageError", "TupleData", "TupleKind", "Type",
    "UnexpectedMessageError", "UnknownMessageTypeError", "Update", "XLogData", "decode_copy_data",
    "decode_standby_status", "encode", "encode_copy_data", "encode_tuple", "from_pg_micros",
    "id_after_tag", "is_row_change", "to_pg_micros",
]
