"""plugin_framework.pgtypes without a server: the OID table, quoting, array and interval
text, timestamps, binary numbers, and which converters the C fast path mirrors.

The converters against the server's own text of every type are in test_emitter_json.py,
format_type against the server's in test_format_type.py, and each native code against its
converter in test_json_native.py.
"""

from __future__ import annotations

import re
import struct
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pglast
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pglast.keywords import (
    COL_NAME_KEYWORDS,
    RESERVED_KEYWORDS,
    TYPE_FUNC_NAME_KEYWORDS,
    UNRESERVED_KEYWORDS,
)
from psycopg.adapt import PyFormat, Transformer

from plugin_framework.pgtypes import (
    NATIVE_KIND,
    TYPNAMES,
    VERSIONED_KEYWORDS,
    TypeConverters,
    iso_interval,
    oids,
    parse_array_text,
    pg_float8_text,
    quote_ident_always,
    quote_identifier,
    quote_literal,
    quote_standard_literal,
    timestamptz_to_str,
)
from plugin_framework.pgtypes.binary import b_numeric_text
from plugin_framework.pgtypes.datetimes import (
    b_interval_iso,
    b_timestamp_text,
    b_timestamptz_text,
    t_interval,
)
from plugin_framework.pgtypes.text import TEXT_ARRAY
from plugin_framework.protocol import PG_EPOCH

# --- oids -------------------------------------------------------------------------------------


def test_each_named_oid_is_the_type_it_is_named_after() -> None:
    named = {name: getattr(oids, name) for name in oids.__all__
             if isinstance(getattr(oids, name), int)}
    assert len(named) > 70
    for name, oid in named.items():
        expected = "_text" if name == "TEXTARRAY" else name.lower()
        assert TYPNAMES[oid] == expected, name
    assert len(set(named.values())) == len(named), "two names for one OID"


def test_array_elements_are_arrays_of_their_elements() -> None:
    for array, element in oids.ARRAY_ELEMENTS.items():
        assert TYPNAMES[array] == "_" + TYPNAMES[element]


# --- quoting ----------------------------------------------------------------------------------

_identifiers = st.one_of(
    st.from_regex(r"[a-z_][a-z0-9_$]{0,10}", fullmatch=True),
    st.sampled_from(sorted(RESERVED_KEYWORDS | COL_NAME_KEYWORDS | TYPE_FUNC_NAME_KEYWORDS
                           | UNRESERVED_KEYWORDS)),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
            min_size=1, max_size=10),
).filter(lambda name: len(name.encode()) < 64)  # longer ones the server truncates
_versions = st.sampled_from([None, 150004, 160000, 170002, 180000, 190000, 140000])


def _relname(sql_name: str) -> str:
    """The table name PostgreSQL's grammar reads from ``SELECT * FROM <sql_name>``."""
    stmt = pglast.parse_sql(f"SELECT * FROM {sql_name}")[0].stmt
    return str(stmt.fromClause[0].relname)


