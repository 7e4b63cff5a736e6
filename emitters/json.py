"""The ``json`` emitter: pgdecode's native change format, one JSON object per line.

    {"op":"insert","schema":"public","table":"items","lsn":"0/1A2B3C8","xid":741,
     "commit_lsn":"0/1A2B4F0","commit_time":"2024-05-01T12:00:00.123456+00:00","origin":null,
     "key":["id"],"new":{"id":1,"name":"one","price":"1.50"}}

The format, its options and the type mapping are documented in docs/json-format.md and
specified by docs/json-change.schema.json.

Speed: a line is assembled from byte strings computed once per relation (its op, schema and
table prefix, its key list) and once per transaction (xid, commit LSN and time, origin, gid);
only the row objects go through orjson. Each column has a converter chosen once per relation
from its type: for the common types the server's text is already the JSON value (integers,
finite floats, json, jsonb) and is embedded verbatim as an ``orjson.Fragment``, so nothing is
parsed. Binary-format values (pgoutput's ``binary`` option) are decoded to the text the server
would have sent, then converted by the same rules, so that the JSON is the same whichever
format the server used.

The fast path: where the C module ``emitters._jsonrow`` is built (it is, by ``pip install``
with a C compiler), each relation's plan also gets a ``RowFormat`` that writes the line of an
Insert, Update or Delete straight from the pgoutput message, which the pipeline then uses
instead of decoding the message and calling ``change`` (``fast_change``). It takes the
common forms of the common types' text; it hands any other value to the column's Python
converter, and anything else (binary-format columns, malformed data) back to ``change``, so
the lines are the same either way: tests/test_json_native.py holds the two to that.
"""

from __future__ import annotations

import binascii
import contextlib
import functools
import math
import operator
import re
import struct
import uuid
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address
from typing import Any, Final

import orjson

from emitters.options import Option, parse_options
from plugin_framework import LSN, OutputPlugin
from plugin_framework.framework.format_type import format_type
from plugin_framework.protocol import KIND_BINARY, KIND_NULL, KIND_TEXT, KIND_UNCHANGED_TOAST

try:
    from emitters import _jsonrow
except ImportError:  # installed without a C compiler: every line is formatted in Python
    _jsonrow = None  # type: ignore[assignment]

__all__ = ["JsonEmitter", "TypeConverters"]

Converter = Callable[[bytes], Any]

_Fragment: Final = orjson.Fragment
_dumps: Final = orjson.dumps
_call: Final = operator.call

# --- built-in type OIDs -----------------------------------------------------------------------

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, TID, XID, CID = (
    16, 17, 18, 19, 20, 21, 23, 25, 26, 27, 28, 29)
JSON, XML, POINT, LSEG, PATH, BOX, POLYGON, LINE, CIDR = (
    114, 142, 600, 601, 602, 603, 604, 628, 650)
FLOAT4, FLOAT8, UNKNOWN, CIRCLE, MACADDR8, MONEY, MACADDR, INET = (
    700, 701, 705, 718, 774, 790, 829, 869)
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = (
    1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266)
BIT, VARBIT, NUMERIC, REFCURSOR, UUID, PG_LSN, TSVECTOR, TSQUERY, JSONB, JSONPATH, XID8 = (
    1560, 1562, 1700, 1790, 2950, 3220, 3614, 3615, 3802, 4072, 5069)
INT4RANGE, NUMRANGE, TSRANGE, TSTZRANGE, DATERANGE, INT8RANGE = (
    3904, 3906, 3908, 3910, 3912, 3926)
INT4MULTIRANGE, NUMMULTIRANGE, TSMULTIRANGE, TSTZMULTIRANGE, DATEMULTIRANGE, INT8MULTIRANGE = (
    4451, 4532, 4533, 4534, 4535, 4536)

_RANGE_ELEMENTS: Final = {INT4RANGE: INT4, NUMRANGE: NUMERIC, TSRANGE: TIMESTAMP,
                          TSTZRANGE: TIMESTAMPTZ, DATERANGE: DATE, INT8RANGE: INT8}
_MULTIRANGE_RANGES: Final = {INT4MULTIRANGE: INT4RANGE, NUMMULTIRANGE: NUMRANGE,
                             TSMULTIRANGE: TSRANGE, TSTZMULTIRANGE: TSTZRANGE,
                             DATEMULTIRANGE: DATERANGE, INT8MULTIRANGE: INT8RANGE}


def _builtin_arrays() -> tuple[dict[int, int], dict[int, bytes]]:
    """Array type OID -> element OID, and element OID -> the delimiter of its arrays' text
    (a comma, but for box), for every built-in type psycopg knows."""
    from psycopg.postgres import types

    return ({t.array_oid: t.oid for t in types if t.array_oid},
            {t.oid: t.delimiter.encode() for t in types if t.delimiter != ","})


