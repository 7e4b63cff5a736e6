"""TypeConverters: for each column type, the converter of its text and of its send format to
a JSON-ready value; and NATIVE_KIND, which of those converters
emitters/json/native/_jsonrow.c mirrors.

Used by the json emitter and by Spark's change builder, so that both give a type the same
values.
"""

from __future__ import annotations

import binascii
import functools
import math
import re
import struct
import uuid
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from psycopg.postgres import types as psycopg_types

from plugin_framework.pgtypes.binary import (
    b_bits_text,
    b_box_text,
    b_char_text,
    b_circle_text,
    b_float8_text,
    b_inet_text,
    b_int_text,
    b_line_text,
    b_lseg_text,
    b_numeric_text,
    b_path_text,
    b_pg_lsn_text,
    b_point_text,
    b_polygon_text,
    b_tid_text,
    multirange_text,
    pg_float4_text,
    single_range_text,
)
from plugin_framework.pgtypes.datetimes import (
    b_date_text,
    b_interval_iso,
    b_time_text,
    b_timestamp_text,
    b_timestamptz_text,
    b_timetz_text,
    t_interval,
    t_timestamp,
    t_timestamptz,
    t_timetz,
)
from plugin_framework.pgtypes.format_type import format_type
from plugin_framework.pgtypes.oids import (
    BIT,
    BOOL,
    BOX,
    BPCHAR,
    BYTEA,
    CHAR,
    CID,
    CIDR,
    CIRCLE,
    DATE,
    DATEMULTIRANGE,
    DATERANGE,
    FLOAT4,
    FLOAT8,
    INET,
    INT2,
    INT4,
    INT4MULTIRANGE,
    INT4RANGE,
    INT8,
    INT8MULTIRANGE,
    INT8RANGE,
    INTERVAL,
    JSON,
    JSONB,
    JSONPATH,
    LINE,
    LSEG,
    MACADDR,
    MACADDR8,
    NAME,
    NUMERIC,
    NUMMULTIRANGE,
    NUMRANGE,
    OID,
    PATH,
    PG_LSN,
    POINT,
    POLYGON,
    REFCURSOR,
    TEXT,
    TID,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TIMETZ,
    TSMULTIRANGE,
    TSRANGE,
    TSTZMULTIRANGE,
    TSTZRANGE,
    UNKNOWN,
    UUID,
    VARBIT,
    VARCHAR,
    XID,
    XID8,
    XML,
)
from plugin_framework.pgtypes.text import (
    BOOL_ARRAY,
    INTEGER_ARRAY,
    TEXT_ARRAY,
    Converter,
    Fragment,
    parse_array_text,
    psycopg_array,
    t_bool,
    t_bytea_base64,
    t_bytea_hex,
    t_float,
    t_json,
)

__all__ = ["NATIVE_KIND", "TypeConverters", "native_codes"]

_i32 = struct.Struct("!i")

_RANGE_ELEMENTS: Final = {INT4RANGE: INT4, NUMRANGE: NUMERIC, TSRANGE: TIMESTAMP,
                          TSTZRANGE: TIMESTAMPTZ, DATERANGE: DATE, INT8RANGE: INT8}
_MULTIRANGE_RANGES: Final = {INT4MULTIRANGE: INT4RANGE, NUMMULTIRANGE: NUMRANGE,
                             TSMULTIRANGE: TSRANGE, TSTZMULTIRANGE: TSTZRANGE,
                             DATEMULTIRANGE: DATERANGE, INT8MULTIRANGE: INT8RANGE}

# Array type OID -> element OID, and element OID -> the delimiter of its arrays' text (a comma,
# but for box), for every built-in type psycopg knows.
_ARRAYS: Final = {t.array_oid: t.oid for t in psycopg_types if t.array_oid}
_DELIMITERS: Final = {t.oid: t.delimiter.encode() for t in psycopg_types if t.delimiter != ","}

# --- the converters that emitters/json/native/_jsonrow.c mirrors ----------------------------

NATIVE_KIND: Final[Mapping[Converter, str]] = MappingProxyType({
    Fragment: "VERBATIM",
    bytes.decode: "STRING",
    t_float: "FLOAT",
    t_bool: "BOOL",
    t_json: "JSON",
    t_timestamp: "TIMESTAMP",
    t_timestamptz: "TIMESTAMPTZ",
    TEXT_ARRAY: "ARRAY_TEXT",
    INTEGER_ARRAY: "ARRAY_INT",
    BOOL_ARRAY: "ARRAY_BOOL",
})
"""Text converter -> the name of the code by which emitters/json/native/_jsonrow.c formats a column
with that converter in C (its module constants: ``_jsonrow.FLOAT``...); any converter not named here
the C code calls. A change to one of these converters must be made to the C code too:
tests/emitters/test_json_native.py checks each against its C code (hypothesis), and
tests/pgtypes/test_pgtypes.py that each type keeps the converter, and each converter the code, that
they have."""


