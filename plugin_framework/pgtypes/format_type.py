"""PostgreSQL's ``format_type`` for the type OIDs and typmods of pgoutput's Relation messages.

Output plugins print column types the way the server does (``integer``, ``character
varying(10)``, ``timestamp(3) with time zone``, ``"char"``, ``text[]``). pgoutput only sends
OIDs and typmods, plus a Type message (OID, namespace, name) for types that are not built in,
so this module reproduces ``format_type_extended`` (src/backend/utils/adt/format_type.c) and
the typmod output functions of the built-in types in pure Python, with a table of every type
that PostgreSQL's bootstrap catalog creates with a fixed OID (checked against PostgreSQL 15
and 18 by tests/pgtypes/test_format_type.py).

Three entry points mirror the server's three ways of calling it:

- ``format_type(oid, typmod)``: typmod -1 means "no typmod" (the SQL function with a NULL
  typmod), any other typmod is printed as the SQL function ``format_type(oid, typmod)`` does.
- ``format_type_be(oid)``: ``format_type_be`` as contrib/test_decoding prints ``col[type]``;
  it never shows a typmod.
- ``format_type_sql(oid, typmod)``: the SQL function exactly, ``None`` standing for NULL.

Names are quoted as by the server whose stream is decoded: each entry point, like
``quote_identifier`` (in pgtypes.quote), takes that server's ``server_version``
(``server_version_num``, e.g. 150004), since the keywords that force quotes differ between
releases; ``None`` means the newest release known here.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from plugin_framework.pgtypes.oids import (
    ARRAY_ELEMENTS,
    BIT,
    BOOL,
    BPCHAR,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    JSON,
    NUMERIC,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TIMETZ,
    TYPNAMES,
    VARBIT,
    VARCHAR,
)
from plugin_framework.pgtypes.quote import quote_identifier

__all__ = ["TypeNames", "format_type", "format_type_be", "format_type_sql"]

TypeNames = Mapping[int, tuple[str, str]]
"""Type OID -> (namespace, name), as pgoutput's Type messages give them ("" is pg_catalog)."""


# --- built-in types ---------------------------------------------------------------------------

_VARHDRSZ: Final = 4

_BUILTIN_BY_NAME: Final[dict[str, int]] = {name: oid for oid, name in TYPNAMES.items()}

# Built-in types that format_type always prints under their SQL-standard name, typmod or not.
_FIXED_NAMES: Final[dict[int, str]] = {
    BOOL: "boolean", FLOAT4: "real", FLOAT8: "double precision",
    INT2: "smallint", INT4: "integer", INT8: "bigint",
    # PostgreSQL 16 made JSON a keyword and format_type special-cased it to stay unquoted; 15
    # prints it through the default path, which differs only for a typmod json never has.
    JSON: "json",
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
    if type_oid == VARCHAR:
        return "character varying" + (_char_typmodout(typmod) if with_typmod else "")
    if type_oid == BPCHAR:
        if with_typmod:
            return "character" + _char_typmodout(typmod)
        if not typmod_given:
            return "character"
        # typmod -1 given: "character" would read back as character(1); fall through: bpchar.
    elif type_oid == BIT:
        if with_typmod:
            return f"bit({typmod})"
        if not typmod_given:
            return "bit"
        # typmod -1 given: "bit" would read back as bit(1); fall through: "bit", quoted.
    elif type_oid == VARBIT:
        return f"bit varying({typmod})" if with_typmod else "bit varying"
    elif type_oid == NUMERIC:
        return "numeric" + _numeric_typmodout(typmod) if with_typmod else "numeric"
    elif type_oid == INTERVAL:
        return "interval" + _interval_typmodout(typmod) if with_typmod else "interval"
    elif type_oid == TIME or type_oid == TIMETZ:
        zone = " without time zone" if type_oid == TIME else " with time zone"
        return f"time({typmod}){zone}" if with_typmod else "time" + zone
    elif type_oid == TIMESTAMP or type_oid == TIMESTAMPTZ:
        zone = " without time zone" if type_oid == TIMESTAMP else " with time zone"
        return f"timestamp({typmod}){zone}" if with_typmod else "timestamp" + zone
    # The default: the catalog name, quoted like any identifier; no other built-in type has
    # a typmodout function, so a typmod is printed as a bare number.
    name = quote_identifier(TYPNAMES[type_oid])
    return f"{name}({typmod})" if with_typmod else name


# Built-in types need no server version: none of their names is quoted by some releases only
# (tests/pgtypes/test_format_type.py checks).
@lru_cache(maxsize=8192)
def _builtin(type_oid: int, typmod: int, typmod_given: bool) -> str:
    """format_type_extended for a built-in OID; an array applies the typmod to its element."""
    element = ARRAY_ELEMENTS.get(type_oid)
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
    if type_oid in TYPNAMES:
        return _builtin(type_oid, typmod, typmod_given)
    if type_oid == 0:
        return "-"
    entry = type_names.get(type_oid) if type_names is not None else None
    if entry is None:
        return "???"
    return _named(entry[0], entry[1], typmod, typmod_given, server_version)


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
