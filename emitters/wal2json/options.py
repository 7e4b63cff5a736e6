"""wal2json's options: its names, defaults, value syntax and error messages (read_options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from emitters.options import Option, OptionError, parse_bool, parse_options

FORMAT_VERSION: Final = 2  # the highest format version (wal2json's WAL2JSON_FORMAT_VERSION)
FORMAT_MIN_VERSION: Final = 1

_C_SPACE: Final = " \t\n\v\f\r"  # isspace() in the C locale

# --- option values ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SelectTable:
    """One ``schema.table`` pattern of add-tables / filter-tables; ``*`` means any."""

    schema: str
    table: str
    all_schemas: bool
    all_tables: bool

    def matches(self, schema: str, table: str) -> bool:
        return ((self.all_schemas or self.schema == schema)
                and (self.all_tables or self.table == table))


ALL_TABLES: Final = SelectTable("*", "*", True, True)


def _split(text: str, *, allow_empty_items: bool = False) -> list[str]:
    """wal2json's split_string_to_list: comma-separated items, whitespace around them ignored,
    a backslash makes the next character part of the item (the backslash is kept); ValueError
    for an empty item or whitespace inside an item."""
    n = len(text)
    i = 0
    while i < n and text[i] in _C_SPACE:
        i += 1
    items: list[str] = []
    if i == n:
        return items  # an empty list is allowed
    while True:
        start = i
        while i < n and text[i] != "," and text[i] not in _C_SPACE:
            if text[i] == "\\":
                i += 1
            i += 1
        end = min(i, n)
        if start == end and not allow_empty_items:
            raise ValueError
        while i < n and text[i] in _C_SPACE:
            i += 1
        items.append(text[start:end])
        if i >= n:
            return items
        if text[i] != ",":
            raise ValueError
        i += 1
        while i < n and text[i] in _C_SPACE:
            i += 1


def _unescape(text: str) -> str:
    """Backslash takes the next character literally."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text[i] == "\\":
            i += 1
            if i == n:
                break
        out.append(text[i])
        i += 1
    return "".join(out)


def _select_table(item: str) -> SelectTable:
    """wal2json's parse_table_identifier: ``schema.table``, backslash escapes, ``*.`` any
    schema and ``.*`` any table (checked before unescaping, so ``\\*`` is a table named *)."""
    all_schemas = item[:2] == "*."
    i, n = 0, len(item)
    while i < n and item[i] != ".":
        if item[i] == "\\":
            i += 1
        i += 1
    if i >= n:
        raise ValueError  # no separator: the schema is required
    rest = item[i + 1:]
    return SelectTable(_unescape(item[:i]), _unescape(rest), all_schemas, rest == "*")


def _parse_tables(text: str | None) -> list[SelectTable]:
    # "-o add-tables" without a value leaves no table added, as in wal2json
    return [] if text is None else [_select_table(item) for item in _split(text)]


def _parse_list(text: str | None) -> list[str]:
    return [] if text is None else _split(text)


def _atoi(token: str) -> int:
    """C's atoi: leading whitespace, a sign, digits; 0 when there are none."""
    s = token.lstrip(_C_SPACE)
    sign = 1
    if s[:1] in ("+", "-"):
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    digits = 0
    for ch in s:
        if not "0" <= ch <= "9":
            break
        digits = digits * 10 + ord(ch) - 48
    return sign * digits


def _parse_origins(text: str | None) -> list[int]:
    if text is None:
        return []
    return [_atoi(tok) & 0xFFFFFFFF for tok in _split(text, allow_empty_items=True)]


def _parse_actions(text: str | None) -> list[str] | None:
    return None if text is None else _split(text)


def _parse_format_version(text: str | None) -> int:
    """PostgreSQL's parse_int without units: decimal, 0x hex or 0 octal, or a number with
    a fraction or exponent rounded to an integer; surrounding whitespace allowed."""
    if text is None:
        return FORMAT_VERSION
    s = text.strip(_C_SPACE)
    try:
        body = s.lstrip("+-")
        if body[:2].lower() == "0x":
            value = int(s, 16)
        elif len(body) > 1 and body[0] == "0" and body.isdigit():
            value = int(s, 8)
        elif body.isdigit():
            value = int(s)
        else:
            number = float(s)
            if number != number or abs(number) == float("inf"):
                raise ValueError
            value = round(number)
    except (ValueError, IndexError):
        raise ValueError from None
    if not -(2**31) <= value < 2**31:
        raise ValueError
    return value


