"""wal2json 2.5, as an emitter: the JSON that the wal2json output plugin prints, from pgoutput.

Format version 1 (the default: one JSON document per transaction, optionally written in chunks
and pretty-printed) and format version 2 (one JSON object per change, "B"/"C" objects for the
transaction boundaries) with every option of wal2json 2.5, plus ``numeric-data-types-as-string``
of wal2json 2.6. The output is byte for byte what wal2json prints for the same transactions,
quirks included (docs/emitters-wal2json.md lists them, and where pgoutput cannot tell what
wal2json sees).

What pgoutput does not send is read from ``ctx.catalog`` when there is one: NOT NULL flags,
defaults, column positions, domain base types, the primary key of tables whose replica identity
is not the primary key, replication origin ids, the exact names of non-built-in types, and the
session time zone. Options that need it are rejected without a catalog.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from typing import Any, Final
from zoneinfo import ZoneInfo

import orjson

from emitters.options import Option, OptionError, parse_bool, parse_options
from plugin_framework import LSN, Action, OutputPlugin
from plugin_framework.framework.context import LogicalDecodingContext, OutputType
from plugin_framework.framework.model import Relation, Row, Transaction, TruncateChange
from plugin_framework.framework.spool import Spool, SpoolBudget
from plugin_framework.pgtypes import TYPNAMES as _TYPNAMES
from plugin_framework.pgtypes import format_type_sql, timestamptz_to_str
from plugin_framework.protocol import KIND_NULL, KIND_TEXT, KIND_UNCHANGED_TOAST

__all__ = ["OPTIONS", "Wal2JsonEmitter"]

log = logging.getLogger("pgdecode.wal2json")

FORMAT_VERSION: Final = 2  # the highest format version (wal2json's WAL2JSON_FORMAT_VERSION)
FORMAT_MIN_VERSION: Final = 1
# Memory for a transaction's output held until its commit (include-lsn); past it, the output
# goes to a temporary file, as the framework's spools do, so a huge transaction stays bounded.
HOLD_MEMORY = 16 * 1024 * 1024

_BOOLOID: Final = 16
_BYTEAOID: Final = 17
_NUMBER_OIDS: Final = frozenset((20, 21, 23, 26, 700, 701, 1700))  # int8 int2 int4 oid float*
_SPECIAL_NUMBERS: Final = frozenset((b"NaN", b"Infinity", b"-Infinity"))


_C_SPACE: Final = " \t\n\v\f\r"  # isspace() in the C locale
_IDENTITY_NAMES: Final = {"f": "FULL", "i": "USING INDEX", "n": "NOTHING", "d": "DEFAULT"}


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
_ACTIONS: Final = ("insert", "update", "delete", "truncate")
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
                if item not in _ACTIONS:
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


# --- JSON and PostgreSQL text ----------------------------------------------------------------

_dumps = orjson.dumps
_BYTE_ESCAPES: Final = {i: b"\\u%04x" % i for i in range(32)} | {
    0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x22: b'\\"',
    0x5C: b"\\\\",
}


def _escape_bytes(raw: bytes) -> bytes:
    """PostgreSQL's escape_json over bytes that need not be UTF-8."""
    out = bytearray(b'"')
    for byte in raw:
        esc = _BYTE_ESCAPES.get(byte)
        if esc is None:
            out.append(byte)
        else:
            out += esc
    out += b'"'
    return bytes(out)


def escape_json(text: str) -> bytes:
    """PostgreSQL's escape_json: orjson escapes exactly the same characters the same way
    (\\b \\f \\n \\r \\t \\" \\\\ and \\u00XX in lower case for other controls)."""
    return _dumps(text)


def _escape_raw(raw: bytes) -> bytes:
    try:
        return _dumps(raw.decode())
    except UnicodeDecodeError:
        return _escape_bytes(raw)


def _json_type(type_str: str, arrays_escaped: bool = True) -> bytes:
    """A type name as wal2json prints it: a name format_type already double-quoted is printed
    as is (unless it is an array, ``"char"[]``), anything else goes through escape_json."""
    if type_str[:1] == '"' and (not arrays_escaped or type_str[-1:] != "]"):
        return type_str.encode()
    return escape_json(type_str)


# --- what the catalog knows about a table ------------------------------------------------------

_COLUMNS_SQL: Final = """
SELECT a.attname, a.attnum, a.attnotnull,
       CASE WHEN a.atthasdef AND a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END,
       t.typtype = 'd', t.typbasetype, t.typname, format_type(a.atttypid, a.atttypmod),
       bt.typname, format_type(t.typbasetype, t.typtypmod),
       EXISTS (SELECT FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary
               AND a.attnum = ANY (i.indkey))
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON bt.oid = t.typbasetype
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = {relid} AND a.attnum > 0 AND NOT a.attisdropped /* read {generation} */
"""


