"""Log sequence numbers, printed and parsed as PostgreSQL does (``0/16B3748``)."""

from __future__ import annotations

import functools
import re

_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
_MAX = (1 << 64) - 1
_int_new = int.__new__


class LSN(int):
    """A 64-bit WAL position. An ``int``, so it orders and hashes like one."""

    __slots__ = ()

    def __new__(cls, value: int | str = 0) -> LSN:
        if type(value) is int and 0 <= value <= _MAX:  # the common case first
            return _int_new(cls, value)
        if isinstance(value, str):
            match = _LSN_TEXT.fullmatch(value.strip())
            if match is None:
                raise ValueError(f"invalid LSN {value!r}: expected the form X/X, e.g. 0/16B3748")
            return super().__new__(cls, (int(match[1], 16) << 32) | int(match[2], 16))
        if not 0 <= value <= _MAX:
            raise ValueError(f"LSN {value} is outside 0 .. 2^64-1")
        return super().__new__(cls, value)

    def __str__(self) -> str:
        return f"{self >> 32:X}/{self & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"LSN('{self}')"


INVALID_LSN = LSN(0)

# An LSN read from the wire: an unsigned 64-bit field is in range by construction, so the hot
# paths skip LSN()'s checks (a third of the time).
wire_lsn = functools.partial(_int_new, LSN)
