"""pgoutput's TupleData (a row: a kind and a value per column), read from a message's bytes;
the decoder's hot spot, and the helpers its errors share with the decoder.

``read_tuple`` takes the C reader (native/_tuples.c) where it is built; for anything that
reader finds malformed, and without it, ``read_tuple_py``, the reference it mirrors, reads
the tuple and raises the exact error.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from plugin_framework._frozen import frozen_setters, new_object
from plugin_framework._native import load_native
from plugin_framework.protocol.errors import (
    InvalidFieldError,
    ProtocolError,
    TruncatedMessageError,
)
from plugin_framework.protocol.messages import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    TupleData,
)

if TYPE_CHECKING:
    from plugin_framework.protocol.native._tuples import read_tuple as c_read_tuple
else:
    _tuples = load_native("plugin_framework.protocol.native._tuples")
    c_read_tuple = None if _tuples is None else _tuples.read_tuple

__all__ = ["c_read_tuple", "make_tuple_data", "read_tuple", "read_tuple_py", "show",
           "truncated"]

_U32 = struct.Struct(">I")

# TupleData is built by setting its slots (see _frozen.py).
_TD_KINDS, _TD_VALUES = frozen_setters(TupleData, "kinds", "values")


def make_tuple_data(kinds: bytes, values: tuple[bytes | None, ...]) -> TupleData:
    row: TupleData = new_object(TupleData)
    _TD_KINDS(row, kinds)
    _TD_VALUES(row, values)
    return row


def truncated(data: bytes, what: str) -> ProtocolError:
    return TruncatedMessageError(
        f"message ends after {len(data)} bytes while reading {what}", len(data), chr(data[0])
    )


def show(byte: int) -> str:
    return repr(chr(byte)) if 0x20 < byte < 0x7F else f"byte 0x{byte:02x}"


def read_tuple(data: bytes, pos: int) -> tuple[TupleData, int]:
    """Parse TupleData at ``pos``; return it and the offset just past it."""
    if c_read_tuple is not None:
        found = c_read_tuple(data, pos)
        if found is not None:
            return make_tuple_data(found[0], found[1]), found[2]
    return read_tuple_py(data, pos)


def read_tuple_py(data: bytes, pos: int) -> tuple[TupleData, int]:
    """Parse TupleData at ``pos``; return it and the offset just past it (the reference
    that the C reader mirrors).

    The hot path: per column, one length unpack and one slice, no other call. Most rows are text
    in every column, so a first loop reads text columns without recording their kinds one by
    one; from the first column of another kind, the general loop takes over.
    """
    size = len(data)
    if size < pos + 2:
        raise truncated(data, "column count of a tuple")
    ncols = (data[pos] << 8) | data[pos + 1]
    pos += 2
    values: list[bytes | None] = [None] * ncols  # null and unchanged TOAST stay None
    unpack_len = _U32.unpack_from
    i = 0
    try:
        while i < ncols and data[pos] == KIND_TEXT:
            start = pos + 5
            pos = start + unpack_len(data, pos + 1)[0]
            if pos > size:
                raise truncated(data, f"value of column {i} ({pos - start} bytes)")
            values[i] = data[start:pos]
            i += 1
        if i == ncols:
            return make_tuple_data(b"t" * ncols, tuple(values)), pos

        first_other = i
        kinds = bytearray(b"t") * ncols
        for i in range(first_other, ncols):
            kind = kinds[i] = data[pos]
            if kind == KIND_NULL or kind == KIND_UNCHANGED_TOAST:
                pos += 1
            elif kind == KIND_TEXT or kind == KIND_BINARY:
                start = pos + 5
                pos = start + unpack_len(data, pos + 1)[0]
                if pos > size:
                    raise truncated(data, f"value of column {i} ({pos - start} bytes)")
                values[i] = data[start:pos]
            else:
                raise InvalidFieldError(
                    f"unknown column kind {show(kind)} of column {i}, "
                    "expected 'n', 'u', 't' or 'b'",
                    pos, chr(data[0]),
                )
    except (IndexError, struct.error):
        raise truncated(data, f"column {i} of {ncols}") from None
    return make_tuple_data(bytes(kinds), tuple(values)), pos