@settings(max_examples=400)
@given(_identifiers, _versions)
def test_quote_identifier_quotes_exactly_where_needed(name: str, version: int | None) -> None:
    quoted = quote_identifier(name, version)
    plain = re.fullmatch(r"[a-z_][a-z0-9_]*", name) is not None
    major = 18 if version is None else min(max(version // 10000, 15), 18)
    forced = name in RESERVED_KEYWORDS | COL_NAME_KEYWORDS | TYPE_FUNC_NAME_KEYWORDS and not (
        name in VERSIONED_KEYWORDS and major < {"json": 17, "json_exists": 17,
                                                 "json_query": 17, "json_scalar": 17,
                                                 "json_serialize": 17, "json_table": 17,
                                                 "json_value": 17, "merge_action": 17,
                                                 }.get(name, 16))
    assert (quoted == name) == (plain and not forced)
    if quoted != name:
        assert quoted == '"' + name.replace('"', '""') + '"'
    # Either way the newest grammar reads the name back (a bare name is never one of its
    # keywords but an unreserved one; versioned keywords are only bare for older releases).
    if version is None or name not in VERSIONED_KEYWORDS:
        assert _relname(quoted) == name


@pytest.mark.parametrize("keyword", sorted(UNRESERVED_KEYWORDS)[:40])
def test_unreserved_keywords_stay_bare(keyword: str) -> None:
    assert quote_identifier(keyword) == keyword


@pytest.mark.parametrize("keyword", ["select", "user", "int", "left", "between", "json_table"])
def test_other_keywords_are_quoted(keyword: str) -> None:
    assert quote_identifier(keyword) == f'"{keyword}"'


@given(_identifiers)
def test_quote_ident_always_reads_back(name: str) -> None:
    quoted = quote_ident_always(name)
    assert quoted.startswith('"') and quoted.endswith('"')
    assert _relname(quoted) == name


_literals = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                    max_size=12)


def _literal_value(sql: str) -> str:
    stmt = pglast.parse_sql(f"SELECT {sql}")[0].stmt
    return str(stmt.targetList[0].val.val.sval)


@given(_literals)
def test_quote_literal_reads_back(text: str) -> None:
    quoted = quote_literal(text)
    assert quoted.startswith("E'") == ("\\" in text)
    assert _literal_value(quoted) == text


@given(_literals)
def test_quote_standard_literal_reads_back_with_standard_strings(text: str) -> None:
    quoted = quote_standard_literal(text)
    assert quoted == "'" + text.replace("'", "''") + "'"
    assert _literal_value(quoted) == text


# --- arrays -----------------------------------------------------------------------------------


def _array_out(items: Any, delim: str = ",") -> bytes:
    """PostgreSQL's array_out for text elements."""
    if isinstance(items, list):
        return b"{" + delim.encode().join(_array_out(i, delim) for i in items) + b"}"
    if items is None:
        return b"NULL"
    if (items == "" or items.upper() == "NULL"
            or any(c in items for c in '{}"\\ \t\n\r\v\f' + delim)):
        items = '"' + items.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return items.encode()


_elements = st.one_of(st.none(), st.text(st.characters(exclude_categories=("Cs",),
                                                       exclude_characters="\0"), max_size=6))


@st.composite
def _arrays(draw: st.DrawFn) -> list[Any]:
    """Rectangular arrays of one to three dimensions, as PostgreSQL holds them."""
    dims = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))

    def build(level: int) -> list[Any]:
        if level == len(dims) - 1:
            return [draw(_elements) for _ in range(dims[level])]
        return [build(level + 1) for _ in range(dims[level])]

    return draw(st.one_of(st.just([]), st.just(build(0))))


@settings(max_examples=300)
@given(_arrays(), st.sampled_from([",", ";"]), st.booleans())
def test_parse_array_text_reads_array_out(items: list[Any], delim: str, bounds: bool) -> None:
    raw = _array_out(items, delim)
    if bounds and items:
        raw = b"[0:%d]=" % (len(items) - 1) + raw  # dimension bounds are dropped
    assert parse_array_text(raw, bytes.decode, delim.encode()) == items
    if delim == ",":  # psycopg's parser, which the json emitter uses for text[], agrees
        assert TEXT_ARRAY(raw) == items


@pytest.mark.parametrize("raw", [b"", b"{", b"{a", b'{"a}', b"a", b"{a,b", b"{{a}"])
def test_parse_array_text_rejects_malformed_text(raw: bytes) -> None:
    with pytest.raises(ValueError, match="malformed array text"):
        parse_array_text(raw, bytes.decode)


# --- intervals --------------------------------------------------------------------------------


def _postgres_interval(months: int, days: int, micros: int) -> bytes:
    """An interval as PostgreSQL prints it with the default IntervalStyle ``postgres``."""
    parts = []
    year, mon = int(months / 12), months - 12 * int(months / 12)
    for value, unit in ((year, "year"), (mon, "mon"), (days, "day")):
        if value:
            parts.append(f"{value} {unit}{'' if abs(value) == 1 else 's'}")
    if micros or not parts:
        sign = "-" if micros < 0 else ""
        sec, frac = divmod(abs(micros), 1_000_000)
        text = f"{sign}{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
        parts.append(text + ("." + f"{frac:06d}".rstrip("0") if frac else ""))
    return " ".join(parts).encode()


_months = st.integers(-(2**31) + 1, 2**31 - 1)
_days = st.integers(-(2**31) + 1, 2**31 - 1)
_micros = st.integers(-(2**63) + 1, 2**63 - 2)