@dataclass(frozen=True, slots=True)
class _CatalogColumn:
    attnum: int
    not_null: bool
    default: str | None
    is_domain: bool
    base_oid: int
    typname: str
    type_with_typmod: str
    base_typname: str | None
    base_with_typmod: str
    in_pk: bool


# --- per relation: everything that does not depend on the row ---------------------------------


@dataclass(eq=False, slots=True)
class _Col:
    name: bytes  # JSON
    convert: _Converter  # how its value prints
    v1_type: bytes  # JSON of the type as v1 prints it (keytypes/columntypes)
    v1_pk_type: bytes  # JSON of the type as v1's pk object prints it
    v1_oid: bytes  # the type OID v1 prints
    v2_change: tuple[bytes, bytes]  # v2: text before and after the value, in "columns"
    v2_identity: bytes  # v2: text before the value, in "identity"
    v2_pk: bytes  # v2: the whole object, in "pk"
    v1_position: bytes
    v1_optional: bytes
    v1_default: bytes


@dataclass(eq=False, slots=True)
class _Rel:
    relation: Relation
    selected: bool  # passes add-tables and filter-tables
    cols: list[_Col]
    key: list[int]  # replica identity columns (pgoutput's key flag)
    has_identity: bool  # wal2json's "rd_replidindex is valid or REPLICA IDENTITY FULL"
    v1_pk: bool  # v1 prints "pk": a primary key that is the replica identity
    pk: list[int] | None  # v2: primary key columns, None when the table has none
    schema_table: bytes  # v2: ,"schema":...,"table":...
    v1_heads: dict[str, bytes] = field(default_factory=dict)  # per action: "kind" to "table"
    v1_columns_head: bytes = b""  # v1: names, types... up to "columnvalues":[
    v1_pk_blocks: tuple[bytes, bytes] = (b"", b"")  # without and with a trailing comma
    converters: list[_Converter | None] = field(default_factory=list)  # None: a string
    v2_columns: list[bytes] = field(default_factory=list)  # v2: what goes between the values


class _State:
    """The plugin's private data (wal2json's JsonDecodingData)."""

    def __init__(self, values: dict[str, Any], catalog: Any) -> None:
        self.version: int = values["format-version"]
        self.include_transaction: bool = values["include-transaction"]
        self.include_xids: bool = values["include-xids"]
        self.include_timestamp: bool = values["include-timestamp"]
        self.include_origin: bool = values["include-origin"]
        self.include_schemas: bool = values["include-schemas"]
        self.include_types: bool = values["include-types"]
        self.include_type_oids: bool = values["include-type-oids"]
        self.include_typmod: bool = values["include-typmod"]
        self.include_domain_data_type: bool = values["include-domain-data-type"]
        self.include_column_positions: bool = values["include-column-positions"]
        self.include_not_null: bool = values["include-not-null"]
        self.include_default: bool = values["include-default"]
        self.include_pk: bool = values["include-pk"]
        self.include_lsn: bool = values["include-lsn"]
        self.pretty: bool = values["pretty-print"]
        self.chunks: bool = values["write-in-chunks"]
        self.numeric_as_string: bool = values["numeric-data-types-as-string"]
        actions = values["actions"]
        selected = set(_ACTIONS) if actions is None else set(actions)
        self.do_insert = "insert" in selected
        self.do_update = "update" in selected
        self.do_delete = "delete" in selected
        self.do_truncate = "truncate" in selected
        self.filter_origins: list[int] = values["filter-origins"]
        self.filter_tables: list[SelectTable] = values["filter-tables"]
        self.add_tables: list[SelectTable] = values["add-tables"]
        self.filter_msg_prefixes: list[str] = values["filter-msg-prefixes"]
        self.add_msg_prefixes: list[str] = values["add-msg-prefixes"]
        self.catalog = catalog
        if self.pretty:
            self.ht, self.nl, self.sp = b"\t", b"\n", b" "
        else:
            self.ht = self.nl = self.sp = b""
        self.comma = b"," + self.sp
        self.zone: tzinfo = UTC
        if self.include_timestamp and catalog is not None:
            self.zone = _session_zone(catalog)

        self.nr_changes = 0  # wal2json's counter: changes and messages of the transaction
        self.rels: dict[int, _Rel] = {}
        self.generation = 0
        self.txn_fields = b""  # v2: ,"xid":..,"timestamp":..,"origin":.. of the transaction
        self.v1_parts: list[bytes] = []  # v1 without chunks: the document being built
        self.held: Spool | None = None  # output awaiting the commit (include-lsn)
        self.held_begin: tuple[LSN, int | None] | None = None
        self.origin_ids: dict[str, int] = {}
        self.origin_reads = 0


