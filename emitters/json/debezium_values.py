"""Column values as Debezium's PostgreSQL connector puts them in its JSON change events, with
its default settings (decimal.handling.mode=precise, time.precision.mode=adaptive,
binary.handling.mode=bytes, interval.handling.mode=numeric, hstore.handling.mode=json),
as Kafka's JsonConverter writes them.

Each converter takes the server's text of a value (pgoutput's text format) and returns the
JSON-ready value, or raises Unrepresentable where Debezium's type has no value for it (a
numeric NaN, a date at infinity); the envelope (debezium.py) applies the ``unrepresentable``
option to that. docs/json-format.md ("Debezium envelope") lists the mapping;
tests/emitters/test_debezium.py holds it equal to what Debezium itself writes for the same rows.
"""

from __future__ import annotations

import binascii
import hashlib
import re
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

from orjson import Fragment

from plugin_framework.pgtypes import (
    TypeConverters,
    civil_date,
    epoch_days,
    epoch_micros,
    interval_parts,
    parse_array_text,
    time_micros,
    time_text,
    trunc_divmod,
)
from plugin_framework.pgtypes.oids import (
    BIT,
    BOOL,
    BPCHAR,
    BYTEA,
    CHAR,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    JSON,
    JSONB,
    MONEY,
    NUMERIC,
    OID,
    POINT,
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TIMETZ,
    UUID,
    VARBIT,
    VARCHAR,
    XML,
)

__all__ = ["Unrepresentable", "column_converter", "placeholder_value"]

Converter = Callable[[bytes], Any]

_DAY_US: Final = 86_400_000_000
_DAYS_PER_MONTH: Final = 365.25 / 12  # Debezium's average month
_SPECIAL_FLOATS: Final = {b"NaN": "NaN", b"Infinity": "Infinity", b"-Infinity": "-Infinity"}
_MONEY: Final = re.compile(r"(-?)\$?([\d,]*\d)\.(\d\d)")
_WKB_POINT: Final = struct.Struct("<BIdd")
# arrays whose unchanged TOASTed value is [placeholder]
_STRING_ELEMENTS: Final = frozenset({TEXT, VARCHAR, BPCHAR, CHAR, JSON, JSONB, XML})


class Unrepresentable(ValueError):
    """A value that Debezium's type for its column cannot hold."""


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode()


def _unscaled_bytes(unscaled: int) -> str:
    """An integer as Java's BigInteger.toByteArray: big-endian two's complement, shortest."""
    size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return _b64(unscaled.to_bytes(size, "big", signed=True))


def _decimal_parts(raw: bytes) -> tuple[int, int]:
    """A numeric's text as (unscaled value, scale), the scale being its digits after the
    point, as Java's BigDecimal reads it."""
    if raw in (b"NaN", b"Infinity", b"-Infinity"):
        raise Unrepresentable(f"numeric {raw.decode()} has no decimal value")
    whole, _, fraction = raw.partition(b".")
    return int(whole + fraction), len(fraction)


def _variable_decimal(raw: bytes) -> dict[str, Any]:
    """Debezium's VariableScaleDecimal: trailing zeros of the fraction dropped, as Java's
    BigDecimal.stripTrailingZeros with the scale kept at 0 or more."""
    whole, _, fraction = raw.partition(b".")
    fraction = fraction.rstrip(b"0")
    unscaled, scale = _decimal_parts(whole + b"." + fraction if fraction else whole)
    return {"scale": scale, "value": _unscaled_bytes(unscaled)}


def _fixed_decimal(scale: int) -> Converter:
    def convert(raw: bytes) -> str:
        unscaled, digits = _decimal_parts(raw)
        if digits != scale:  # a negative scale, or a text not at the column's scale
            unscaled = int(Decimal(raw.decode()).scaleb(scale))
        return _unscaled_bytes(unscaled)

    return convert


def _money(raw: bytes) -> str:
    m = _MONEY.fullmatch(raw.decode())
    if m is None:
        raise Unrepresentable(f"money {raw.decode()!r} is not in the C locale's format "
                              "(lc_monetary): cast the column to numeric")
    unscaled = int(m[2].replace(",", "") + m[3])
    return _unscaled_bytes(-unscaled if m[1] else unscaled)