_ARRAYS, _DELIMITERS = _builtin_arrays()

# --- text format: the server's text -> a JSON-ready value -------------------------------------


def _t_float(raw: bytes) -> Any:
    """Finite: the server's digits as a JSON number. NaN, Infinity, -Infinity: strings."""
    return _Fragment(raw) if 47 < raw[-1] < 58 else raw.decode()


# boolean text is "t" or "f": a dict lookup, called from C, is the cheapest conversion
_t_bool: Final[Callable[[bytes], bool]] = {b"t": True, b"f": False}.__getitem__


def _t_json(raw: bytes) -> Any:
    """json and jsonb text is JSON already. A json value may span lines; a line break can only
    be whitespace between tokens (the server rejects raw control characters in strings), so it
    becomes a space and the value stays exactly the same."""
    if b"\n" in raw or b"\r" in raw:
        raw = raw.replace(b"\r", b" ").replace(b"\n", b" ")
    return _Fragment(raw)


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


def _t_bytea_hex(raw: bytes) -> str:
    if raw[:2] == b"\\x":
        return raw[2:].decode()
    return _bytea_from_text(raw).hex()


def _t_bytea_base64(raw: bytes) -> str:
    return binascii.b2a_base64(_bytea_from_text(raw), newline=False).decode()


def _iso_datetime(raw: bytes) -> str | None:
    """``2024-01-02 03:04:05`` -> ``2024-01-02T03:04:05``; None if not an ISO DateStyle text
    of a year AD (infinity, BC, other DateStyles stay as the server wrote them)."""
    if raw[4:5] == b"-" and raw[10:11] == b" " and raw[-1] != 67:
        # The common case, quickly: ISO, a four-digit year AD, the time after position 10
        return raw.replace(b" ", b"T", 1).decode()
    sp = raw.find(b" ")
    if sp < 8 or raw[sp - 3] != 45 or raw[-1] == 67:  # '-' before the day; "... BC"
        return None
    text = raw.decode()
    return text[:sp] + "T" + text[sp + 1:]


def _t_timestamp(raw: bytes) -> str:
    text = _iso_datetime(raw)
    return raw.decode() if text is None else text


def _t_timestamptz(raw: bytes) -> str:
    text = _iso_datetime(raw)
    if text is None:
        return raw.decode()
    return text + ":00" if text[-3] in "+-" else text  # "+02" -> "+02:00"


def _t_timetz(raw: bytes) -> str:
    text = raw.decode()
    return text + ":00" if text[-3] in "+-" else text


_INTERVAL_UNITS: Final = {"year": 12, "years": 12, "mon": 1, "mons": 1}
_INTERVAL_TIME: Final = re.compile(r"([+-]?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


def _t_interval(raw: bytes) -> str:
    """PostgreSQL's default (``postgres``) interval text as IntervalStyle ``iso_8601`` would
    print it; any other text (other IntervalStyles, infinity) as the server wrote it."""
    text = raw.decode()
    months = days = micros = 0
    parts = text.split(" ")
    i = 0
    try:
        while i < len(parts):
            part = parts[i]
            if ":" in part:
                m = _INTERVAL_TIME.fullmatch(part)
                if m is None:
                    return text
                value = ((int(m[2]) * 60 + int(m[3])) * 60 + int(m[4])) * 1_000_000
                value += int((m[5] or "0").ljust(6, "0"))
                micros += -value if m[1] == "-" else value
                i += 1
                continue
            number, unit = int(part), parts[i + 1]
            if unit in ("day", "days"):
                days += number
            else:
                months += number * _INTERVAL_UNITS[unit]
            i += 2
    except (ValueError, KeyError, IndexError):
        return text
    return iso_interval(months, days, micros)


def _trunc_divmod(a: int, b: int) -> tuple[int, int]:
    """C's integer division and remainder (truncating toward zero)."""
    q = abs(a) // b
    q = -q if a < 0 else q
    return q, a - q * b


def iso_interval(months: int, days: int, micros: int) -> str:
    """An interval as PostgreSQL prints it with IntervalStyle ``iso_8601`` (EncodeInterval)."""
    year, mon = _trunc_divmod(months, 12)
    hour, rest = _trunc_divmod(micros, 3_600_000_000)
    minute, rest = _trunc_divmod(rest, 60_000_000)
    sec, fsec = _trunc_divmod(rest, 1_000_000)
    if not (year or mon or days or hour or minute or sec or fsec):
        return "PT0S"
    out = ["P"]
    for value, unit in ((year, "Y"), (mon, "M"), (days, "D")):
        if value:
            out.append(f"{value}{unit}")
    if hour or minute or sec or fsec:
        out.append("T")
    for value, unit in ((hour, "H"), (minute, "M")):
        if value:
            out.append(f"{value}{unit}")
    if sec or fsec:
        if sec < 0 or fsec < 0:
            out.append("-")
        out.append(str(abs(sec)))
        if fsec:
            out.append("." + f"{abs(fsec):06d}".rstrip("0"))
        out.append("S")
    return "".join(out)


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
    from psycopg.adapt import Transformer
    from psycopg.pq import Format

    loaders = Transformer()
    return (loaders.get_loader(1009, Format.TEXT).load,  # text[]
            loaders.get_loader(1016, Format.TEXT).load,  # bigint[]
            loaders.get_loader(1000, Format.TEXT).load)  # boolean[]


_TEXT_ARRAY, _INTEGER_ARRAY, _BOOL_ARRAY = _psycopg_array_loaders()
_INTEGERS: Final = frozenset((INT2, INT4, INT8, OID, XID, CID, XID8))


def _psycopg_array(element_oid: int, element: Converter) -> Converter | None:
    """psycopg's parser for arrays whose elements' JSON values it produces exactly: text as
    ``str`` (any element converted by ``bytes.decode``), integers as ``int`` (orjson prints the
    server's digits), booleans as ``bool``; None for the others."""
    if element is bytes.decode:
        return _TEXT_ARRAY
    if element_oid in _INTEGERS:
        return _INTEGER_ARRAY
    if element_oid == BOOL:
        return _BOOL_ARRAY
    return None


# --- binary format: the send format -> the server's text --------------------------------------

_i32, _i64 = struct.Struct("!i"), struct.Struct("!q")
_u64 = struct.Struct("!Q")
_f32, _f64 = struct.Struct("!f"), struct.Struct("!d")
_INT32_MAX, _INT32_MIN = 2**31 - 1, -(2**31)
_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)
_PG_EPOCH_DAYS: Final = 10957  # 2000-01-01 - 1970-01-01
_DAY_US: Final = 86_400_000_000