def _session_zone(catalog: Any) -> tzinfo:
    name = str(catalog.query("SELECT current_setting('TimeZone')")[0][0])
    try:
        return ZoneInfo(name)
    except (ValueError, OSError):
        log.warning('wal2json: time zone "%s" is not an IANA zone name; printing commit '
                    "times in UTC", name)
        return UTC


# How a column's value prints, from the server's text output of it. Numbers print bare, except
# NaN and the infinities, which JSON has not: null; booleans as true/false; bytea without its
# leading \x; anything else as a JSON string.


def _string_value(raw: bytes) -> bytes:
    try:
        return _dumps(raw.decode())
    except UnicodeDecodeError:
        return _escape_bytes(raw)


def _number_value(raw: bytes) -> bytes:
    return b"null" if raw in _SPECIAL_NUMBERS else raw


def _number_string_value(raw: bytes) -> bytes:
    return b'"' + raw + b'"'  # numeric-data-types-as-string: digits, signs, NaN: no escapes


def _bool_value(raw: bytes) -> bytes:
    return b"true" if raw == b"t" else b"false"


def _bytea_value(raw: bytes) -> bytes:
    return _string_value(raw[2:])


_Converter = Callable[[bytes], bytes]


def _binary_error(rel: Relation, index: int) -> Exception:
    return ValueError(
        f'column "{rel.columns[index].name}" of table "{rel.namespace}"."{rel.name}" arrived '
        "in binary format: the wal2json emitter prints the server's text output; run pgoutput "
        "with binary = false"
    )


def _converter(st: _State, type_oid: int) -> _Converter:
    if type_oid in _NUMBER_OIDS:
        return _number_string_value if st.numeric_as_string else _number_value
    if type_oid == _BOOLOID:
        return _bool_value
    if type_oid == _BYTEAOID:
        return _bytea_value
    return _string_value


def _row_values(r: _Rel, row: Row) -> list[bytes] | None:
    """Every column's JSON value, for the usual row of text and NULL columns only (None
    otherwise: the caller takes the column by column way)."""
    data = row.data
    if data.kinds.strip(b"tn"):
        return None
    dumps = _dumps
    try:
        # strings (conv None, the most common) are converted inline: no call per value
        return [b"null" if raw is None else dumps(raw.decode()) if conv is None else conv(raw)
                for conv, raw in zip(r.converters, data.values, strict=True)]
    except UnicodeDecodeError:
        return None  # not UTF-8: escaped byte by byte, column by column


def _selected(st: _State, schema: str, table: str) -> bool:
    """Not in filter-tables, and in add-tables."""
    return (not any(t.matches(schema, table) for t in st.filter_tables)
            and any(t.matches(schema, table) for t in st.add_tables))


