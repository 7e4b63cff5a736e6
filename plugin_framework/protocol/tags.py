"""The type byte of every pgoutput message, and the column kinds of TupleData.

``MessageTag`` mirrors PostgreSQL's ``LogicalRepMsgType`` (src/include/replication/
logicalproto.h) member for member: ``LOGICAL_REP_MSG_BEGIN`` 'B', ``LOGICAL_REP_MSG_COMMIT``
'C', ``LOGICAL_REP_MSG_ORIGIN`` 'O', ``LOGICAL_REP_MSG_INSERT`` 'I', ``LOGICAL_REP_MSG_UPDATE``
'U', ``LOGICAL_REP_MSG_DELETE`` 'D', ``LOGICAL_REP_MSG_TRUNCATE`` 'T',
``LOGICAL_REP_MSG_RELATION`` 'R', ``LOGICAL_REP_MSG_TYPE`` 'Y', ``LOGICAL_REP_MSG_MESSAGE``
'M', ``LOGICAL_REP_MSG_BEGIN_PREPARE`` 'b', ``LOGICAL_REP_MSG_PREPARE`` 'P',
``LOGICAL_REP_MSG_COMMIT_PREPARED`` 'K', ``LOGICAL_REP_MSG_ROLLBACK_PREPARED`` 'r',
``LOGICAL_REP_MSG_STREAM_START`` 'S', ``LOGICAL_REP_MSG_STREAM_STOP`` 'E',
``LOGICAL_REP_MSG_STREAM_COMMIT`` 'c', ``LOGICAL_REP_MSG_STREAM_ABORT`` 'A',
``LOGICAL_REP_MSG_STREAM_PREPARE`` 'p'. The values are the byte values, so that
``data[0] == MessageTag.INSERT`` holds for a raw Insert.

``TupleKind`` mirrors the ``LOGICALREP_COLUMN_*`` markers of the same header.

``CopyDataTag`` is the type byte of the replication protocol's CopyData messages around
them (PostgreSQL's protocol documentation, "Streaming Replication Protocol").

The C code reads these through a header generated from them (``protocol/cheader.py``); a
test holds the committed plugin_framework/protocol/native/pgoutput_tags.h to the generator's
output.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class MessageTag(IntEnum):
    """The first byte of a pgoutput message (``LogicalRepMsgType``)."""

    BEGIN = ord("B")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    RELATION = ord("R")
    TYPE = ord("Y")
    MESSAGE = ord("M")
    BEGIN_PREPARE = ord("b")
    PREPARE = ord("P")
    COMMIT_PREPARED = ord("K")
    ROLLBACK_PREPARED = ord("r")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")
    STREAM_PREPARE = ord("p")

    @property
    def char(self) -> str:
        """The tag as the one-character string PostgreSQL's sources spell."""
        return chr(self)

    @property
    def title(self) -> str:
        """The message's name in prose, as PostgreSQL's protocol documentation has it
        ("Stream Commit")."""
        return self.name.replace("_", " ").title()

    @property
    def c_name(self) -> str:
        """PostgreSQL's name for it (``LOGICAL_REP_MSG_STREAM_COMMIT``)."""
        return f"LOGICAL_REP_MSG_{self.name}"


class TupleKind(IntEnum):
    """The kind byte before each column of a TupleData (``LOGICALREP_COLUMN_*``)."""

    NULL = ord("n")
    UNCHANGED_TOAST = ord("u")  # LOGICALREP_COLUMN_UNCHANGED
    TEXT = ord("t")
    BINARY = ord("b")


class CopyDataTag(IntEnum):
    """The first byte of a CopyData message on a replication connection, as PostgreSQL's
    protocol documentation names them: from the server, XLogData 'w' (one pgoutput message
    and its WAL position) and Primary keepalive message 'k'; from the client, Standby status
    update 'r'."""

    XLOGDATA = ord("w")
    PRIMARY_KEEPALIVE = ord("k")
    STANDBY_STATUS_UPDATE = ord("r")


# Messages that exist from protocol version 2 (streaming) on. Stream Prepare belongs to
# version 3, but a two-phase slot read through the SQL interface sends it to any streaming
# version.
STREAMING_TAGS: Final[frozenset[int]] = frozenset(int(tag) for tag in (
    MessageTag.STREAM_START, MessageTag.STREAM_STOP, MessageTag.STREAM_COMMIT,
    MessageTag.STREAM_ABORT, MessageTag.STREAM_PREPARE,
))
