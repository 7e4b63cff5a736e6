"""Helpers on raw (undecoded) pgoutput messages, for the framework's shortcuts: a row change
that only goes to a spool, or to a plugin's fast formatter, is never decoded on the way."""

from __future__ import annotations

import struct
from typing import Final

from plugin_framework.protocol.tags import MessageTag

ROW_CHANGE_TAGS: Final[frozenset[int]] = frozenset(
    int(tag) for tag in (MessageTag.INSERT, MessageTag.UPDATE, MessageTag.DELETE)
)
# The 32-bit field after a row change's tag is its (sub)transaction xid inside a stream block,
# else its relation id.
ID_AFTER_TAG: Final = struct.Struct(">I")
ROW_CHANGE_MIN_SIZE: Final = 1 + ID_AFTER_TAG.size  # the tag and the id


def is_row_change(data: bytes) -> bool:
    """Whether ``data`` is an Insert, Update or Delete long enough to carry its id."""
    return len(data) >= ROW_CHANGE_MIN_SIZE and data[0] in ROW_CHANGE_TAGS


def id_after_tag(data: bytes) -> int:
    """The xid (in a stream block) or relation id (outside) of a raw row change."""
    value: int = ID_AFTER_TAG.unpack_from(data, 1)[0]
    return value