def _compile(st: _State, rel: Relation) -> _Rel:
    """Everything about a table that wal2json prints the same way for every row."""
    schema, table = rel.namespace, rel.name
    selected = _selected(st, schema, table)
    key = [i for i, c in enumerate(rel.columns) if c.is_key]
    has_identity = bool(key) or rel.replica_identity == "f"
    # Under REPLICA IDENTITY DEFAULT the key columns are the primary key's (none: no key).
    default_identity = rel.replica_identity == "d"
    default_pk = default_identity and bool(key)
    info: dict[str, _CatalogColumn] = {}
    non_builtin = any(c.type_oid not in _TYPNAMES for c in rel.columns)
    needs_catalog = (st.include_not_null or st.include_default or st.include_domain_data_type
                     or st.include_column_positions
                     or (st.include_pk and st.version == 2 and not default_identity)
                     or (st.include_types and non_builtin))
    if needs_catalog and st.catalog is not None:
        # Catalog.query caches by query text: the generation makes a new Relation message
        # read the catalog again. The OID is inlined because Catalog.check_read_only parses
        # the text before parameters are bound, and so rejects %s placeholders.
        st.generation += 1
        sql = _COLUMNS_SQL.format(relid=int(rel.relation_id), generation=st.generation)
        for row in st.catalog.query(sql):
            info[row[0]] = _CatalogColumn(*row[1:])
    elif st.include_types and non_builtin:
        log.warning('wal2json: no catalog: the types of table "%s"."%s" that are not built in '
                    "are named from pgoutput's Type messages (a domain shows as its base "
                    "type, an array of a user type as _name)", schema, table)

    pk: list[int] | None = None
    if st.version == 2 and st.include_pk:
        if default_identity:
            pk = key or None
        elif not info:
            identity = _IDENTITY_NAMES.get(rel.replica_identity, rel.replica_identity)
            raise ValueError(
                f'include-pk: table "{schema}"."{table}" has REPLICA IDENTITY {identity}, so '
                "pgoutput does not say which columns are its primary key; run with a database "
                "connection for catalog lookups"
            )
        else:
            pk = [i for i, c in enumerate(rel.columns) if info[c.name].in_pk] or None

    ht, nl, sp = st.ht, st.nl, st.sp
    cols: list[_Col] = []
    for c in rel.columns:
        cat = info.get(c.name)
        name = escape_json(c.name)
        type_oid = c.type_oid
        # the type names, with and without typmod, of the column and of a domain's base type
        if type_oid in _TYPNAMES:
            with_typmod = format_type_sql(type_oid, c.type_modifier)
            typname = _TYPNAMES[type_oid]
        elif cat is not None:
            with_typmod, typname = cat.type_with_typmod, cat.typname
        else:
            with_typmod = typname = c.type_name
        v1_oid = type_oid
        v1_type_str = with_typmod if st.include_typmod else typname
        v2_type_str = with_typmod
        if st.include_domain_data_type and cat is not None and cat.is_domain:
            # v1 replaces the type (and the OID that decides how the value prints) only
            # where it prints types
            if st.include_types:
                v1_oid = cat.base_oid
            v1_type_str = (cat.base_with_typmod if st.include_typmod
                           else cat.base_typname or "")
            v2_type_str = cat.base_with_typmod
        v1_convert = _converter(st, v1_oid)
        v1_type = _json_type(v1_type_str)
        v1_pk_type = _json_type(v1_type_str, arrays_escaped=False)
        v2_type = _json_type(v2_type_str)

        before = b'{"name":' + name
        if st.include_types:
            before += b',"type":' + v2_type
        if st.include_type_oids:
            before += b',"typeoid":%d' % (type_oid if type_oid < 2**31 else type_oid - 2**32)
        v2_pk = before + b"}"
        before += b',"value":'
        after = b""
        if st.include_not_null:
            after += b',"optional":false' if cat is not None and cat.not_null else (
                b',"optional":true')
        if st.include_column_positions:
            after += b',"position":%d' % (cat.attnum if cat is not None else 0)
        default = None if cat is None else cat.default
        if st.include_default:
            after += b',"default":' + (b"null" if default is None
                                       else b'"' + default.encode() + b'"')
        cols.append(_Col(
            name=name, convert=v1_convert if st.version == 1 else _converter(st, type_oid),
            v1_type=v1_type, v1_pk_type=v1_pk_type, v1_oid=b"%d" % v1_oid,
            v2_change=(before, after + b"}"), v2_identity=before, v2_pk=v2_pk,
            v1_position=b"%d" % (cat.attnum if cat is not None else 0),
            v1_optional=b"false" if cat is not None and cat.not_null else b"true",
            v1_default=b"null" if default is None else b'"' + default.encode() + b'"',
        ))

    schema_json, table_json = escape_json(schema), escape_json(table)
    r = _Rel(rel, selected, cols, key, has_identity, default_pk and st.include_pk, pk,
             (b',"schema":' + schema_json if st.include_schemas else b"")
             + b',"table":' + table_json)
    r.converters = [None if c.convert is _string_value else c.convert for c in cols]
    between = [b',"columns":[']
    for col in cols:
        between[-1] += col.v2_change[0]
        between.append(col.v2_change[1] + b",")
    between[-1] = between[-1].removesuffix(b",") + b"]"
    r.v2_columns = between
    if st.version == 1:
        h3 = ht * 3
        for kind in ("insert", "update", "delete"):
            head = b"{" + nl + h3 + b'"kind":' + sp + b'"' + kind.encode() + b'",' + nl
            if st.include_schemas:
                head += h3 + b'"schema":' + sp + schema_json + b"," + nl
            r.v1_heads[kind] = head + h3 + b'"table":' + sp + table_json + b"," + nl
        r.v1_columns_head = _v1_columns_head(st, cols)
        h4 = ht * 4
        keys = [cols[i] for i in key]
        pk_block = (h3 + b'"pk":' + sp + b"{" + nl
                    + h4 + b'"pknames":' + sp + b"[" + st.comma.join(c.name for c in keys)
                    + b"]," + nl
                    + h4 + b'"pktypes":' + sp + b"["
                    + (st.comma.join(c.v1_pk_type for c in keys) if st.include_types else b"")
                    + b"]" + nl + h3 + b"}")
        r.v1_pk_blocks = (pk_block + nl, pk_block + b"," + nl)
    return r


