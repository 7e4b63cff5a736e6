"""What the wal2json emitter prints the same way for every row of a table, computed once per
Relation message (``compile_relation``), and how a column's value prints as JSON."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import orjson

from emitters.wal2json.history import AttributeRow, place_columns
from emitters.wal2json.state import Col, Converter, Rel, State
from plugin_framework.framework import Relation, Row
from plugin_framework.pgtypes import TYPNAMES, format_type_sql, oids

log = logging.getLogger("pgdecode.wal2json")

_NUMBER_OIDS: Final = frozenset((oids.INT8, oids.INT2, oids.INT4, oids.OID, oids.FLOAT4,
                                  oids.FLOAT8, oids.NUMERIC))
_SPECIAL_NUMBERS: Final = frozenset((b"NaN", b"Infinity", b"-Infinity"))
_IDENTITY_NAMES: Final = {"f": "FULL", "i": "USING INDEX", "n": "NOTHING", "d": "DEFAULT"}


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


def escape_raw(raw: bytes) -> bytes:
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
SELECT a.attnum, a.attnotnull,
       CASE WHEN a.atthasdef AND a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END,
       coalesce(t.typtype = 'd', false), t.typbasetype, t.typname,
       format_type(a.atttypid, a.atttypmod), bt.typname, format_type(t.typbasetype, t.typtypmod),
       EXISTS (SELECT FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary
               AND a.attnum = ANY (i.indkey)),
       a.attname, a.atttypid, a.attisdropped, a.attgenerated <> ''
FROM pg_attribute a
LEFT JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON bt.oid = t.typbasetype
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = {relid} AND a.attnum > 0 /* read {generation} */
"""

@dataclass(frozen=True, slots=True)
class _CatalogColumn:
    """A live column's row as today's catalog has it (dropped columns are not kept)."""

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


# NaN and the infinities, which JSON has not: null; booleans as true/false; bytea without its
# leading \x; anything else as a JSON string.


def string_value(raw: bytes) -> bytes:
    try:
        return _dumps(raw.decode())
    except UnicodeDecodeError:
        return _escape_bytes(raw)


def number_value(raw: bytes) -> bytes:
    return b"null" if raw in _SPECIAL_NUMBERS else raw


def number_string_value(raw: bytes) -> bytes:
    return b'"' + raw + b'"'  # numeric-data-types-as-string: digits, signs, NaN: no escapes


def bool_value(raw: bytes) -> bytes:
    return b"true" if raw == b"t" else b"false"


def bytea_value(raw: bytes) -> bytes:
    return string_value(raw[2:])


def binary_error(rel: Relation, index: int) -> Exception:
    return ValueError(
        f'column "{rel.columns[index].name}" of table "{rel.namespace}"."{rel.name}" arrived '
        "in binary format: the wal2json emitter prints the server's text output; run pgoutput "
        "with binary = false"
    )


def _converter(st: State, type_oid: int) -> Converter:
    if type_oid in _NUMBER_OIDS:
        return number_string_value if st.numeric_as_string else number_value
    if type_oid == oids.BOOL:
        return bool_value
    if type_oid == oids.BYTEA:
        return bytea_value
    return string_value


def row_values(r: Rel, row: Row) -> list[bytes] | None:
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


def table_selected(st: State, schema: str, table: str) -> bool:
    """Not in filter-tables, and in add-tables."""
    return (not any(t.matches(schema, table) for t in st.filter_tables)
            and any(t.matches(schema, table) for t in st.add_tables))


def _warn_unknown(st: State, rel: Relation, placed: Sequence[AttributeRow | None],
                  non_builtin: bool, gone: bool) -> None:
    """Warn, once per table and option, where a value wal2json reads from the historic
    catalog cannot be had from today's: the column was dropped since, could not be placed
    (history.py), or the table is gone. The value printed is then the default (position 0,
    optional true, default null, the type from pgoutput, no pk column)."""
    wanted = {
        "include-column-positions": st.include_column_positions,
        "include-not-null": st.include_not_null,
        "include-default": st.include_default,
        "include-domain-data-type": st.include_domain_data_type,
        "include-types": st.include_types and non_builtin,
        "include-pk": (st.include_pk and st.version == 2 and rel.replica_identity != "d"),
    }
    for option, on in wanted.items():
        if not on:
            continue
        unknown = [c.name for c, at in zip(rel.columns, placed, strict=True)
                   if (at is None or (at.dropped and option != "include-column-positions"))
                   and (option != "include-types" or c.type_oid not in TYPNAMES)]
        if not unknown or (rel.relation_id, option) in st.warned:
            continue
        st.warned.add((rel.relation_id, option))
        why = ("the table no longer exists" if gone else
               "they were dropped or renamed (and could not be told apart) since the change")
        log.warning('wal2json: %s: table "%s"."%s": today\'s catalog does not say what '
                    "column(s) %s were when the change was made (%s): printed without the "
                    "historic value (docs/emitters-wal2json.md, \"The catalog\")",
                    option, rel.namespace, rel.name, ", ".join(unknown), why)


