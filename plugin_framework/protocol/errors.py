"""The ProtocolError family: every way a pgoutput or replication message can be malformed."""

from __future__ import annotations

from plugin_framework.protocol.tags import MessageTag


class ProtocolError(ValueError):
    """A message that does not follow the logical replication protocol.

    ``offset`` is the byte offset in the message where decoding failed; ``message_type`` is the
    message's type byte as a one-character string, when it was read (``tag`` is it as a
    MessageTag, for pgoutput's messages).
    """

    def __init__(self, reason: str, offset: int, message_type: str | None = None) -> None:
        self.reason = reason
        self.offset = offset
        self.message_type = message_type
        where = f"{_MESSAGE_NAMES.get(message_type, 'message')}" if message_type else "message"
        super().__init__(f"malformed {where} at byte {offset}: {reason}")

    @property
    def tag(self) -> MessageTag | None:
        """The pgoutput message the error is about, when it is one."""
        if self.message_type is None or len(self.message_type) != 1:
            return None
        try:
            return MessageTag(ord(self.message_type))
        except ValueError:
            return None


class TruncatedMessageError(ProtocolError):
    """The buffer ends before the message does."""


class UnknownMessageTypeError(ProtocolError):
    """The first byte names no message of the protocol."""


class InvalidFieldError(ProtocolError):
    """A field holds a value the protocol does not allow (flags, kinds, zero LSNs, lengths)."""


class UnexpectedMessageError(ProtocolError):
    """A valid message where the protocol state or version does not allow it."""


# The prose name of each message by its type byte: pgoutput's, and the replication protocol's
# own CopyData messages that carry them.
_MESSAGE_NAMES = {
    **{tag.char: f"{tag.title} message" for tag in MessageTag},
    "w": "XLogData message",
    "k": "Primary keepalive message",
}