def _v1_columns_head(st: _State, cols: Sequence[_Col]) -> bytes:
    """v1's "columnnames" ... up to and including ``"columnvalues":[`` for these columns."""
    h3, nl, sp, comma = st.ht * 3, st.nl, st.sp, st.comma
    out = h3 + b'"columnnames":' + sp + b"[" + comma.join(c.name for c in cols) + b"]," + nl
    if st.include_types:
        out += (h3 + b'"columntypes":' + sp + b"[" + comma.join(c.v1_type for c in cols)
                + b"]," + nl)
    if st.include_type_oids:
        out += (h3 + b'"columntypeoids":' + sp + b"[" + comma.join(c.v1_oid for c in cols)
                + b"]," + nl)
    if st.include_column_positions:
        out += (h3 + b'"columnpositions":' + sp + b"["
                + comma.join(c.v1_position for c in cols) + b"]," + nl)
    if st.include_not_null:
        # wal2json fills this array only when it prints types
        optionals = comma.join(c.v1_optional for c in cols) if st.include_types else b""
        out += h3 + b'"columnoptionals":' + sp + b"[" + optionals + b"]," + nl
    if st.include_default:
        out += (h3 + b'"columndefaults":' + sp + b"["
                + comma.join(c.v1_default for c in cols) + b"]," + nl)
    return out + h3 + b'"columnvalues":' + sp + b"["


# --- the emitter -------------------------------------------------------------------------------


