"""The ProtocolError family: every way a pgoutput or replication message can be malformed."""

from __future__ import annotations


class ProtocolError(ValueError):
    """A message that does not follow the logical replication protocol.

    ``offset`` is the byte offset in the message where decoding failed; ``message_type`` is the
    message's type byte as a one-character string, when it was read.
    """

    def __init__(self, reason: str, offset: int, message_type: str | None = None) -> None:
        self.reason = reason
        self.offset = offset
        self.message_type = message_type
        where = f"{_MESSAGE_NAMES.get(message_type, 'message')}" if message_type else "message"
        super().__init__(f"malformed {where} at byte {offset}: {reason}")


class TruncatedMessageError(ProtocolError):
    """The buffer ends before the message does."""


class UnknownMessageTypeError(ProtocolError):
    """The first byte names no message of the protocol."""


class InvalidFieldError(ProtocolError):
    """A field holds a value the protocol does not allow (flags, kinds, zero LSNs, lengths)."""


class UnexpectedMessageError(ProtocolError):
    """A valid message where the protocol state or version does not allow it."""


_MESSAGE_NAMES = {
    "B": "Begin message",
    "M": "Message message",
    "C": "Commit message",
    "O": "Origin message",
    "R": "Relation message",
    "Y": "Type message",
    "I": "Insert message",
    "U": "Update message",
    "D": "Delete message",
    "T": "Truncate message",
    "S": "Stream Start message",
    "E": "Stream Stop message",
    "c": "Stream Commit message",
    "A": "Stream Abort message",
    "b": "Begin Prepare message",
    "P": "Prepare message",
    "K": "Commit Prepared message",
    "r": "Rollback Prepared message",
    "p": "Stream Prepare message",
    "w": "XLogData message",
    "k": "Primary keepalive message",
}