@settings(max_examples=300)
@given(_months, _days, _micros)
def test_interval_text_and_send_format_agree(months: int, days: int, micros: int) -> None:
    iso = iso_interval(months, days, micros)
    assert t_interval(_postgres_interval(months, days, micros)) == iso
    assert b_interval_iso(struct.pack("!qii", micros, days, months)) == iso
    assert re.fullmatch(r"P(-?\d+Y)?(-?\d+M)?(-?\d+D)?(T(-?\d+H)?(-?\d+M)?(-?\d+(\.\d+)?S)?)?",
                        iso)


@pytest.mark.parametrize(("months", "days", "micros", "expected"), [
    (0, 0, 0, "PT0S"),
    (-1, 0, 0, "P-1M"),
    (12, 0, 0, "P1Y"),
    (-13, 0, 0, "P-1Y-1M"),
    (0, 0, -1, "PT-0.000001S"),
    (0, 0, -1_500_000, "PT-1.5S"),
    (0, 0, 3_600_000_000, "PT1H"),
    (14, -3, 3_600_000_001, "P1Y2M-3DT1H0.000001S"),
    (0, 0, -3_661_000_000, "PT-1H-1M-1S"),
])
def test_iso_interval_edges(months: int, days: int, micros: int, expected: str) -> None:
    assert iso_interval(months, days, micros) == expected


@pytest.mark.parametrize("raw", [b"infinity", b"-infinity", b"@ 1 year", b"P1Y", b"1 fortnight",
                                 b"1 day 25:00", b"3"])
def test_other_interval_text_stays_as_the_server_wrote_it(raw: bytes) -> None:
    assert t_interval(raw) == raw.decode()


def test_interval_send_format_infinities() -> None:
    assert b_interval_iso(struct.pack("!qii", 2**63 - 1, 2**31 - 1, 2**31 - 1)) == "infinity"
    assert b_interval_iso(struct.pack("!qii", -(2**63), -(2**31), -(2**31))) == "-infinity"


# --- timestamps -------------------------------------------------------------------------------

_moments = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                        timezones=st.just(UTC))
_zones = st.one_of(
    st.just(UTC),
    st.integers(-15 * 3600, 15 * 3600).map(lambda s: timezone(timedelta(seconds=s))),
)


def _server_style(moment: datetime) -> str:
    """ISO DateStyle from Python's own calendar: the fraction without trailing zeros, the
    offset as +HH[:MM[:SS]]."""
    text = moment.isoformat(sep=" ")
    body, sign, offset = re.fullmatch(r"(.*?)([+-])(\d\d:\d\d(?::\d\d)?)", text).groups()
    if "." in body:
        body = body.rstrip("0").rstrip(".")
    return body + sign + re.sub(r"(:00)+$", "", offset)


@given(_moments, _zones)
def test_timestamptz_to_str(moment: datetime, zone: Any) -> None:
    assert timestamptz_to_str(moment, zone) == _server_style(moment.astimezone(zone))


@given(_moments)
def test_timestamp_send_format(moment: datetime) -> None:
    micros = (moment - PG_EPOCH) // timedelta(microseconds=1)
    raw = struct.pack("!q", micros)
    assert b_timestamptz_text(raw) == _server_style(moment)
    assert b_timestamp_text(raw) == _server_style(moment)[:-3]  # without "+00"


def test_timestamp_send_format_bc_and_infinities() -> None:
    year_one = (datetime(1, 1, 1, tzinfo=UTC) - PG_EPOCH) // timedelta(microseconds=1)
    assert b_timestamp_text(struct.pack("!q", year_one)) == "0001-01-01 00:00:00"
    day = 86_400_000_000
    assert b_timestamp_text(struct.pack("!q", year_one - day)) == "0001-12-31 00:00:00 BC"
    assert b_timestamptz_text(struct.pack("!q", 2**63 - 1)) == "infinity"
    assert b_timestamptz_text(struct.pack("!q", -(2**63))) == "-infinity"


# --- numbers ----------------------------------------------------------------------------------

_numeric_dumper = Transformer().get_dumper(Decimal(1), PyFormat.BINARY)


