"""The server's text of a value -> its JSON-ready value: numbers, booleans, json, bytea, and
arrays of any element type.

A converter takes the bytes the server sent in text format and returns what orjson prints as
the value's JSON: for integers, finite floats and jsonb the server's text already is that JSON
and is embedded verbatim as an ``orjson.Fragment``, so nothing is parsed. Timestamps and
intervals are in pgtypes.datetimes. The converters that emitters/json/native/_jsonrow.c
mirrors in C are declared in pgtypes.converters (``NATIVE_KIND``).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from typing import Any, Final

import orjson
from psycopg.adapt import Transformer
from psycopg.pq import Format

from plugin_framework.pgtypes.oids import BOOL, CID, INT2, INT4, INT8, OID, XID, XID8

__all__ = [
    "BOOL_ARRAY",
    "INTEGER_ARRAY",
    "TEXT_ARRAY",
    "Converter",
    "Fragment",
    "parse_array_text",
    "psycopg_array",
    "t_bool",
    "t_bytea_base64",
    "t_bytea_hex",
    "t_float",
    "t_json",
]

Converter = Callable[[bytes], Any]
"""A value's text (or send format) -> its JSON-ready value."""

Fragment: Final = orjson.Fragment
"""The converter of a type whose text is its JSON (integers, jsonb): embedded verbatim."""


def t_float(raw: bytes) -> Any:
    """Finite: the server's digits as a JSON number, but -0 as -0.0 (JSON readers take
    ``-0`` for the integer 0, and the sign would be lost). NaN, Infinity, -Infinity:
    strings."""
    if raw == b"-0":
        return _MINUS_ZERO
    return Fragment(raw) if 47 < raw[-1] < 58 else raw.decode()


_MINUS_ZERO: Final = Fragment(b"-0.0")


# boolean text is "t" or "f": a dict lookup, called from C, is the cheapest conversion
t_bool: Final[Callable[[bytes], bool]] = {b"t": True, b"f": False}.__getitem__


def t_json(raw: bytes) -> Any:
    """json and jsonb text is JSON already. A json value may span lines; a line break can only
    be whitespace between tokens (the server rejects raw control characters in strings), so it
    becomes a space and the value stays exactly the same."""
    if b"\n" in raw or b"\r" in raw:
        raw = raw.replace(b"\r", b" ").replace(b"\n", b" ")
    return Fragment(raw)


def _bytea_from_text(raw: bytes) -> bytes:
    """The bytes of a bytea's text: hex (``\\x00ff``, the default bytea_output) or escape."""
    if raw[:2] == b"\\x":
        return binascii.unhexlify(raw[2:])
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c != 92:  # backslash
            out.append(c)
            i += 1
        elif raw[i + 1] == 92:
            out.append(92)
            i += 2
        else:
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
    return bytes(out)


def t_bytea_hex(raw: bytes) -> str:
    if raw[:2] == b"\\x":
        return raw[2:].decode()
    return _bytea_from_text(raw).hex()


def t_bytea_base64(raw: bytes) -> str:
    return binascii.b2a_base64(_bytea_from_text(raw), newline=False).decode()


# --- arrays in text format --------------------------------------------------------------------

_QUOTE, _LBRACE, _RBRACE = 34, 123, 125

_STOPS: dict[bytes, re.Pattern[bytes]] = {}


def parse_array_text(raw: bytes, element: Converter, delim: bytes = b",") -> list[Any]:
    """An array's text (``{1,2,NULL}``, ``{{1,2},{3,4}}``, ``[0:1]={7,8}``) as nested lists of
    converted elements. Dimension bounds are dropped, as PostgreSQL's to_json drops them."""
    stops = _STOPS.get(delim)
    if stops is None:
        stops = _STOPS[delim] = re.compile(b"[" + re.escape(delim) + b"}]")
    d = delim[0]
    pos = raw.index(b"=") + 1 if raw[:1] == b"[" else 0
    stack: list[list[Any]] = []
    items: list[Any] = []
    try:
        if raw[pos] != _LBRACE:
            raise ValueError
        pos += 1
        if raw[pos] == _RBRACE:
            return items
        while True:
            c = raw[pos]
            if c == _LBRACE:  # a sub-array begins: its first element next
                stack.append(items)
                items = []
                pos += 1
                if raw[pos] != _RBRACE:
                    continue
                pos += 1  # "{}": an empty sub-array, PostgreSQL never writes it
                parent = stack.pop()
                parent.append(items)
                items = parent
            elif c == _QUOTE:
                pos += 1
                q = raw.index(b'"', pos)
                backslash = raw.find(b"\\", pos, q)
                if backslash < 0:
                    value = raw[pos:q]
                    pos = q + 1
                else:
                    buf = bytearray()
                    while backslash >= 0:
                        buf += raw[pos:backslash]
                        buf.append(raw[backslash + 1])
                        pos = backslash + 2
                        q = raw.index(b'"', pos)
                        backslash = raw.find(b"\\", pos, q)
                    buf += raw[pos:q]
                    pos = q + 1
                    value = bytes(buf)
                items.append(element(value))
            else:
                m = stops.search(raw, pos)
                if m is None:
                    raise ValueError
                end = m.start()
                token = raw[pos:end].strip()
                items.append(None if token.upper() == b"NULL" else element(token))
                pos = end
            while True:  # after an element: a delimiter, or the end of one or more levels
                c = raw[pos]
                pos += 1
                if c == d:
                    break
                if c != _RBRACE:
                    raise ValueError
                if not stack:
                    return items
                parent = stack.pop()
                parent.append(items)
                items = parent
    except (ValueError, IndexError):
        raise ValueError(f"malformed array text {raw[:100]!r}") from None


def _psycopg_array_loaders() -> tuple[Converter, Converter, Converter]:
    """psycopg's parsers of array text into lists of ``str``, ``int`` and ``bool``: in C when
    its binary package is installed, eight times faster than parse_array_text. Array text has
    the same syntax whatever the element type, so the ``text[]`` loader splits any array."""
    loaders = Transformer()
    return (loaders.get_loader(1009, Format.TEXT).load,  # text[]
            loaders.get_loader(1016, Format.TEXT).load,  # bigint[]
            loaders.get_loader(1000, Format.TEXT).load)  # boolean[]


TEXT_ARRAY, INTEGER_ARRAY, BOOL_ARRAY = _psycopg_array_loaders()
_INTEGERS: Final = frozenset((INT2, INT4, INT8, OID, XID, CID, XID8))


def psycopg_array(element_oid: int, element: Converter) -> Converter | None:
    """psycopg's parser for arrays whose elements' JSON values it produces exactly: text as
    ``str`` (any element converted by ``bytes.decode``), integers as ``int`` (orjson prints the
    server's digits), booleans as ``bool``; None for the others."""
    if element is bytes.decode:
        return TEXT_ARRAY
    if element_oid in _INTEGERS:
        return INTEGER_ARRAY
    if element_oid == BOOL:
        return BOOL_ARRAY
    return None