class Wal2JsonEmitter(OutputPlugin):
    """wal2json 2.5's output from pgoutput; see the module docstring."""

    name = "wal2json"

    # -- set-up --------------------------------------------------------------------------------

    def startup(self, ctx: LogicalDecodingContext, options: Any, is_init: bool) -> None:
        values = read_options(ctx.output_plugin_options, ctx.catalog is not None)
        ctx.output_plugin_private = _State(values, ctx.catalog)
        options.output_type = OutputType.TEXTUAL

    def shutdown(self, ctx: LogicalDecodingContext) -> None:
        ctx.output_plugin_private = None

    def filter_by_origin(self, ctx: LogicalDecodingContext, origin: str) -> bool:
        st: _State = ctx.output_plugin_private
        if not st.filter_origins:
            return False
        return _origin_id(st, origin, "filter-origins") in st.filter_origins

    # -- transactions --------------------------------------------------------------------------

    def begin(self, ctx: LogicalDecodingContext, txn: Transaction) -> None:
        st: _State = ctx.output_plugin_private
        st.nr_changes = 0
        fields = b""
        if st.include_xids:
            fields += b',"xid":%d' % txn.xid
        if st.include_timestamp:
            fields += b',"timestamp":"' + _timestamp(st, txn) + b'"'
        if st.include_origin:
            fields += b',"origin":%d' % _txn_origin_id(st, txn)
        st.txn_fields = fields
        # include-lsn prints the end of the commit record at the begin, which pgoutput's Begin
        # does not carry: hold the transaction's output until the commit tells it.
        hold = (st.include_lsn and txn.end_lsn is None
                and (st.chunks if st.version == 1 else st.include_transaction))
        if st.held is not None:  # a transaction cut short (the stream restarted)
            st.held.close()
        st.held = Spool(SpoolBudget(HOLD_MEMORY)) if hold else None
        st.held_begin = (ctx.write_location, ctx.write_xid) if hold else None
        if st.version == 2:
            if st.include_transaction and not hold:
                ctx.emit(_v2_boundary(st, b"B", txn, txn.final_lsn))
        else:
            st.v1_parts = []
            if st.chunks and not hold:
                ctx.emit(_v1_begin(st, txn))

    def commit(self, ctx: LogicalDecodingContext, txn: Transaction, commit_lsn: LSN) -> None:
        st: _State = ctx.output_plugin_private
        held, st.held = st.held, None
        if held is not None:
            here = (ctx.write_location, ctx.write_xid)
            assert st.held_begin is not None
            ctx.write_location, ctx.write_xid = st.held_begin
            if st.version == 2:
                ctx.emit(_v2_boundary(st, b"B", txn, txn.final_lsn))
            elif st.chunks:
                ctx.emit(_v1_begin(st, txn))
            try:
                for lsn, xid, _, data in held:
                    ctx.write_location, ctx.write_xid = lsn, xid or None
                    ctx.emit(data)
            finally:
                held.close()
            ctx.write_location, ctx.write_xid = here
        if st.version == 2:
            if st.include_transaction:
                ctx.emit(_v2_boundary(st, b"C", txn, commit_lsn))
            return
        ht, nl = st.ht, st.nl
        if st.chunks:
            ctx.emit(ht + b"]" + nl + b"}")
        else:
            parts = st.v1_parts
            st.v1_parts = []
            ctx.emit(b"".join((_v1_begin(st, txn), *parts, nl, ht, b"]", nl, b"}")))

    # -- changes -------------------------------------------------------------------------------

    def change(self, ctx: LogicalDecodingContext, txn: Transaction, relation: Relation,
               change: Any) -> None:
        st: _State = ctx.output_plugin_private
        action = change.action
        if action is Action.INSERT:
            if not st.do_insert:
                return
        elif action is Action.UPDATE:
            if not st.do_update:
                return
        elif not st.do_delete:
            return
        r = st.rels.get(relation.relation_id)
        if r is None or r.relation is not relation:
            r = st.rels[relation.relation_id] = _compile(st, relation)
        if not r.selected:
            return
        if st.version == 2:
            data = _v2_change(st, r, change)
            if data is not None:
                self._out(ctx, st, data)
            return
        data = _v1_change(st, r, change)
        if data is None:
            return
        if st.chunks:
            self._out(ctx, st, data)
        else:
            st.v1_parts.append(data)

    def truncate(self, ctx: LogicalDecodingContext, txn: Transaction,
                 relations: Sequence[Relation], change: TruncateChange) -> None:
        st: _State = ctx.output_plugin_private
        if st.version == 1 or not st.do_truncate:
            return  # wal2json's format 1 prints nothing for TRUNCATE
        lsn = b',"lsn":"%s"' % str(change.lsn).encode() if st.include_lsn else b""
        for relation in relations:
            if _selected(st, relation.namespace, relation.name):
                schema = (b',"schema":' + escape_json(relation.namespace)
                          if st.include_schemas else b"")
                self._out(ctx, st, b'{"action":"T"' + st.txn_fields + lsn + schema
                          + b',"table":' + escape_json(relation.name) + b"}")

    def message(self, ctx: LogicalDecodingContext, txn: Transaction | None, message_lsn: LSN,
                transactional: bool, prefix: str, message: bytes) -> None:
        st: _State = ctx.output_plugin_private
        if st.filter_msg_prefixes and prefix in st.filter_msg_prefixes:
            return
        if st.add_msg_prefixes and prefix not in st.add_msg_prefixes:
            return
        content = _escape_raw(bytes(message).split(b"\0", 1)[0])
        prefix_json = escape_json(prefix)
        if st.version == 2:
            out = b'{"action":"M"'
            if transactional:
                out += st.txn_fields
            else:
                if st.include_xids:
                    out += b',"xid":null'
                if st.include_timestamp:
                    out += b',"timestamp":null'
                if st.include_origin:
                    out += b',"origin":null'
            if st.include_lsn:
                out += b',"lsn":"%s"' % str(message_lsn).encode()
            out += (b',"transactional":true' if transactional else b',"transactional":false')
            out += b',"prefix":' + prefix_json + b',"content":' + content + b"}"
            if transactional:
                self._out(ctx, st, out)
            else:
                ctx.emit(out)
            return
        ht, nl, sp = st.ht, st.nl, st.sp
        h3 = ht * 3
        if transactional:
            st.nr_changes += 1
        parts = []
        if not st.chunks and transactional:
            parts.append(nl)
        if not transactional:
            parts.append(b"{" + nl + ht + b'"change":' + sp + b"[" + nl)
        parts.append(ht + ht)
        # wal2json 2.5 also prints this comma before a non-transactional message, counting the
        # changes of the last transaction decoded before it
        if st.nr_changes > 1:
            parts.append(b",")
        parts += [b"{", nl, h3, b'"kind":', sp, b'"message",', nl,
                  h3, b'"transactional":', sp, b"true," if transactional else b"false,", nl,
                  h3, b'"prefix":', sp, prefix_json, b",", nl, h3, b'"content":', sp, content,
                  nl, ht, ht, b"}"]
        if not transactional:
            parts += [nl, ht, b"]", nl, b"}"]
        data = b"".join(parts)
        if not transactional:
            ctx.emit(data)
        elif st.chunks:
            self._out(ctx, st, data)
        else:
            st.v1_parts.append(data)

    @staticmethod
    def _out(ctx: LogicalDecodingContext, st: _State, data: bytes) -> None:
        held = st.held
        if held is None:
            ctx.emit(data)
        else:
            held.append(ctx.write_location, ctx.write_xid or 0, False, data)


# --- transaction boundaries --------------------------------------------------------------------


def _timestamp(st: _State, txn: Transaction) -> bytes:
    if txn.commit_time is None:
        raise ValueError(f"include-timestamp: transaction {txn.xid} has no commit time")
    return timestamptz_to_str(txn.commit_time, st.zone).encode()


