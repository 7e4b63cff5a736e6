"""PostgreSQL's ``format_type`` for the type OIDs and typmods of pgoutput's Relation messages.

Output plugins print column types the way the server does (``integer``, ``character
varying(10)``, ``timestamp(3) with time zone``, ``"char"``, ``text[]``). pgoutput only sends
OIDs and typmods, plus a Type message (OID, namespace, name) for types that are not built in,
so this module reproduces ``format_type_extended`` (src/backend/utils/adt/format_type.c) and
the typmod output functions of the built-in types in pure Python, with a table of every type
that PostgreSQL's bootstrap catalog creates with a fixed OID (checked against PostgreSQL 15
and 18 by tests/test_format_type.py).

Three entry points mirror the server's three ways of calling it:

- ``format_type(oid, typmod)``: typmod -1 means "no typmod" (the SQL function with a NULL
  typmod), any other typmod is printed as the SQL function ``format_type(oid, typmod)`` does.
- ``format_type_be(oid)``: ``format_type_be`` as contrib/test_decoding prints ``col[type]``;
  it never shows a typmod.
- ``format_type_sql(oid, typmod)``: the SQL function exactly, ``None`` standing for NULL.

Names are quoted as by the server whose stream is decoded: each entry point, like
``quote_identifier``, takes that server's ``server_version`` (``server_version_num``, e.g.
150004), since the keywords that force quotes differ between releases; ``None`` means the
newest release known here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from pglast.keywords import COL_NAME_KEYWORDS, RESERVED_KEYWORDS, TYPE_FUNC_NAME_KEYWORDS

__all__ = [
    "VERSIONED_KEYWORDS",
    "TypeNames",
    "builtin_type_name",
    "format_type",
    "format_type_be",
    "format_type_sql",
    "quote_identifier",
]

TypeNames = Mapping[int, tuple[str, str]]
"""Type OID -> (namespace, name), as pgoutput's Type messages give them ("" is pg_catalog)."""

# --- PostgreSQL's quote_identifier (src/backend/utils/adt/ruleutils.c) -------------------------

# Every keyword except the unreserved ones forces quotes, even where the grammar would accept
# it bare (PostgreSQL does not try to tell those cases apart). pglast's lists are those of
# PostgreSQL _NEWEST (tests/test_format_type.py checks that they still are).
_QUOTED_KEYWORDS: Final = frozenset(RESERVED_KEYWORDS | COL_NAME_KEYWORDS | TYPE_FUNC_NAME_KEYWORDS)
_PLAIN_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]*")

_NEWEST: Final = 18

# The keywords that force quotes in some of the releases 15.._NEWEST only, with the major
# version from which they do (src/include/parser/kwlist.h of each release: these became
# keywords of another category than unreserved, or json moved there from unreserved; no
# keyword left those categories meanwhile). Every other keyword is quoted alike by all of them.
_QUOTED_SINCE: Final[dict[str, int]] = {
    # 16: the SQL/JSON constructors and SYSTEM_USER
    "json_array": 16, "json_arrayagg": 16, "json_object": 16, "json_objectagg": 16,
    "system_user": 16,
    # 17: JSON() (json was unreserved in 16), the SQL/JSON query functions, JSON_TABLE and
    # MERGE's merge_action()
    "json": 17, "json_exists": 17, "json_query": 17, "json_scalar": 17, "json_serialize": 17,
    "json_table": 17, "json_value": 17, "merge_action": 17,
}

VERSIONED_KEYWORDS: Final = frozenset(_QUOTED_SINCE)
"""The names whose quoting depends on the server version: only for these does
``quote_identifier`` need to be given one."""