def _float_layout(negative: bool, digits: str, exp: int, fixed_below: int) -> str:
    """Shortest digits and decimal exponent laid out as PostgreSQL's float4out/float8out do
    (fixed notation for exponents -4 .. fixed_below-1, else d.ddde+XX)."""
    sign = "-" if negative else ""
    if -4 <= exp < fixed_below:
        if exp < 0:
            return f"{sign}0.{'0' * (-exp - 1)}{digits}"
        if len(digits) <= exp + 1:
            return sign + digits + "0" * (exp + 1 - len(digits))
        return f"{sign}{digits[:exp + 1]}.{digits[exp + 1:]}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _nonfinite(x: float) -> str | None:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return None


def _shortest(text: str) -> tuple[str, int]:
    """Digits without leading or trailing zeros, and the decimal exponent of the first one,
    of the unsigned number ``text`` (as repr or %e print it)."""
    mantissa, _, e = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    lead = len(whole) - (len(whole + frac) - len(digits)) - 1
    digits = digits.rstrip("0") or "0"
    return digits, (int(e) if e else 0) + lead


def pg_float8_text(x: float) -> str:
    """A float8 as the server prints it (extra_float_digits >= 1, the default since 12)."""
    special = _nonfinite(x)
    if special is not None:
        return special
    text = repr(x)  # the same shortest digits; exponent form below 1e-4 and from 1e16 as well
    if "e" in text:
        return text
    if -1e15 < x < 1e15:
        return text[:-2] if text.endswith(".0") else text
    digits, exp = _shortest(text.lstrip("-"))  # 1e15 <= |x| < 1e16: exponent form for us
    return _float_layout(x < 0, digits, exp, 15)


def _pg_float4_text(raw: bytes) -> str:
    (x,) = _f32.unpack(raw)
    special = _nonfinite(x)
    if special is not None:
        return special
    if x == 0:
        return "-0" if raw[0] & 0x80 else "0"
    target = _f32.pack(abs(x))
    for p in range(9):  # the shortest %e that reads back as the same float4
        text = f"{abs(x):.{p}e}"
        with contextlib.suppress(OverflowError):  # rounded up past the largest float4
            if _f32.pack(float(text)) == target:
                break
    digits, exp = _shortest(text)
    return _float_layout(x < 0, digits, exp, 6)


def _b_int_text(raw: bytes) -> str:
    return str(int.from_bytes(raw, "big", signed=True))


def _b_float8_text(raw: bytes) -> str:
    return pg_float8_text(_f64.unpack(raw)[0])