def compile_relation(st: State, rel: Relation) -> Rel:
    """Everything about a table that wal2json prints the same way for every row."""
    schema, table = rel.namespace, rel.name
    selected = table_selected(st, schema, table)
    key = [i for i, c in enumerate(rel.columns) if c.is_key]
    has_identity = bool(key) or rel.replica_identity == "f"
    # Under REPLICA IDENTITY DEFAULT the key columns are the primary key's (none: no key).
    default_identity = rel.replica_identity == "d"
    default_pk = default_identity and bool(key)
    non_builtin = any(c.type_oid not in TYPNAMES for c in rel.columns)
    needs_catalog = (st.include_not_null or st.include_default or st.include_domain_data_type
                     or st.include_column_positions
                     or (st.include_pk and st.version == 2 and not default_identity)
                     or (st.include_types and non_builtin))
    # For each column: its live row today (None: dropped, or not placed), and its attnum
    # (None: not placed; see history.py).
    cats: list[_CatalogColumn | None] = [None] * len(rel.columns)
    attnums: list[int | None] = [None] * len(rel.columns)
    if needs_catalog and st.catalog is not None:
        # Catalog.query caches by query text: the generation makes a new Relation message
        # read the catalog again. The OID is inlined because Catalog.check_read_only parses
        # the text before parameters are bound, and so rejects %s placeholders.
        st.generation += 1
        sql = _COLUMNS_SQL.format(relid=int(rel.relation_id), generation=st.generation)
        live: dict[int, _CatalogColumn] = {}
        rows: list[AttributeRow] = []
        for row in st.catalog.query(sql):
            at = AttributeRow(row[0], row[10], row[11], row[12], row[13])
            rows.append(at)
            if not at.dropped:
                live[at.attnum] = _CatalogColumn(*row[:10])
        placed = place_columns([(c.name, c.type_oid) for c in rel.columns], rows)
        for i, spot in enumerate(placed):
            if spot is not None:
                attnums[i] = spot.attnum
                cats[i] = live.get(spot.attnum)
        _warn_unknown(st, rel, placed, non_builtin, gone=not rows)
    elif st.include_types and non_builtin:
        log.warning('wal2json: no catalog: the types of table "%s"."%s" that are not built in '
                    "are named from pgoutput's Type messages (a domain shows as its base "
                    "type, an array of a user type as _name)", schema, table)

    pk: list[int] | None = None
    if st.version == 2 and st.include_pk:
        if default_identity:
            pk = key or None
        elif st.catalog is None:
            identity = _IDENTITY_NAMES.get(rel.replica_identity, rel.replica_identity)
            raise ValueError(
                f'include-pk: table "{schema}"."{table}" has REPLICA IDENTITY {identity}, so '
                "pgoutput does not say which columns are its primary key; run with a database "
                "connection for catalog lookups"
            )
        else:
            pk = [i for i, cat in enumerate(cats) if cat is not None and cat.in_pk] or None

    ht, nl, sp = st.ht, st.nl, st.sp
    cols: list[Col] = []
    for c, cat, attnum in zip(rel.columns, cats, attnums, strict=True):
        name = escape_json(c.name)
        type_oid = c.type_oid
        # the type names, with and without typmod, of the column and of a domain's base type
        builtin = TYPNAMES.get(type_oid)
        if builtin is not None:
            with_typmod = format_type_sql(type_oid, c.type_modifier)
            typname = builtin
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
            after += b',"position":%d' % (attnum or 0)
        default = None if cat is None else cat.default
        if st.include_default:
            after += b',"default":' + (b"null" if default is None
                                       else b'"' + default.encode() + b'"')
        cols.append(Col(
            name=name, convert=v1_convert if st.version == 1 else _converter(st, type_oid),
            v1_type=v1_type, v1_pk_type=v1_pk_type, v1_oid=b"%d" % v1_oid,
            v2_change=(before, after + b"}"), v2_identity=before, v2_pk=v2_pk,
            v1_position=b"%d" % (attnum or 0),
            v1_optional=b"false" if cat is not None and cat.not_null else b"true",
            v1_default=b"null" if default is None else b'"' + default.encode() + b'"',
        ))

    schema_json, table_json = escape_json(schema), escape_json(table)
    r = Rel(rel, selected, cols, key, has_identity, default_pk and st.include_pk, pk,
             (b',"schema":' + schema_json if st.include_schemas else b"")
             + b',"table":' + table_json)
    r.converters = [None if c.convert is string_value else c.convert for c in cols]
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
        r.v1_columns_head = v1_columns_head(st, cols)
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


def v1_columns_head(st: State, cols: Sequence[Col]) -> bytes:
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