def _bool(text: str | None) -> bool:
    """PostgreSQL's parse_bool, which (unlike emitters.options.parse_bool) does not trim
    whitespace; a valueless option is true."""
    if text is None:
        return True
    value = parse_bool(text) if text == text.strip() else None
    if value is None:
        raise ValueError
    return value


def _deprecated(text: str | None) -> bool:
    raise ValueError("the parameter was deprecated")  # read_options words it as wal2json


#: wal2json 2.5's options, its names and defaults (plus numeric-data-types-as-string of 2.6).
OPTIONS: Final[tuple[Option, ...]] = (
    Option("format-version", 1, _parse_format_version,
           "1: a JSON document per transaction; 2: a JSON object per change"),
    Option("include-transaction", True, _bool, help="v2: B and C objects for each transaction"),
    Option("include-xids", False, _bool, help="the transaction id"),
    Option("include-timestamp", False, _bool, help="the commit time"),
    Option("include-origin", False, _bool, help="the replication origin id (needs a catalog for "
           "transactions that have an origin)"),
    Option("include-schemas", True, _bool, help="the schema of each table"),
    Option("include-types", True, _bool, help="column types"),
    Option("include-type-oids", False, _bool, help="column type OIDs"),
    Option("include-typmod", True, _bool, help="v1: type names with their modifiers"),
    Option("include-domain-data-type", False, _bool, help="domains as their base types (catalog)"),
    Option("include-column-positions", False, _bool, help="column numbers (catalog)"),
    Option("include-not-null", False, _bool, help="NOT NULL constraints (catalog)"),
    Option("include-default", False, _bool, help="column defaults (catalog)"),
    Option("include-pk", False, _bool, help="primary key columns"),
    Option("include-lsn", False, _bool, help="LSNs (the transaction's output is held until its "
           "commit, on disk past 16 MB, when the end LSN is not known at its begin)"),
    Option("pretty-print", False, _bool, help="v1: indented output"),
    Option("write-in-chunks", False, _bool, help="v1: one write per change"),
    Option("numeric-data-types-as-string", False, _bool,
           help="numbers as JSON strings (wal2json 2.6)"),
    Option("actions", None, _parse_actions, help="insert, update, delete, truncate"),
    Option("filter-origins", [], _parse_origins, help="origin ids whose changes are skipped"),
    Option("filter-tables", [], _parse_tables, help="schema.table patterns to skip"),
    Option("add-tables", [ALL_TABLES], _parse_tables, help="schema.table patterns to keep"),
    Option("filter-msg-prefixes", [], _parse_list, help="message prefixes to skip"),
    Option("add-msg-prefixes", [], _parse_list, help="message prefixes to keep"),
    Option("include-unchanged-toast", None, _deprecated, help="deprecated: an error"),
)
_BY_NAME: Final = {o.name: o for o in OPTIONS}
ACTIONS: Final = ("insert", "update", "delete", "truncate")
_CATALOG_OPTIONS: Final = {
    "include-not-null": "NOT NULL constraints",
    "include-default": "column defaults",
    "include-domain-data-type": "the base types of domains",
    "include-column-positions": "column numbers (attnum)",
}


def read_options(given: dict[str, str | None], has_catalog: bool) -> dict[str, Any]:
    """The options' values, checked in the order given, with wal2json's error messages."""
    values = {o.name: o.default for o in OPTIONS}
    for name, text in given.items():
        if name == "include-unchanged-toast":
            raise OptionError(f'parameter "{name}" was deprecated')
        opt = _BY_NAME.get(name)
        if opt is None:
            parse_options(OPTIONS, {name: text})  # raises wal2json's "is unknown" error
            raise AssertionError
        values[name] = parse_options((opt,), {name: text})[name]
        if name == "actions" and values[name] is not None:
            for item in values[name]:
                if item not in ACTIONS:
                    raise OptionError(f'could not parse value "{item}" for parameter "{name}"')
        elif name == "format-version":
            version = values[name]
            if version > FORMAT_VERSION:
                raise OptionError(f"client sent format_version={version} but we only support "
                                  f"format {FORMAT_VERSION} or lower")
            if version < FORMAT_MIN_VERSION:
                raise OptionError(f"client sent format_version={version} but we only support "
                                  f"format {FORMAT_MIN_VERSION} or higher")
    if not has_catalog:
        for name, what in _CATALOG_OPTIONS.items():
            if values[name]:
                raise OptionError(
                    f'option "{name}" needs the catalog: pgoutput does not send {what}; '
                    "run with a database connection for catalog lookups"
                )
    return values