@given(st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: d.adjusted() < 1000 and -d.as_tuple().exponent < 1000))  # type: ignore[operator]
def test_numeric_send_format(value: Decimal) -> None:
    if value == 0:
        value = abs(value)  # numeric has no negative zero
    raw = bytes(_numeric_dumper.dump(value))
    assert b_numeric_text(raw) == format(value, "f")


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_pg_float8_text_is_shortest_and_exact(x: float) -> None:
    text = pg_float8_text(x)
    assert float(text) == x
    digits = re.sub(r"e.*|[-.]", "", text).strip("0")
    assert len(digits) <= len(repr(abs(x)).split("e")[0].replace(".", "").strip("0")) or x == 0


def test_pg_float8_text_layout() -> None:
    assert [pg_float8_text(x) for x in (1e15, -1.5e15, 1e-5, 123.0, 1e16, float("nan"),
                                        float("-inf"), -0.0)] == [
        "1e+15", "-1.5e+15", "1e-05", "123", "1e+16", "NaN", "-Infinity", "-0"]


# --- which converters the C fast path mirrors -------------------------------------------------

# Type OID and options -> the native code of the converter the type gets (None: no native
# code, the C code calls the converter). If a type's converter is replaced by one that does
# not declare the code, or a converter's declaration is dropped or changed, this fails.
NUMBER, BASE64 = {"numeric_as": "number"}, {"bytea": "base64"}
EXPECTED_NATIVE: list[tuple[int, dict[str, str], str | None]] = [
    *((oid, {}, "VERBATIM") for oid in (oids.INT2, oids.INT4, oids.INT8, oids.OID, oids.XID,
                                        oids.CID, oids.XID8, oids.JSONB)),
    (oids.FLOAT4, {}, "FLOAT"), (oids.FLOAT8, {}, "FLOAT"), (oids.NUMERIC, NUMBER, "FLOAT"),
    (oids.NUMERIC, {}, "STRING"),
    *((oid, {}, "STRING") for oid in (oids.TEXT, oids.VARCHAR, oids.BPCHAR, oids.NAME,
                                      oids.UUID, oids.DATE, oids.TIME, oids.INET)),
    (oids.BOOL, {}, "BOOL"), (oids.JSON, {}, "JSON"),
    (oids.TIMESTAMP, {}, "TIMESTAMP"), (oids.TIMESTAMPTZ, {}, "TIMESTAMPTZ"),
    (oids.TEXTARRAY, {}, "ARRAY_TEXT"), (1015, {}, "ARRAY_TEXT"),  # varchar[]
    (1007, {}, "ARRAY_INT"), (1016, {}, "ARRAY_INT"), (1000, {}, "ARRAY_BOOL"),
    (oids.INTERVAL, {}, None), (oids.TIMETZ, {}, None), (oids.BYTEA, {}, None),
    (oids.BYTEA, BASE64, None),
    (1231, {}, "ARRAY_TEXT"), (1231, NUMBER, None),  # numeric[]: strings, or parse_array_text
    (1115, {}, None),  # timestamp[]
]


@pytest.mark.parametrize(("oid", "options", "code"), EXPECTED_NATIVE)
def test_each_type_keeps_its_native_code(oid: int, options: dict[str, str],
                                         code: str | None) -> None:
    conv = TypeConverters(**options).text(oid)
    assert NATIVE_KIND.get(conv) == code


def test_every_declared_native_code_is_expected_of_some_type() -> None:
    assert set(NATIVE_KIND.values()) == {code for _, _, code in EXPECTED_NATIVE if code}


def test_a_negative_zero_float_keeps_its_sign_in_json() -> None:
    """The server prints -0.0 as "-0", which JSON readers take for the integer 0: floats
    and float arrays write it as -0.0, which reads back with its sign."""
    import math

    import orjson

    from plugin_framework.pgtypes.converters import TypeConverters

    converters = TypeConverters()
    for oid, text in ((701, b"-0"), (700, b"-0"), (1022, b"{-0,0,1.5}"), (1021, b"{{-0}}")):
        value = orjson.loads(orjson.dumps(converters.text(oid)(text)))
        first = value
        while isinstance(first, list):
            first = first[0]
        assert isinstance(first, float) and math.copysign(1, first) == -1, (oid, value)

