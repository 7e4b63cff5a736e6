"""PostgreSQL values: the one place pgdecode understands them (as psycopg's ``types`` package).

- ``oids``: built-in type OIDs and names, one table.
- ``quote``: identifiers and literals quoted as PostgreSQL does.
- ``format_type``: type names as the server prints them (format_type.c).
- ``text``, ``datetimes``, ``binary``: a value's text or send format -> the server's text or
  a JSON-ready value; ``converters``: the converters of each column type (TypeConverters),
  and which of them emitters/json/native/_jsonrow.c mirrors in C (NATIVE_KIND).

Sits directly on the protocol layer; the framework, row filters, sources, Spark and the
emitters use it. It also names, for the layers above protocol, the four kinds of a column
value in a row (``Row.data.kinds``): text format, binary format, null, unchanged TOAST.
"""

from __future__ import annotations

from plugin_framework.pgtypes.binary import pg_float8_text
from plugin_framework.pgtypes.converters import NATIVE_KIND, TypeConverters, native_codes
from plugin_framework.pgtypes.datetimes import (
    civil_date,
    epoch_days,
    epoch_micros,
    interval_parts,
    iso_interval,
    time_micros,
    time_text,
    timestamptz_to_str,
    trunc_divmod,
)
from plugin_framework.pgtypes.format_type import (
    TypeNames,
    format_type,
    format_type_be,
    format_type_sql,
)
from plugin_framework.pgtypes.oids import TYPNAMES
from plugin_framework.pgtypes.quote import (
    VERSIONED_KEYWORDS,
    quote_ident_always,
    quote_identifier,
    quote_literal,
    quote_standard_literal,
)
from plugin_framework.pgtypes.text import Converter, parse_array_text

__all__ = [
    "NATIVE_KIND",
    "TYPNAMES",
    "VERSIONED_KEYWORDS",
    "Converter",
    "TypeConverters",
    "TypeNames",
    "civil_date",
    "epoch_days",
    "epoch_micros",
    "format_type",
    "format_type_be",
    "format_type_sql",
    "interval_parts",
    "iso_interval",
    "native_codes",
    "parse_array_text",
    "pg_float8_text",
    "quote_ident_always",
    "quote_identifier",
    "quote_literal",
    "quote_standard_literal",
    "time_micros",
    "time_text",
    "timestamptz_to_str",
    "trunc_divmod",
]