def native_codes(module: Any) -> Callable[[Converter], int]:
    """How a C module that includes pgtypes/native/_jsonvalue.h (the json emitter's, the
    Spark builder's) converts a column whose text converter is ``conv``: by the code
    ``NATIVE_KIND`` names for it (the module's constant of that name; an unknown name fails
    here, when the module is loaded), else by calling ``conv`` (the module's ``PYCALL``)."""
    codes: dict[Converter, int] = {conv: getattr(module, name)
                                   for conv, name in NATIVE_KIND.items()}
    pycall: int = module.PYCALL

    def code(conv: Converter) -> int:
        return codes.get(conv, pycall)

    return code


class TypeConverters:
    """Column converters for one set of options: for each type OID, one function from the
    server's text (text format) and one from the send format (binary format) to a JSON-ready
    value. Types whose send format pgdecode cannot render are *opaque* in binary format: their
    bytes are emitted as bytea values are, and the line names the column in ``binary``."""

    def __init__(self, *, numeric_as: str = "string", bytea: str = "hex",
                 catalog: Any = None) -> None:
        self.numeric_as = numeric_as
        self.bytea = bytea
        self.catalog = catalog
        self._bytes_out: Callable[[bytes], str] = (
            bytes.hex if bytea == "hex"
            else lambda b: binascii.b2a_base64(b, newline=False).decode())
        self._text: dict[int, Converter] = {}
        self._binary: dict[int, tuple[Converter, bool]] = {}
        self._resolved: dict[int, tuple[str, int]] = {}
        self._by_name = _builtin_names()

    # -- resolution of types that are not built in

    def resolve(self, type_oid: int, type_name: str | None = None) -> tuple[str, int]:
        """What to treat a type as: ("builtin", oid), ("array", element oid or 0 if unknown),
        ("enum", 0) or ("unknown", 0). Domains resolve to their base type: pgoutput's Type
        message names a domain by its base type (``type_name``), the catalog tells the rest."""
        if type_oid in _ARRAYS:
            return ("array", _ARRAYS[type_oid])
        if type_oid < 10000 or type_oid in _MULTIRANGE_RANGES or type_oid in _RANGE_ELEMENTS:
            return ("builtin", type_oid)
        known = self._resolved.get(type_oid)
        if known is not None:
            return known
        result = self._from_name(type_name) or self._from_catalog(type_oid) or ("unknown", 0)
        if result[0] == "unknown" and type_name and type_name.startswith("_"):
            result = ("array", 0)  # a user type's array, by PostgreSQL's naming convention
        self._resolved[type_oid] = result
        return result

    def _from_name(self, type_name: str | None) -> tuple[str, int] | None:
        if not type_name:
            return None
        name = _TYPMOD.sub("", type_name)
        oid = self._by_name.get(name)
        if oid is None and name.startswith("interval"):
            oid = INTERVAL
        if oid is None:
            return None
        return ("array", _ARRAYS[oid]) if oid in _ARRAYS else ("builtin", oid)

    def _from_catalog(self, type_oid: int) -> tuple[str, int] | None:
        if self.catalog is None:
            return None
        rows = self.catalog.query(
            "SELECT typtype::text, typbasetype::int8, typelem::int8, typcategory::text "
            "FROM pg_type WHERE oid = %s", (type_oid,))
        if not rows:
            return None
        typtype, base, elem, category = rows[0]
        if typtype == "d":
            return self.resolve(int(base))
        if typtype == "e":
            return ("enum", 0)
        if category == "A" and elem:
            return ("array", int(elem))
        return None

    # -- text format

    def text(self, type_oid: int, type_name: str | None = None) -> Converter:
        conv = self._text.get(type_oid)
        if conv is None:
            conv = self._text[type_oid] = self._make_text(type_oid, type_name)
        return conv

    def _make_text(self, type_oid: int, type_name: str | None) -> Converter:
        kind, oid = self.resolve(type_oid, type_name)
        if kind == "array":
            element = self.text(oid) if oid else bytes.decode
            delim = _DELIMITERS.get(oid, b",")
            fast = psycopg_array(oid, element) if delim == b"," else None
            if fast is not None:
                return fast
            return lambda raw: parse_array_text(raw, element, delim)
        if kind != "builtin":
            return bytes.decode
        return self._scalar_text(oid)

    def _scalar_text(self, oid: int) -> Converter:
        if oid in (INT2, INT4, INT8, OID, XID, CID, XID8):
            return Fragment
        if oid in (FLOAT4, FLOAT8):
            return t_float
        if oid == NUMERIC:
            return t_float if self.numeric_as == "number" else bytes.decode
        if oid == BOOL:
            return t_bool
        if oid == JSONB:
            return Fragment  # jsonb's text is one line: jsonb_out escapes line breaks
        if oid == JSON:
            return t_json
        if oid == BYTEA:
            return t_bytea_hex if self.bytea == "hex" else t_bytea_base64
        if oid == TIMESTAMP:
            return t_timestamp
        if oid == TIMESTAMPTZ:
            return t_timestamptz
        if oid == TIMETZ:
            return t_timetz
        if oid == INTERVAL:
            return t_interval
        return bytes.decode

    # -- binary format

    def binary(self, type_oid: int, type_name: str | None = None) -> tuple[Converter, bool]:
        """The converter of a binary-format value, and whether the type is opaque."""
        entry = self._binary.get(type_oid)
        if entry is None:
            entry = self._binary[type_oid] = self._make_binary(type_oid, type_name)
        return entry

    def _make_binary(self, type_oid: int, type_name: str | None) -> tuple[Converter, bool]:
        kind, oid = self.resolve(type_oid, type_name)
        if kind == "enum":
            return bytes.decode, False
        if kind == "unknown":
            return self._bytes_out, True
        if kind == "array":
            opaque = not oid or self.binary(oid)[1]
            return self._binary_array, opaque
        direct = self._direct_binary(oid)
        if direct is not None:
            return direct, False
        to_text = self._binary_text(oid)
        if to_text is None:
            return self._bytes_out, True
        text_conv = self._scalar_text(oid)

        def conv(raw: bytes) -> Any:
            return text_conv(to_text(raw).encode())

        return conv, False

    def _direct_binary(self, oid: int) -> Converter | None:
        """Binary converters that need not go through the server's text."""
        if oid in (INT2, INT4, INT8):
            return lambda raw: int.from_bytes(raw, "big", signed=True)
        if oid in (OID, XID, CID, XID8):
            return lambda raw: int.from_bytes(raw, "big")
        if oid == BOOL:
            return lambda raw: raw == b"\x01"
        if oid == BYTEA:
            return self._bytes_out
        if oid == JSON:
            return t_json
        if oid == JSONB:
            return lambda raw: t_json(raw[1:])  # a version byte, then the text
        if oid == INTERVAL:
            return b_interval_iso
        if oid in (TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN, XML, REFCURSOR):
            return bytes.decode
        if oid == JSONPATH:
            return lambda raw: raw[1:].decode()  # a version byte, then the text
        return None

    def _binary_text(self, oid: int) -> Callable[[bytes], str] | None:
        """The server's text of a binary value, for the types pgdecode can render."""
        simple: dict[int, Callable[[bytes], str]] = {
            FLOAT4: pg_float4_text, FLOAT8: b_float8_text, NUMERIC: b_numeric_text,
            DATE: b_date_text, TIME: b_time_text, TIMETZ: b_timetz_text,
            TIMESTAMP: b_timestamp_text, TIMESTAMPTZ: b_timestamptz_text,
            UUID: lambda raw: str(uuid.UUID(bytes=raw)), INET: b_inet_text,
            CIDR: b_inet_text, MACADDR: lambda raw: raw.hex(":"),
            MACADDR8: lambda raw: raw.hex(":"), BIT: b_bits_text, VARBIT: b_bits_text,
            PG_LSN: b_pg_lsn_text, TID: b_tid_text, CHAR: b_char_text,
            POINT: b_point_text, LSEG: b_lseg_text, BOX: b_box_text, LINE: b_line_text,
            PATH: b_path_text, POLYGON: b_polygon_text, CIRCLE: b_circle_text,
            INT4: b_int_text, INT8: b_int_text,  # as range bounds
        }
        if oid in simple:
            return simple[oid]
        if oid in _RANGE_ELEMENTS:
            bound = self._binary_text(_RANGE_ELEMENTS[oid])
            assert bound is not None
            return functools.partial(single_range_text, bound=bound)
        if oid in _MULTIRANGE_RANGES:
            bound = self._binary_text(_RANGE_ELEMENTS[_MULTIRANGE_RANGES[oid]])
            assert bound is not None
            return functools.partial(multirange_text, bound=bound)
        return None

    def _binary_array(self, raw: bytes) -> list[Any]:
        """array_send: dimensions, lower bounds (dropped), then each element or -1 for NULL."""
        ndim, _flags, elem = struct.unpack_from("!iiI", raw)
        if ndim == 0:
            return []
        dims = [_i32.unpack_from(raw, 12 + 8 * i)[0] for i in range(ndim)]
        pos = 12 + 8 * ndim
        conv = self.binary(elem)[0]
        flat: list[Any] = []
        for _ in range(math.prod(dims)):
            (n,) = _i32.unpack_from(raw, pos)
            pos += 4
            if n < 0:
                flat.append(None)
            else:
                flat.append(conv(raw[pos:pos + n]))
                pos += n
        for size in reversed(dims[1:]):
            flat = [flat[i:i + size] for i in range(0, len(flat), size)]
        return flat


_TYPMOD: Final = re.compile(r"\(\d+(?:,\d+)?\)")


def _builtin_names() -> dict[str, int]:
    """format_type's name of each built-in type psycopg knows (and of its array) -> OID."""
    names: dict[str, int] = {}
    for t in psycopg_types:
        for oid in (t.oid, t.array_oid):
            if oid:
                names.setdefault(format_type(oid), oid)
    return names