def _origin_id(st: _State, origin: str, option: str) -> int:
    ident = st.origin_ids.get(origin)
    if ident is None:
        if st.catalog is None:
            raise ValueError(
                f'{option}: a transaction comes from replication origin "{origin}"; pgoutput '
                "sends origin names and wal2json prints origin ids: run with a database "
                "connection for catalog lookups"
            )
        # every origin at once, read again (a new query text) when one is not known yet
        st.origin_reads += 1
        rows = st.catalog.query("SELECT roname, roident FROM pg_replication_origin "
                                f"/* read {st.origin_reads} */")
        st.origin_ids.update((str(name), int(ident)) for name, ident in rows)
        found = st.origin_ids.get(origin)
        if found is None:
            raise ValueError(f'{option}: replication origin "{origin}" does not exist (any '
                             "more), its id is unknown")
        ident = found
    return ident


def _txn_origin_id(st: _State, txn: Transaction) -> int:
    return 0 if not txn.origin else _origin_id(st, txn.origin, "include-origin")


def _v2_boundary(st: _State, action: bytes, txn: Transaction, lsn: LSN | None) -> bytes:
    out = b'{"action":"' + action + b'"' + st.txn_fields
    if st.include_lsn:
        out += (b',"lsn":"' + str(LSN(lsn or 0)).encode() + b'","nextlsn":"'
                + str(LSN(txn.end_lsn or 0)).encode() + b'"')
    return out + b"}"


def _v1_begin(st: _State, txn: Transaction) -> bytes:
    ht, nl, sp = st.ht, st.nl, st.sp
    out = b"{" + nl
    if st.include_xids:
        out += ht + b'"xid":' + sp + b"%d" % txn.xid + b"," + nl
    if st.include_lsn:
        out += (ht + b'"nextlsn":' + sp + b'"' + str(LSN(txn.end_lsn or 0)).encode() + b'",'
                + nl)
    if st.include_timestamp:
        out += ht + b'"timestamp":' + sp + b'"' + _timestamp(st, txn) + b'",' + nl
    if st.include_origin:
        out += ht + b'"origin":' + sp + b"%d" % _txn_origin_id(st, txn) + b"," + nl
    return out + ht + b'"change":' + sp + b"["


# --- format version 2 ----------------------------------------------------------------------------


def _v2_change(st: _State, r: _Rel, change: Any) -> bytes | None:
    action = change.action
    new: Row | None = change.new
    old: Row | None = change.old
    rel = r.relation
    if action is Action.INSERT:
        head = b'{"action":"I"'
    else:
        if old is None and not r.has_identity:
            log.warning('wal2json: no tuple identifier for %s in table "%s"."%s"',
                        action, rel.namespace, rel.name)
            return None
        head = b'{"action":"U"' if action is Action.UPDATE else b'{"action":"D"'
    parts = [head, st.txn_fields]
    if st.include_lsn:
        parts.append(b',"lsn":"' + str(change.lsn).encode() + b'"')
    parts.append(r.schema_table)
    cols = r.cols
    if new is not None:
        values = _row_values(r, new)
        if values is not None:
            interleaved = [b""] * (2 * len(values) + 1)
            interleaved[::2] = r.v2_columns
            interleaved[1::2] = values
            parts += interleaved
        else:
            parts.append(b',"columns":[')
            kinds, raws = new.data.kinds, new.data.values
            sep = b""
            for i, col in enumerate(cols):
                kind = kinds[i]
                if kind == KIND_TEXT:
                    raw = raws[i]
                    assert raw is not None
                    value = col.convert(raw)
                elif kind == KIND_NULL:
                    value = b"null"
                elif kind == KIND_UNCHANGED_TOAST:
                    continue
                else:
                    raise _binary_error(rel, i)
                before, after = col.v2_change
                parts += (sep, before, value, after)
                sep = b","
            parts.append(b"]")
    identity: Row | None = old
    if identity is None and action is Action.UPDATE:
        if r.key:
            identity = new  # the key did not change: wal2json takes it from the new row
        else:
            log.warning('wal2json: no old tuple data for UPDATE in table "%s"."%s"',
                        rel.namespace, rel.name)
    if identity is not None:
        parts.append(b',"identity":[')
        kinds, raws = identity.data.kinds, identity.data.values
        sep = b""
        for i in r.key:
            kind = kinds[i]
            if kind == KIND_TEXT:
                raw = raws[i]
                assert raw is not None
                value = cols[i].convert(raw)
            elif kind == KIND_NULL:
                value = b"null"
            elif kind == KIND_UNCHANGED_TOAST:
                continue
            else:
                raise _binary_error(rel, i)
            parts += (sep, cols[i].v2_identity, value, b"}")
            sep = b","
        parts.append(b"]")
    if st.include_pk:
        parts.append(b',"pk":[')
        if r.pk is not None:
            source = old if old is not None else new
            assert source is not None
            kinds = source.data.kinds
            parts.append(b",".join(cols[i].v2_pk for i in r.pk
                                   if kinds[i] != KIND_UNCHANGED_TOAST))
        parts.append(b"]")
    parts.append(b"}")
    return b"".join(parts)