def _float(raw: bytes) -> Any:
    special = _SPECIAL_FLOATS.get(raw)
    return Fragment(raw) if special is None else special


def _date(raw: bytes) -> int:
    days = epoch_days(raw.decode())
    if days is None:
        raise Unrepresentable(f"date {raw.decode()} has no day number")
    return days


def _timestamp(millis: bool) -> Converter:
    def convert(raw: bytes) -> int:
        micros = epoch_micros(raw.decode())
        if micros is None:
            raise Unrepresentable(f"timestamp {raw.decode()} has no epoch value")
        return micros // 1000 if millis else micros

    return convert


def _iso_utc(micros: int, digits: int) -> str:
    """Microseconds from 1970 as Debezium's ZonedTimestamp: ISO 8601 in UTC, the fraction
    to the column's precision, years before 1 astronomical (-0043 is 44 BC)."""
    days, rest = divmod(micros, _DAY_US)
    year, month, day = civil_date(days)
    seconds, fraction = divmod(rest, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    if year < 0:
        year_text = f"-{-year:04d}"
    elif year > 9999:
        year_text = f"+{year}"
    else:
        year_text = f"{year:04d}"
    text = f"{year_text}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    if digits:
        text += "." + f"{fraction:06d}"[:digits]
    return text + "Z"


def _timestamptz(digits: int) -> Converter:
    def convert(raw: bytes) -> str:
        if raw in (b"infinity", b"-infinity"):
            return raw.decode()
        micros = epoch_micros(raw.decode())
        if micros is None:
            raise Unrepresentable(f"timestamptz {raw.decode()} is not in DateStyle ISO")
        return _iso_utc(micros, digits)

    return convert


def _time(millis: bool) -> Converter:
    def convert(raw: bytes) -> int:
        parts = time_micros(raw.decode())
        if parts is None:
            raise Unrepresentable(f"time {raw.decode()} is not in DateStyle ISO")
        return parts[0] // 1000 if millis else parts[0]

    return convert


def _timetz(raw: bytes) -> str:
    """Debezium's ZonedTime: the time in UTC, the fraction without trailing zeros."""
    parts = time_micros(raw.decode())
    if parts is None or parts[1] is None:
        raise Unrepresentable(f"timetz {raw.decode()} is not in DateStyle ISO")
    return time_text((parts[0] - parts[1] * 1_000_000) % _DAY_US) + "Z"


def _interval(raw: bytes) -> int:
    """Debezium's MicroDuration, computed as it does: from pgjdbc's PGInterval fields, in
    doubles (a month is 30.4375 days), truncated; so ``00:00:00.000249`` is 248."""
    parts = interval_parts(raw.decode())
    if parts is None:
        raise Unrepresentable(f"interval {raw.decode()} is not in IntervalStyle postgres")
    months, days, micros = parts
    years, months = trunc_divmod(months, 12)
    hours, rest = trunc_divmod(micros, 3_600_000_000)
    minutes, rest = trunc_divmod(rest, 60_000_000)
    whole, fraction = trunc_divmod(rest, 1_000_000)
    seconds = whole + fraction / 1e6
    total_days = (years * 12 + months) * _DAYS_PER_MONTH + days
    return int(((((total_days * 24 + hours) * 60) + minutes) * 60 + seconds) * 1e6)


def _bits(raw: bytes) -> str:
    """Debezium's Bits: the bit string as a number, little-endian, shortest (empty for 0),
    as Java's BitSet.toByteArray."""
    value = int(raw, 2) if raw else 0
    return _b64(value.to_bytes((value.bit_length() + 7) // 8, "little"))


def _point(raw: bytes) -> dict[str, Any]:
    x_text, _, y_text = raw.decode().strip("()").partition(",")
    x, y = float(x_text), float(y_text)
    return {"x": x, "y": y, "wkb": _b64(_WKB_POINT.pack(1, 1, x, y)), "srid": None}


def _bytea(raw: bytes) -> str:
    if raw[:2] != b"\\x":
        raise Unrepresentable("bytea not in bytea_output = hex")
    return _b64(bytes.fromhex(raw[2:].decode()))


def _array(element: Converter) -> Converter:
    def convert(raw: bytes) -> list[Any]:
        refused: list[Unrepresentable] = []

        def one(value: bytes) -> Any:
            try:
                return element(value)
            except Unrepresentable as exc:  # parse_array_text calls any error malformed
                refused.append(exc)
                return None

        values = parse_array_text(raw, one)
        if refused:
            raise Unrepresentable(f"an element of the array: {refused[0]}")
        if any(isinstance(v, list) for v in values):
            raise Unrepresentable("a multidimensional array has no Debezium value")
        return values

    return convert


def _scalar(oid: int, typmod: int) -> Converter:
    if oid in (INT2, INT4, INT8, OID):
        return Fragment
    if oid in (FLOAT4, FLOAT8):
        return _float
    if oid == BOOL:
        return lambda raw: raw == b"t"
    if oid == NUMERIC:
        return _variable_decimal if typmod < 0 else _fixed_decimal(_numeric_scale(typmod))
    if oid == MONEY:
        return _money
    if oid == BYTEA:
        return _bytea
    if oid == DATE:
        return _date
    if oid == TIMESTAMP:
        return _timestamp(millis=0 <= typmod <= 3)
    if oid == TIMESTAMPTZ:
        return _timestamptz(6 if typmod < 0 else typmod)
    if oid == TIME:
        return _time(millis=0 <= typmod <= 3)
    if oid == TIMETZ:
        return _timetz
    if oid == INTERVAL:
        return _interval
    if oid in (BIT, VARBIT):  # one bit is a boolean, as Debezium's schema makes it
        return (lambda raw: raw == b"1") if typmod == 1 else _bits
    if oid == POINT:
        return _point
    return bytes.decode  # text, varchar, uuid, json, jsonb, inet, ranges, ...: their text


def _numeric_scale(typmod: int) -> int:
    scale = (typmod - 4) & 0x7FF
    return scale - 0x800 if scale & 0x400 else scale  # PostgreSQL 15's negative scales


def column_converter(types: TypeConverters, type_oid: int, type_name: str | None,
                     typmod: int) -> Converter:
    """The converter of a column's text values (enums and unknown types: their text;
    domains: their base type's, with the domain's type modifier)."""
    kind, oid = types.resolve(type_oid, type_name)
    if kind == "array":
        if not oid:
            return _array(bytes.decode)
        element_kind, element = types.resolve(oid)
        if element_kind != "builtin":
            return _array(bytes.decode)
        # an array column's typmod is its elements'; a domain element brings its own
        return _array(_scalar(element, typmod if element == oid else _domain_typmod(types, oid)))
    if kind != "builtin":
        return bytes.decode
    if oid != type_oid and typmod < 0:  # a domain: numeric(10,2), timestamp(3)...
        typmod = _domain_typmod(types, type_oid)
    return _scalar(oid, typmod)


def _domain_typmod(types: TypeConverters, domain: int) -> int:
    """The type modifier a domain gives its base type (-1 without the catalog)."""
    if types.catalog is None:
        return -1
    rows = types.catalog.query("SELECT typtypmod FROM pg_catalog.pg_type WHERE oid = %s",
                               (domain,))
    return int(rows[0][0]) if rows else -1


def placeholder_value(types: TypeConverters, type_oid: int, type_name: str | None,
                      placeholder: str) -> Any:
    """What stands for an unchanged TOASTed value of the type, as Debezium puts it: the
    placeholder; as bytes for bytea; in an array of strings or of bytea; as the numbers of
    its bytes for arrays of integers and dates; as the name-based UUID of its bytes for
    arrays of uuid. (Debezium sends null for other arrays; this sends the placeholder.)"""
    kind, oid = types.resolve(type_oid, type_name)
    data = placeholder.encode()
    if kind == "array":
        if oid in (INT2, INT4, INT8, DATE):
            return list(data)
        if oid == BYTEA:
            return [_b64(data)]
        if oid == UUID:
            return [str(uuid.UUID(bytes=hashlib.md5(data).digest(), version=3))]
        if oid in _STRING_ELEMENTS or not oid:
            return [placeholder]
        return placeholder
    if kind == "builtin" and oid == BYTEA:
        return _b64(data)
    return placeholder