def _b_numeric_text(raw: bytes) -> str:
    """numeric_send -> numeric_out, digit for digit."""
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", raw)
    if sign == 0xC000:
        return "NaN"
    if sign == 0xD000:
        return "Infinity"
    if sign == 0xF000:
        return "-Infinity"
    digits = struct.unpack_from(f"!{ndigits}h", raw, 8)

    def group(w: int) -> int:  # the base-10000 digit of weight w
        i = weight - w
        return digits[i] if 0 <= i < ndigits else 0

    if weight >= 0:
        whole = str(group(weight)) + "".join(f"{group(w):04d}" for w in range(weight - 1, -1, -1))
    else:
        whole = "0"
    out = ("-" if sign == 0x4000 else "") + whole
    if dscale > 0:
        frac = "".join(f"{group(-k):04d}" for k in range(1, (dscale + 3) // 4 + 1))
        out += "." + frac[:dscale]
    return out


def _civil(days: int) -> tuple[int, int, int]:
    """Year, month, day of a day count from 1970-01-01, proleptic Gregorian, year 0 = 1 BC."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def _date_parts(days: int) -> tuple[str, bool]:
    """A PostgreSQL date (days from 2000-01-01) as ``YYYY-MM-DD`` and whether it is BC."""
    y, m, d = _civil(days + _PG_EPOCH_DAYS)
    bc = y <= 0
    return f"{1 - y if bc else y:04d}-{m:02d}-{d:02d}", bc


def _time_text(us: int) -> str:
    sec, frac = divmod(us, 1_000_000)
    minute, sec = divmod(sec, 60)
    hour, minute = divmod(minute, 60)
    text = f"{hour:02d}:{minute:02d}:{sec:02d}"
    return text + "." + f"{frac:06d}".rstrip("0") if frac else text


def _offset_text(seconds_east: int) -> str:
    sign = "-" if seconds_east < 0 else "+"
    minutes, sec = divmod(abs(seconds_east), 60)
    hour, minute = divmod(minutes, 60)
    text = f"{sign}{hour:02d}"
    if minute or sec:
        text += f":{minute:02d}"
    if sec:
        text += f":{sec:02d}"
    return text


def _b_date_text(raw: bytes) -> str:
    (days,) = _i32.unpack(raw)
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    text, bc = _date_parts(days)
    return text + " BC" if bc else text


def _timestamp_text(raw: bytes, zone: str) -> str:
    (us,) = _i64.unpack(raw)
    if us == _INT64_MAX:
        return "infinity"
    if us == _INT64_MIN:
        return "-infinity"
    days, us = divmod(us, _DAY_US)
    date, bc = _date_parts(days)
    text = f"{date} {_time_text(us)}{zone}"
    return text + " BC" if bc else text


def _b_timestamp_text(raw: bytes) -> str:
    return _timestamp_text(raw, "")


def _b_timestamptz_text(raw: bytes) -> str:
    """In UTC: the binary format carries no time zone."""
    return _timestamp_text(raw, "+00")


def _b_time_text(raw: bytes) -> str:
    return _time_text(_i64.unpack(raw)[0])


def _b_timetz_text(raw: bytes) -> str:
    us, zone = struct.unpack("!qi", raw)
    return _time_text(us) + _offset_text(-zone)


def _b_interval_iso(raw: bytes) -> str:
    us, days, months = struct.unpack("!qii", raw)
    if us == _INT64_MAX and days == _INT32_MAX and months == _INT32_MAX:
        return "infinity"
    if us == _INT64_MIN and days == _INT32_MIN and months == _INT32_MIN:
        return "-infinity"
    return iso_interval(months, days, us)


def _ipv6_text(addr: bytes) -> str:
    """An IPv6 address as PostgreSQL prints it (BIND's inet_ntop6): the longest run of two or
    more zero groups as "::", and the last 32 bits dotted after ::, ::ffff: or ::ffff:0:."""
    words = struct.unpack("!8H", addr)
    best_base, best_len, base = -1, 0, -1
    for i in range(9):
        if i < 8 and words[i] == 0:
            if base < 0:
                base = i
        elif base >= 0:
            if i - base > best_len:
                best_base, best_len = base, i - base
            base = -1
    if best_len < 2:
        best_base = -1
    out = []
    for i in range(8):
        if best_base <= i < best_base + best_len:
            if i == best_base:
                out.append(":")
            continue
        if i:
            out.append(":")
        if i == 6 and best_base == 0 and (best_len == 6
                                          or (best_len == 5 and words[5] == 0xFFFF)):
            out.append(str(IPv4Address(addr[12:])))
            break
        out.append(f"{words[i]:x}")
    if best_base >= 0 and best_base + best_len == 8:
        out.append(":")
    return "".join(out)


def _b_inet_text(raw: bytes) -> str:
    family, bits, is_cidr, nb = raw[0], raw[1], raw[2], raw[3]
    addr = raw[4:4 + nb]
    if family == 2:
        text, full = str(IPv4Address(addr.ljust(4, b"\0"))), 32
    else:
        text, full = _ipv6_text(addr.ljust(16, b"\0")), 128
    return text if bits == full and not is_cidr else f"{text}/{bits}"


def _b_bits_text(raw: bytes) -> str:
    (nbits,) = _i32.unpack_from(raw)
    return "".join(f"{b:08b}" for b in raw[4:])[:nbits]


def _b_char_text(raw: bytes) -> str:
    """The "char" type: one byte, printed in octal when not ASCII (charout)."""
    if not raw or raw == b"\0":
        return ""
    return raw.decode() if raw[0] < 128 else f"\\{raw[0]:03o}"


def _points(raw: bytes, pos: int, n: int) -> str:
    values = struct.unpack_from(f"!{2 * n}d", raw, pos)
    return ",".join(f"({pg_float8_text(values[2 * i])},{pg_float8_text(values[2 * i + 1])})"
                    for i in range(n))


def _b_point_text(raw: bytes) -> str:
    return _points(raw, 0, 1)


def _b_lseg_text(raw: bytes) -> str:
    return f"[{_points(raw, 0, 2)}]"


def _b_box_text(raw: bytes) -> str:
    return _points(raw, 0, 2)


def _b_line_text(raw: bytes) -> str:
    return "{" + ",".join(pg_float8_text(v) for v in struct.unpack("!3d", raw)) + "}"


def _b_path_text(raw: bytes) -> str:
    closed, (n,) = raw[0], _i32.unpack_from(raw, 1)
    inner = _points(raw, 5, n)
    return f"({inner})" if closed else f"[{inner}]"


def _b_polygon_text(raw: bytes) -> str:
    return f"({_points(raw, 4, _i32.unpack_from(raw)[0])})"


def _b_circle_text(raw: bytes) -> str:
    x, y, r = struct.unpack("!3d", raw)
    return f"<({pg_float8_text(x)},{pg_float8_text(y)}),{pg_float8_text(r)}>"


def _b_pg_lsn_text(raw: bytes) -> str:
    return str(LSN(_u64.unpack(raw)[0]))


def _b_tid_text(raw: bytes) -> str:
    block, offset = struct.unpack("!IH", raw)
    return f"({block},{offset})"


_RANGE_SPECIAL: Final = re.compile(r'["\\(),\[\]\s]')


def _range_bound(text: str) -> str:
    if text and _RANGE_SPECIAL.search(text) is None:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def _range_text(raw: bytes, bound: Callable[[bytes], str], pos: int = 0) -> tuple[str, int]:
    flags = raw[pos]
    pos += 1
    if flags & 0x01:
        return "empty", pos
    texts = []
    for present in (not flags & 0x08, not flags & 0x10):
        if present:
            (n,) = _i32.unpack_from(raw, pos)
            texts.append(_range_bound(bound(raw[pos + 4:pos + 4 + n])))
            pos += 4 + n
        else:
            texts.append("")
    lower = "[" if flags & 0x02 else "("
    upper = "]" if flags & 0x04 else ")"
    return f"{lower}{texts[0]},{texts[1]}{upper}", pos


def _single_range_text(raw: bytes, bound: Callable[[bytes], str]) -> str:
    return _range_text(raw, bound)[0]


def _multirange_text(raw: bytes, bound: Callable[[bytes], str]) -> str:
    (count,) = _i32.unpack_from(raw)
    pos, texts = 4, []
    for _ in range(count):
        (n,) = _i32.unpack_from(raw, pos)
        texts.append(_range_text(raw[pos + 4:pos + 4 + n], bound)[0])
        pos += 4 + n
    return "{" + ",".join(texts) + "}"


# --- the converters of one emitter (its options) ------------------------------------------------

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
            fast = _psycopg_array(oid, element) if delim == b"," else None
            if fast is not None:
                return fast
            return lambda raw: parse_array_text(raw, element, delim)
        if kind != "builtin":
            return bytes.decode
        return self._scalar_text(oid)

    def _scalar_text(self, oid: int) -> Converter:
        if oid in (INT2, INT4, INT8, OID, XID, CID, XID8):
            return _Fragment
        if oid in (FLOAT4, FLOAT8):
            return _t_float
        if oid == NUMERIC:
            return _t_float if self.numeric_as == "number" else bytes.decode
        if oid == BOOL:
            return _t_bool
        if oid == JSONB:
            return _Fragment  # jsonb's text is one line: jsonb_out escapes line breaks
        if oid == JSON:
            return _t_json
        if oid == BYTEA:
            return _t_bytea_hex if self.bytea == "hex" else _t_bytea_base64
        if oid == TIMESTAMP:
            return _t_timestamp
        if oid == TIMESTAMPTZ:
            return _t_timestamptz
        if oid == TIMETZ:
            return _t_timetz
        if oid == INTERVAL:
            return _t_interval
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
            return _t_json
        if oid == JSONB:
            return lambda raw: _t_json(raw[1:])  # a version byte, then the text
        if oid == INTERVAL:
            return _b_interval_iso
        if oid in (TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN, XML, REFCURSOR):
            return bytes.decode
        if oid == JSONPATH:
            return lambda raw: raw[1:].decode()  # a version byte, then the text
        return None

    def _binary_text(self, oid: int) -> Callable[[bytes], str] | None:
        """The server's text of a binary value, for the types pgdecode can render."""
        simple: dict[int, Callable[[bytes], str]] = {
            FLOAT4: _pg_float4_text, FLOAT8: _b_float8_text, NUMERIC: _b_numeric_text,
            DATE: _b_date_text, TIME: _b_time_text, TIMETZ: _b_timetz_text,
            TIMESTAMP: _b_timestamp_text, TIMESTAMPTZ: _b_timestamptz_text,
            UUID: lambda raw: str(uuid.UUID(bytes=raw)), INET: _b_inet_text,
            CIDR: _b_inet_text, MACADDR: lambda raw: raw.hex(":"),
            MACADDR8: lambda raw: raw.hex(":"), BIT: _b_bits_text, VARBIT: _b_bits_text,
            PG_LSN: _b_pg_lsn_text, TID: _b_tid_text, CHAR: _b_char_text,
            POINT: _b_point_text, LSEG: _b_lseg_text, BOX: _b_box_text, LINE: _b_line_text,
            PATH: _b_path_text, POLYGON: _b_polygon_text, CIRCLE: _b_circle_text,
            INT4: _b_int_text, INT8: _b_int_text,  # as range bounds
        }
        if oid in simple:
            return simple[oid]
        if oid in _RANGE_ELEMENTS:
            bound = self._binary_text(_RANGE_ELEMENTS[oid])
            assert bound is not None
            return functools.partial(_single_range_text, bound=bound)
        if oid in _MULTIRANGE_RANGES:
            bound = self._binary_text(_RANGE_ELEMENTS[_MULTIRANGE_RANGES[oid]])
            assert bound is not None
            return functools.partial(_multirange_text, bound=bound)
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
    from psycopg.postgres import types

    names: dict[str, int] = {}
    for t in types:
        for oid in (t.oid, t.array_oid):
            if oid:
                names.setdefault(format_type(oid), oid)
    return names


# --- per relation: names, converters, and the bytes of the line's fixed parts -------------------

_IDENTITY: Final = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


class _Plan:
    __slots__ = ("all_binary", "all_text", "bconv", "fast", "heads", "key_idx", "names",
                 "opaque", "tconv", "truncate_head")

    def __init__(self, relation: Any, types: TypeConverters) -> None:
        columns = relation.columns
        self.names = tuple(c.name for c in columns)
        self.tconv = tuple(types.text(c.type_oid, c.type_name) for c in columns)
        binary = [types.binary(c.type_oid, c.type_name) for c in columns]
        self.bconv = tuple(b[0] for b in binary)
        self.opaque = tuple(i for i, b in enumerate(binary) if b[1])
        self.all_text = bytes([KIND_TEXT]) * len(columns)
        self.all_binary = bytes([KIND_BINARY]) * len(columns)
        self.key_idx = tuple(i for i, c in enumerate(columns) if c.is_key)
        where = _dumps({"schema": relation.namespace, "table": relation.name})[1:-1]
        key = (b',"key":' + _dumps([c.name for c in columns if c.is_key])
               + b',"identity":"'
               + _IDENTITY.get(relation.replica_identity, "default").encode() + b'"')
        # (before the LSN, after the transaction's fields) for each action
        self.heads = {action: (b'{"op":"' + action.lower().encode() + b'",' + where, key)
                      for action in ("INSERT", "UPDATE", "DELETE")}
        self.truncate_head = b'{"op":"truncate",' + where
        self.fast = None if _jsonrow is None else _jsonrow.RowFormat(
            relation.relation_id,
            tuple(part for action in ("INSERT", "UPDATE", "DELETE")
                  for part in self.heads[action]),
            tuple(_dumps(name) for name in self.names),
            bytes(_native_code(conv) for conv in self.tconv),
            self.tconv, self.key_idx, _dumps).line


def _native_code(conv: Converter) -> int:
    """How emitters._jsonrow converts a column whose text converter is ``conv``: natively
    for the converters it knows, else by calling ``conv`` (PYCALL)."""
    assert _jsonrow is not None
    for known, code in (
            (_Fragment, _jsonrow.VERBATIM), (bytes.decode, _jsonrow.STRING),
            (_t_float, _jsonrow.FLOAT), (_t_bool, _jsonrow.BOOL), (_t_json, _jsonrow.JSON),
            (_t_timestamp, _jsonrow.TIMESTAMP), (_t_timestamptz, _jsonrow.TIMESTAMPTZ),
            (_TEXT_ARRAY, _jsonrow.ARRAY_TEXT), (_INTEGER_ARRAY, _jsonrow.ARRAY_INT),
            (_BOOL_ARRAY, _jsonrow.ARRAY_BOOL)):
        if conv is known:
            return code
    return _jsonrow.PYCALL


_NO_TOAST: Final[list[str]] = []


def _row(plan: _Plan, data: Any) -> tuple[dict[str, Any], list[str]]:
    """A tuple as {column: value}, and the names of its unchanged TOAST columns (left out).
    The list returned for a row without any is shared: never modify it."""
    kinds, values = data.kinds, data.values
    if kinds == plan.all_text:
        return dict(zip(plan.names, map(_call, plan.tconv, values), strict=True)), _NO_TOAST
    if kinds == plan.all_binary:
        return dict(zip(plan.names, map(_call, plan.bconv, values), strict=True)), _NO_TOAST
    return _row_mixed(plan, kinds, values, range(len(kinds)))


def _row_mixed(plan: _Plan, kinds: bytes, values: Sequence[Any],
               columns: Sequence[int]) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    toast: list[str] = []
    names, tconv, bconv = plan.names, plan.tconv, plan.bconv
    for i in columns:
        k = kinds[i]
        if k == KIND_TEXT:
            out[names[i]] = tconv[i](values[i])
        elif k == KIND_NULL:
            out[names[i]] = None
        elif k == KIND_BINARY:
            out[names[i]] = bconv[i](values[i])
        elif k == KIND_UNCHANGED_TOAST:
            toast.append(names[i])
    return out, toast


def _opaque_columns(plan: _Plan, *rows: Any) -> list[str]:
    found = []
    for i in plan.opaque:
        if any(r is not None and r.data.kinds[i] == KIND_BINARY for r in rows):
            found.append(plan.names[i])
    return found


# --- the emitter ------------------------------------------------------------------------------


def _choice(*allowed: str) -> Callable[[str | None], str]:
    def parse(text: str | None) -> str:
        value = (text or "").strip().lower()
        if value not in allowed:
            raise ValueError(f"expected {' or '.join(allowed)}")
        return value

    return parse


OPTIONS: Final = [
    Option("numeric-as", "string", _choice("string", "number"),
           "numeric values as JSON strings (exact, default) or as JSON numbers (the server's "
           "digits verbatim; NaN and infinities stay strings)"),
    Option("bytea", "hex", _choice("hex", "base64"), "bytea values as hex or base64 strings"),
    Option("two-phase", False, None,
           "emit prepared transactions at PREPARE TRANSACTION (phase \"prepare\"), then a "
           "commit_prepared or rollback_prepared line; off: at COMMIT PREPARED only"),
    Option("include-transaction-events", False, None,
           "also emit begin, commit and prepare lines"),
]


def _lsn(value: Any) -> str | None:
    return None if value is None else str(value)


def _txn_fields(txn: Any) -> bytes:
    """The transaction's part of every line of it: ``,"xid":...`` up to the origin, and gid
    and phase for a prepared transaction."""
    fields: dict[str, Any] = {"xid": txn.xid}
    if txn.gid is not None and txn.is_prepared:
        fields.update(commit_lsn=None, commit_time=None, origin=txn.origin, gid=txn.gid,
                      phase="prepare", prepare_lsn=_lsn(txn.final_lsn),
                      prepare_time=txn.prepare_time)
    else:
        fields.update(commit_lsn=_lsn(txn.final_lsn), commit_time=txn.commit_time,
                      origin=txn.origin)
        if txn.gid is not None:
            fields.update(gid=txn.gid, phase="commit_prepared")
    return b"," + _dumps(fields)[1:-1]


def _txn_bytes(txn: Any) -> bytes:
    cached = txn.output_plugin_private
    if type(cached) is not bytes:
        cached = txn.output_plugin_private = _txn_fields(txn)
    return cached


_NO_TXN: Final = b',"xid":null,"commit_lsn":null,"commit_time":null,"origin":null'


class _State:
    """One decoding context's options, converters and per-relation plans."""

    __slots__ = ("events", "last", "plans", "types")

    def __init__(self, options: dict[str, Any], catalog: Any) -> None:
        self.types = TypeConverters(numeric_as=options["numeric-as"], bytea=options["bytea"],
                                    catalog=catalog)
        self.events: bool = options["include-transaction-events"]
        self.plans: dict[Any, _Plan] = {}  # by Relation object: a new description, a new plan
        self.last: tuple[Any, _Plan | None] = (None, None)

    def plan(self, relation: Any) -> _Plan:
        last, plan = self.last
        if relation is last and plan is not None:
            return plan
        plan = self.plans.get(relation)
        if plan is None:
            plan = self.plans[relation] = _Plan(relation, self.types)
        self.last = (relation, plan)
        return plan


class JsonEmitter(OutputPlugin):
    """JSON Lines: one object per row change, truncated table and logical message; with
    options, per transaction boundary. See docs/json-format.md."""

    name = "json"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        values = parse_options(OPTIONS, ctx.output_plugin_options or {})
        ctx.output_plugin_private = _State(values, ctx.catalog)
        if not values["two-phase"]:
            ctx.twophase = False  # prepared transactions then arrive whole, at COMMIT PREPARED

    def fast_change(self, ctx: Any, relation: Any) -> Any:
        return ctx.output_plugin_private.plan(relation).fast  # None without emitters._jsonrow

    # -- transactions

    def _event(self, ctx: Any, op: str, txn: Any, **extra: Any) -> None:
        tail = b"," + _dumps(extra)[1:-1] if extra else b""
        ctx.emit(b'{"op":"' + op.encode() + b'"' + _txn_bytes(txn) + tail + b"}")

    def begin(self, ctx: Any, txn: Any) -> None:
        txn.output_plugin_private = _txn_fields(txn)
        if ctx.output_plugin_private.events:
            self._event(ctx, "begin", txn)

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        if ctx.output_plugin_private.events:
            self._event(ctx, "commit", txn, end_lsn=_lsn(txn.end_lsn))

    def begin_prepare(self, ctx: Any, txn: Any) -> None:
        self.begin(ctx, txn)

    def prepare(self, ctx: Any, txn: Any, prepare_lsn: LSN) -> None:
        if ctx.output_plugin_private.events:
            self._event(ctx, "prepare", txn, end_lsn=_lsn(txn.end_lsn))

    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        ctx.emit(_dumps({
            "op": "commit_prepared", "xid": txn.xid, "commit_lsn": str(commit_lsn),
            "commit_time": txn.commit_time, "origin": txn.origin, "gid": txn.gid,
            "end_lsn": _lsn(txn.end_lsn),
        }))

    def rollback_prepared(self, ctx: Any, txn: Any, prepare_end_lsn: LSN,
                          prepare_time: Any) -> None:
        ctx.emit(_dumps({
            "op": "rollback_prepared", "xid": txn.xid, "origin": txn.origin, "gid": txn.gid,
            "prepare_end_lsn": _lsn(prepare_end_lsn), "prepare_time": prepare_time,
            "end_lsn": _lsn(txn.end_lsn),
        }))

    # -- changes

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        state = ctx.output_plugin_private
        last, plan = state.last
        if relation is not last or plan is None:
            plan = state.plan(relation)
        fields = txn.output_plugin_private
        if type(fields) is not bytes:
            fields = _txn_bytes(txn)
        action = change.action
        before, key = plan.heads[action]
        new, old = change.new, change.old
        if action == "INSERT":
            body = b',"new":' + _dumps(_row(plan, new.data)[0])
        else:
            if old is None:
                body = b',"old_is_key":false,"old":null'
            else:
                data = old.data
                if change.old_is_key:  # only the identity columns are meaningful
                    values, toast = _row_mixed(plan, data.kinds, data.values, plan.key_idx)
                    body = b',"old_is_key":true,"old":' + _dumps(values)
                else:
                    values, toast = _row(plan, data)
                    body = b',"old_is_key":false,"old":' + _dumps(values)
                if toast:
                    body += b',"old_unchanged_toast":' + _dumps(toast)
            if action == "UPDATE":
                values, toast = _row(plan, new.data)
                body += b',"new":' + _dumps(values) + b',"unchanged_toast":' + _dumps(toast)
        if plan.opaque and ((new is not None and KIND_BINARY in new.data.kinds)
                            or (old is not None and KIND_BINARY in old.data.kinds)):
            opaque = _opaque_columns(plan, new, old)
            if opaque:
                body += b',"binary":' + _dumps(opaque)
        lsn = change.lsn
        ctx.emit(b'%s,"lsn":"%X/%X"%s%s%s}' % (before, lsn >> 32, lsn & 0xFFFFFFFF, fields, key,
                                               body))

    def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        """One line per table, all with the statement's LSN, cascade and restart_identity."""
        state = ctx.output_plugin_private
        tail = (b',"lsn":"' + str(change.lsn).encode() + b'"' + _txn_bytes(txn)
                + b',"cascade":' + (b"true" if change.cascade else b"false")
                + b',"restart_identity":' + (b"true" if change.restart_identity else b"false")
                + b"}")
        for relation in relations:
            ctx.emit(state.plan(relation).truncate_head + tail)

    def message(self, ctx: Any, txn: Any, message_lsn: LSN, transactional: bool, prefix: str,
                message: bytes) -> None:
        content = bytes(message)
        try:
            text, encoding = content.decode(), "utf-8"
        except UnicodeDecodeError:
            text, encoding = binascii.b2a_base64(content, newline=False).decode(), "base64"
        tail = _dumps({"transactional": transactional, "prefix": prefix, "content": text,
                       "content_encoding": encoding})
        ctx.emit(b'{"op":"message","lsn":"' + str(message_lsn).encode() + b'"'
                 + (_txn_bytes(txn) if txn is not None else _NO_TXN) + b"," + tail[1:])