# --- format version 1 ----------------------------------------------------------------------------


def _v1_values(st: _State, r: _Rel, row: Row, indexes: Sequence[int], skip_nulls: bool
               ) -> tuple[list[int], list[bytes]]:
    """The columns printed and their values: unchanged TOAST is never printed, NULLs are left
    out of old keys."""
    kinds, raws = row.data.kinds, row.data.values
    cols = r.cols
    shown: list[int] = []
    out: list[bytes] = []
    for i in indexes:
        kind = kinds[i]
        if kind == KIND_TEXT:
            raw = raws[i]
            assert raw is not None
            out.append(cols[i].convert(raw))
        elif kind == KIND_NULL:
            if skip_nulls:
                continue
            out.append(b"null")
        elif kind == KIND_UNCHANGED_TOAST:
            continue
        else:
            raise _binary_error(r.relation, i)
        shown.append(i)
    return shown, out


def _v1_oldkeys(st: _State, r: _Rel, row: Row, indexes: Sequence[int]) -> bytes:
    ht, nl, sp, comma = st.ht, st.nl, st.sp, st.comma
    h3, h4 = ht * 3, ht * 4
    shown, values = _v1_values(st, r, row, indexes, skip_nulls=True)
    cols = r.cols
    out = [h3, b'"oldkeys":', sp, b"{", nl,
           h4, b'"keynames":', sp, b"[", comma.join(cols[i].name for i in shown), b"],", nl]
    if st.include_types:
        out += [h4, b'"keytypes":', sp, b"[", comma.join(cols[i].v1_type for i in shown),
                b"],", nl]
    if st.include_type_oids:
        out += [h4, b'"keytypeoids":', sp, b"[", comma.join(cols[i].v1_oid for i in shown),
                b"],", nl]
    out += [h4, b'"keyvalues":', sp, b"[", comma.join(values), b"]", nl, h3, b"}", nl]
    return b"".join(out)


def _v1_change(st: _State, r: _Rel, change: Any) -> bytes | None:
    action = change.action
    rel = r.relation
    new: Row | None = change.new
    old: Row | None = change.old
    if action is not Action.INSERT and not r.has_identity:
        log.warning('wal2json: table "%s" without primary key or replica identity is nothing',
                    rel.name)
        return None
    st.nr_changes += 1
    ht, nl = st.ht, st.nl
    parts: list[bytes] = []
    if not st.chunks:
        parts.append(nl)
    parts.append(ht + ht + b"," if st.nr_changes > 1 else ht + ht)
    if action is Action.INSERT:
        assert new is not None
        parts.append(r.v1_heads["insert"])
        parts.append(_v1_columns(st, r, new, addcomma=r.v1_pk))
        if r.v1_pk:
            parts.append(r.v1_pk_blocks[0])
    elif action is Action.UPDATE:
        assert new is not None
        parts.append(r.v1_heads["update"])
        parts.append(_v1_columns(st, r, new, addcomma=True))
        if r.v1_pk:
            parts.append(r.v1_pk_blocks[1])
        if old is None:
            parts.append(_v1_oldkeys(st, r, new, r.key))
        else:
            parts.append(_v1_oldkeys(st, r, old, range(len(r.cols))))
    else:
        assert old is not None
        parts.append(r.v1_heads["delete"])
        if r.v1_pk:
            parts.append(r.v1_pk_blocks[1])
        parts.append(_v1_oldkeys(st, r, old, r.key))
    parts.append(ht + ht + b"}")
    return b"".join(parts)


def _v1_columns(st: _State, r: _Rel, row: Row, addcomma: bool) -> bytes:
    values = _row_values(r, row)
    if values is not None:
        head = r.v1_columns_head
    else:
        shown, values = _v1_values(st, r, row, range(len(r.cols)), skip_nulls=False)
        head = (r.v1_columns_head if len(shown) == len(r.cols)
                else _v1_columns_head(st, [r.cols[i] for i in shown]))
    return b"".join((head, st.comma.join(values), b"]," if addcomma else b"]", st.nl))