@lru_cache(maxsize=4096)
def quote_identifier(name: str, server_version: int | None = None) -> str:
    """``name`` double-quoted (quotes doubled) unless it is a plain lower-case identifier.

    Plain means ASCII ``a-z``, ``0-9`` and ``_``, not starting with a digit, and not a keyword
    other than an unreserved one in the release of ``server_version`` (``server_version_num``,
    e.g. 150004). ``None``, or a release newer than the newest known here (18), takes the
    newest's keywords; one older than 15 takes 15's.
    """
    if _PLAIN_IDENTIFIER.fullmatch(name) and (
        name not in _QUOTED_KEYWORDS
        or (server_version is not None and name in _QUOTED_SINCE
            and server_version // 10000 < _QUOTED_SINCE[name])
    ):
        return name
    return '"' + name.replace('"', '""') + '"'


# --- built-in types ---------------------------------------------------------------------------

_VARHDRSZ: Final = 4

_BOOLOID: Final = 16
_INT8OID: Final = 20
_INT2OID: Final = 21
_INT4OID: Final = 23
_JSONOID: Final = 114
_FLOAT4OID: Final = 700
_FLOAT8OID: Final = 701
_BPCHAROID: Final = 1042
_VARCHAROID: Final = 1043
_TIMEOID: Final = 1083
_TIMESTAMPOID: Final = 1114
_TIMESTAMPTZOID: Final = 1184
_INTERVALOID: Final = 1186
_TIMETZOID: Final = 1266
_BITOID: Final = 1560
_VARBITOID: Final = 1562
_NUMERICOID: Final = 1700

# pg_type.typname of every type with a fixed OID: src/include/catalog/pg_type.dat plus the
# row types of the catalogs that declare BKI_ROWTYPE_OID (identical in PostgreSQL 15 and 18).
# Types that initdb creates later (system views' row types, information_schema's domains,
# the arrays of catalog row types) get OIDs >= 10000 and reach us through Type messages.
_TYPNAMES: Final[dict[int, str]] = {
    16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 22: "int2vector",
    23: "int4", 24: "regproc", 25: "text", 26: "oid", 27: "tid", 28: "xid", 29: "cid",
    30: "oidvector", 32: "pg_ddl_command", 71: "pg_type", 75: "pg_attribute", 81: "pg_proc",
    83: "pg_class", 114: "json", 142: "xml", 143: "_xml", 194: "pg_node_tree", 199: "_json",
    210: "_pg_type", 269: "table_am_handler", 270: "_pg_attribute", 271: "_xid8", 272: "_pg_proc",
    273: "_pg_class", 325: "index_am_handler", 600: "point", 601: "lseg", 602: "path", 603: "box",
    604: "polygon", 628: "line", 629: "_line", 650: "cidr", 651: "_cidr", 700: "float4",
    701: "float8", 705: "unknown", 718: "circle", 719: "_circle", 774: "macaddr8",
    775: "_macaddr8", 790: "money", 791: "_money", 829: "macaddr", 869: "inet", 1000: "_bool",
    1001: "_bytea", 1002: "_char", 1003: "_name", 1005: "_int2", 1006: "_int2vector",
    1007: "_int4", 1008: "_regproc", 1009: "_text", 1010: "_tid", 1011: "_xid", 1012: "_cid",
    1013: "_oidvector", 1014: "_bpchar", 1015: "_varchar", 1016: "_int8", 1017: "_point",
    1018: "_lseg", 1019: "_path", 1020: "_box", 1021: "_float4", 1022: "_float8", 1027: "_polygon",
    1028: "_oid", 1033: "aclitem", 1034: "_aclitem", 1040: "_macaddr", 1041: "_inet",
    1042: "bpchar", 1043: "varchar", 1082: "date", 1083: "time", 1114: "timestamp",
    1115: "_timestamp", 1182: "_date", 1183: "_time", 1184: "timestamptz", 1185: "_timestamptz",
    1186: "interval", 1187: "_interval", 1231: "_numeric", 1248: "pg_database", 1263: "_cstring",
    1266: "timetz", 1270: "_timetz", 1560: "bit", 1561: "_bit", 1562: "varbit", 1563: "_varbit",
    1700: "numeric", 1790: "refcursor", 2201: "_refcursor", 2202: "regprocedure", 2203: "regoper",
    2204: "regoperator", 2205: "regclass", 2206: "regtype", 2207: "_regprocedure",
    2208: "_regoper", 2209: "_regoperator", 2210: "_regclass", 2211: "_regtype", 2249: "record",
    2275: "cstring", 2276: "any", 2277: "anyarray", 2278: "void", 2279: "trigger",
    2280: "language_handler", 2281: "internal", 2283: "anyelement", 2287: "_record",
    2776: "anynonarray", 2842: "pg_authid", 2843: "pg_auth_members", 2949: "_txid_snapshot",
    2950: "uuid", 2951: "_uuid", 2970: "txid_snapshot", 3115: "fdw_handler", 3220: "pg_lsn",
    3221: "_pg_lsn", 3310: "tsm_handler", 3361: "pg_ndistinct", 3402: "pg_dependencies",
    3500: "anyenum", 3614: "tsvector", 3615: "tsquery", 3642: "gtsvector", 3643: "_tsvector",
    3644: "_gtsvector", 3645: "_tsquery", 3734: "regconfig", 3735: "_regconfig",
    3769: "regdictionary", 3770: "_regdictionary", 3802: "jsonb", 3807: "_jsonb", 3831: "anyrange",
    3838: "event_trigger", 3904: "int4range", 3905: "_int4range", 3906: "numrange",
    3907: "_numrange", 3908: "tsrange", 3909: "_tsrange", 3910: "tstzrange", 3911: "_tstzrange",
    3912: "daterange", 3913: "_daterange", 3926: "int8range", 3927: "_int8range",
    4066: "pg_shseclabel", 4072: "jsonpath", 4073: "_jsonpath", 4089: "regnamespace",
    4090: "_regnamespace", 4096: "regrole", 4097: "_regrole", 4191: "regcollation",
    4192: "_regcollation", 4451: "int4multirange", 4532: "nummultirange", 4533: "tsmultirange",
    4534: "tstzmultirange", 4535: "datemultirange", 4536: "int8multirange", 4537: "anymultirange",
    4538: "anycompatiblemultirange", 4600: "pg_brin_bloom_summary",
    4601: "pg_brin_minmax_multi_summary", 5017: "pg_mcv_list", 5038: "pg_snapshot",
    5039: "_pg_snapshot", 5069: "xid8", 5077: "anycompatible", 5078: "anycompatiblearray",
    5079: "anycompatiblenonarray", 5080: "anycompatiblerange", 6101: "pg_subscription",
    6150: "_int4multirange", 6151: "_nummultirange", 6152: "_tsmultirange",
    6153: "_tstzmultirange", 6155: "_datemultirange", 6157: "_int8multirange",
}

# The "true" array types (typsubscript array_subscript_handler, storage not plain): array OID
# -> element OID. format_type prints these as the element's name followed by "[]", applying
# the typmod to the element. int2vector and oidvector (plain storage) and the fixed-length
# pseudo-arrays (name, point, ...) keep their own names.
_ARRAY_ELEMENTS: Final[dict[int, int]] = {
    143: 142, 199: 114, 210: 71, 270: 75, 271: 5069, 272: 81, 273: 83, 629: 628, 651: 650,
    719: 718, 775: 774, 791: 790, 1000: 16, 1001: 17, 1002: 18, 1003: 19, 1005: 21, 1006: 22,
    1007: 23, 1008: 24, 1009: 25, 1010: 27, 1011: 28, 1012: 29, 1013: 30, 1014: 1042, 1015: 1043,
    1016: 20, 1017: 600, 1018: 601, 1019: 602, 1020: 603, 1021: 700, 1022: 701, 1027: 604,
    1028: 26, 1034: 1033, 1040: 829, 1041: 869, 1115: 1114, 1182: 1082, 1183: 1083, 1185: 1184,
    1187: 1186, 1231: 1700, 1263: 2275, 1270: 1266, 1561: 1560, 1563: 1562, 2201: 1790, 2207: 2202,
    2208: 2203, 2209: 2204, 2210: 2205, 2211: 2206, 2287: 2249, 2949: 2970, 2951: 2950, 3221: 3220,
    3643: 3614, 3644: 3642, 3645: 3615, 3735: 3734, 3770: 3769, 3807: 3802, 3905: 3904, 3907: 3906,
    3909: 3908, 3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072, 4090: 4089, 4097: 4096, 4192: 4191,
    5039: 5038, 6150: 4451, 6151: 4532, 6152: 4533, 6153: 4534, 6155: 4535, 6157: 4536,
}

_BUILTIN_BY_NAME: Final[dict[str, int]] = {name: oid for oid, name in _TYPNAMES.items()}

# Built-in types that format_type always prints under their SQL-standard name, typmod or not.
_FIXED_NAMES: Final[dict[int, str]] = {
    _BOOLOID: "boolean", _FLOAT4OID: "real", _FLOAT8OID: "double precision",
    _INT2OID: "smallint", _INT4OID: "integer", _INT8OID: "bigint",
    # PostgreSQL 16 made JSON a keyword and format_type special-cased it to stay unquoted; 15
    # prints it through the default path, which differs only for a typmod json never has.
    _JSONOID: "json",
}

# Interval typmods: the field mask (bits from src/include/utils/datetime.h) in the high 16 bits.
_MONTH: Final = 1 << 1
_YEAR: Final = 1 << 2
_DAY: Final = 1 << 3
_HOUR: Final = 1 << 10
_MINUTE: Final = 1 << 11
_SECOND: Final = 1 << 12
_INTERVAL_FULL_RANGE: Final = 0x7FFF
_INTERVAL_FULL_PRECISION: Final = 0xFFFF
_INTERVAL_FIELDS: Final[dict[int, str]] = {
    _YEAR: " year",
    _MONTH: " month",
    _DAY: " day",
    _HOUR: " hour",
    _MINUTE: " minute",
    _SECOND: " second",
    _YEAR | _MONTH: " year to month",
    _DAY | _HOUR: " day to hour",
    _DAY | _HOUR | _MINUTE: " day to minute",
    _DAY | _HOUR | _MINUTE | _SECOND: " day to second",
    _HOUR | _MINUTE: " hour to minute",
    _HOUR | _MINUTE | _SECOND: " hour to second",
    _MINUTE | _SECOND: " minute to second",
    _INTERVAL_FULL_RANGE: "",
}


def _char_typmodout(typmod: int) -> str:
    """bpchartypmodout/varchartypmodout: the length, which the typmod stores plus VARHDRSZ."""
    return f"({typmod - _VARHDRSZ})" if typmod > _VARHDRSZ else ""


def _numeric_typmodout(typmod: int) -> str:
    """numerictypmodout: precision in the high 16 bits, scale (11 bits, signed) in the low."""
    if typmod < _VARHDRSZ:
        return ""
    packed = typmod - _VARHDRSZ
    precision = (packed >> 16) & 0xFFFF
    scale = ((packed & 0x7FF) ^ 1024) - 1024
    return f"({precision},{scale})"


def _interval_typmodout(typmod: int) -> str:
    """intervaltypmodout: the field restriction, then the seconds precision if one was given."""
    fields = _INTERVAL_FIELDS.get((typmod >> 16) & 0x7FFF)
    if fields is None:
        # The server fails the same way: no column can carry such a typmod.
        raise ValueError(f"invalid INTERVAL typmod: {typmod:#x}")
    precision = typmod & 0xFFFF
    return fields if precision == _INTERVAL_FULL_PRECISION else f"{fields}({precision})"


def _scalar_name(type_oid: int, typmod: int, typmod_given: bool) -> str:
    """format_type_extended for a built-in type that is not an array."""
    with_typmod = typmod_given and typmod >= 0
    fixed = _FIXED_NAMES.get(type_oid)
    if fixed is not None:
        return fixed
    if type_oid == _VARCHAROID:
        return "character varying" + (_char_typmodout(typmod) if with_typmod else "")
    if type_oid == _BPCHAROID:
        if with_typmod:
            return "character" + _char_typmodout(typmod)
        if not typmod_given:
            return "character"
        # typmod -1 given: "character" would read back as character(1); fall through: bpchar.
    elif type_oid == _BITOID:
        if with_typmod:
            return f"bit({typmod})"
        if not typmod_given:
            return "bit"
        # typmod -1 given: "bit" would read back as bit(1); fall through: "bit", quoted.
    elif type_oid == _VARBITOID:
        return f"bit varying({typmod})" if with_typmod else "bit varying"
    elif type_oid == _NUMERICOID:
        return "numeric" + _numeric_typmodout(typmod) if with_typmod else "numeric"
    elif type_oid == _INTERVALOID:
        return "interval" + _interval_typmodout(typmod) if with_typmod else "interval"
    elif type_oid == _TIMEOID or type_oid == _TIMETZOID:
        zone = " without time zone" if type_oid == _TIMEOID else " with time zone"
        return f"time({typmod}){zone}" if with_typmod else "time" + zone
    elif type_oid == _TIMESTAMPOID or type_oid == _TIMESTAMPTZOID:
        zone = " without time zone" if type_oid == _TIMESTAMPOID else " with time zone"
        return f"timestamp({typmod}){zone}" if with_typmod else "timestamp" + zone
    # The default: the catalog name, quoted like any identifier; no other built-in type has
    # a typmodout function, so a typmod is printed as a bare number.
    name = quote_identifier(_TYPNAMES[type_oid])
    return f"{name}({typmod})" if with_typmod else name


# Built-in types need no server version: none of their names is quoted by some releases only
# (tests/test_format_type.py checks).
@lru_cache(maxsize=8192)
def _builtin(type_oid: int, typmod: int, typmod_given: bool) -> str:
    """format_type_extended for a built-in OID; an array applies the typmod to its element."""
    element = _ARRAY_ELEMENTS.get(type_oid)
    if element is not None:
        return _scalar_name(element, typmod, typmod_given) + "[]"
    return _scalar_name(type_oid, typmod, typmod_given)


@lru_cache(maxsize=4096)
def _named(namespace: str, name: str, typmod: int, typmod_given: bool,
           server_version: int | None) -> str:
    """A type known only by a Type message's namespace and name.

    pgoutput describes a domain by its base type's name, so a pg_catalog name of a built-in
    type (a domain over ``int4`` arrives as ``("", "int4")``) prints as that built-in type.
    Other names are qualified unless in pg_catalog or public (the default search_path); a
    typmod is printed as a bare number, as for a type without a typmodout function.
    """
    if namespace in ("", "pg_catalog"):
        builtin = _BUILTIN_BY_NAME.get(name)
        if builtin is not None:
            return _builtin(builtin, typmod, typmod_given)
    buf = quote_identifier(name, server_version)
    if namespace not in ("", "public", "pg_catalog"):
        buf = f"{quote_identifier(namespace, server_version)}.{buf}"
    return f"{buf}({typmod})" if typmod_given and typmod >= 0 else buf


def _format(
    type_oid: int, typmod: int, typmod_given: bool, type_names: TypeNames | None,
    server_version: int | None,
) -> str:
    if type_oid in _TYPNAMES:
        return _builtin(type_oid, typmod, typmod_given)
    if type_oid == 0:
        return "-"
    entry = type_names.get(type_oid) if type_names is not None else None
    if entry is None:
        return "???"
    return _named(entry[0], entry[1], typmod, typmod_given, server_version)


def builtin_type_name(type_oid: int) -> str | None:
    """``pg_type.typname`` of a built-in type (one with a fixed OID: ``int4``, ``_text``,
    ``bpchar``), or None for any other OID, whose name only a Type message or the catalog
    can tell."""
    return _TYPNAMES.get(type_oid)


def format_type(type_oid: int, typmod: int = -1, *, type_names: TypeNames | None = None,
                server_version: int | None = None) -> str:
    """The type as PostgreSQL names it, with its typmod when ``typmod`` >= 0.

    A typmod >= 0 prints as the SQL function ``format_type(type_oid, typmod)`` does
    (``character varying(10)``, ``numeric(10,2)``, ``interval day to second(2)``); -1 means no
    typmod, as in ``format_type(type_oid, NULL)``, which differs from ``format_type(oid, -1)``
    only for bpchar and bit (``character`` and ``bit`` rather than ``bpchar`` and ``"bit"``).
    OIDs that are not built in are looked up in ``type_names``; OID 0 prints ``-`` and an
    unknown OID ``???``, as with FORMAT_TYPE_ALLOW_INVALID. Names are quoted as the release
    of ``server_version`` quotes them (see ``quote_identifier``).
    """
    return _format(type_oid, typmod, typmod >= 0, type_names, server_version)


def format_type_be(type_oid: int, *, type_names: TypeNames | None = None,
                   server_version: int | None = None) -> str:
    """The type without any typmod: what contrib/test_decoding prints in ``col[type]``.

    test_decoding calls ``format_type_be(atttypid)``, so a ``varchar(10)`` column shows as
    ``character varying`` and a ``char(3)`` one as ``character``. Where the server would fail
    (OID 0 or unknown) this returns ``-`` or ``???`` instead.
    """
    return _format(type_oid, -1, False, type_names, server_version)


def format_type_sql(
    type_oid: int, typmod: int | None = None, *, type_names: TypeNames | None = None,
    server_version: int | None = None,
) -> str:
    """Exactly the SQL function ``format_type(type_oid, typmod)``; ``None`` is a NULL typmod.

    Unlike ``format_type``, typmod -1 is a given typmod here: bpchar prints ``bpchar`` and
    bit ``"bit"`` (so that the name reads back with typmod -1 rather than a length of 1).
    """
    if typmod is None:
        return _format(type_oid, -1, False, type_names, server_version)
    return _format(type_oid, typmod, True, type_names, server_version)
