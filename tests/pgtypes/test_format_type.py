"""format_type against the server's own: the SQL function ``format_type`` for every type of
pg_catalog and for the typmods columns really carry, and contrib/test_decoding's ``col[type]``
text for a table of many column types (with the type names pgoutput's Type messages give)."""

from __future__ import annotations

import re
from typing import Any

import pglast
import pytest
from pglast.keywords import COL_NAME_KEYWORDS, RESERVED_KEYWORDS, TYPE_FUNC_NAME_KEYWORDS

from plugin_framework.pgtypes.format_type import (
    _FIXED_NAMES,
    format_type,
    format_type_be,
    format_type_sql,
)
from plugin_framework.pgtypes.oids import ARRAY_ELEMENTS, TYPNAMES
from plugin_framework.pgtypes.quote import (
    _NEWEST,
    _QUOTED_SINCE,
    VERSIONED_KEYWORDS,
    quote_identifier,
    quoted_keywords,
)
from plugin_framework.protocol import Decoder, RelationMessage, Type

# --- without a server ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "typmod", "expected"),
    [
        (23, -1, "integer"),
        (1043, 14, "character varying(10)"),
        (1043, -1, "character varying"),
        (1700, (10 << 16 | 2) + 4, "numeric(10,2)"),
        (1700, (5 << 16 | 2046) + 4, "numeric(5,-2)"),
        (1184, 3, "timestamp(3) with time zone"),
        (1083, 2, "time(2) without time zone"),
        (1560, 4, "bit(4)"),
        (1560, -1, "bit"),
        (1042, 5, "character(1)"),
        (1042, -1, "character"),
        (1186, (0x7FFF << 16) | 4, "interval(4)"),
        (1186, ((1 << 3 | 1 << 10 | 1 << 11 | 1 << 12) << 16) | 2, "interval day to second(2)"),
        (1186, ((1 << 2) << 16) | 0xFFFF, "interval year"),
        (1009, -1, "text[]"),
        (1015, 9, "character varying(5)[]"),
        (18, -1, '"char"'),
        (2276, -1, '"any"'),
        (701, -1, "double precision"),
        (19, -1, "name"),
        (30, -1, "oidvector"),
        (22, 5, "int2vector(5)"),
        (25, 3, "text(3)"),
        (0, -1, "-"),
        (4_000_000_000, -1, "???"),
    ],
)
def test_format_type(oid: int, typmod: int, expected: str) -> None:
    assert format_type(oid, typmod) == expected


def test_typmod_minus_one_given_or_not() -> None:
    # SQL format_type(oid, -1) vs format_type(oid, NULL): only bpchar and bit differ.
    assert format_type_sql(1042, -1) == "bpchar"
    assert format_type_sql(1042, None) == "character"
    assert format_type_sql(1560, -1) == '"bit"'
    assert format_type_sql(1014, -1) == "bpchar[]"
    assert format_type_sql(1561) == "bit[]"
    assert format_type_be(1043) == "character varying"


def test_invalid_interval_typmod_fails_like_the_server() -> None:
    with pytest.raises(ValueError, match="invalid INTERVAL typmod: 0x10003"):
        format_type(1186, (1 << 16) | 3)


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("abc", "abc"),
        ("a_1", "a_1"),
        ("_x", "_x"),
        ("Abc", '"Abc"'),
        ("1a", '"1a"'),
        ("a b", '"a b"'),
        ('x"y', '"x""y"'),
        ("", '""'),
        ("é", '"é"'),
        ("a$", '"a$"'),
        ("select", '"select"'),  # reserved
        ("char", '"char"'),  # column-name keyword
        ("left", '"left"'),  # type/function-name keyword
        ("abort", "abort"),  # unreserved
    ],
)
def test_quote_identifier(name: str, quoted: str) -> None:
    assert quote_identifier(name) == quoted
    for version in (150000, 160000, 170000, 180000):
        assert quote_identifier(name, version) == quoted


@pytest.mark.parametrize(
    ("name", "first_quoted"),
    [
        ("system_user", 16),  # reserved from 16
        ("json_array", 16),  # column-name keyword from 16
        ("json", 17),  # unreserved in 16, column-name keyword from 17
        ("json_table", 17),
        ("merge_action", 17),
    ],
)
def test_quote_identifier_by_server_version(name: str, first_quoted: int) -> None:
    for major in (14, 15, 16, 17, 18, 19):
        expected = f'"{name}"' if major >= first_quoted else name
        assert quote_identifier(name, major * 10000 + 3) == expected, major
    assert quote_identifier(name) == f'"{name}"'  # unknown: as the newest release


def test_versioned_keywords_against_pglast() -> None:
    # pglast's keyword lists must be those of the newest release of the table: a pglast
    # built on a newer PostgreSQL needs that release's differences added to _QUOTED_SINCE.
    assert pglast.get_postgresql_version()[0] == _NEWEST
    assert quoted_keywords() == RESERVED_KEYWORDS | COL_NAME_KEYWORDS | TYPE_FUNC_NAME_KEYWORDS
    assert quoted_keywords() >= VERSIONED_KEYWORDS
    assert all(16 <= since <= _NEWEST for since in _QUOTED_SINCE.values())


def test_builtin_type_names_do_not_depend_on_the_version() -> None:
    # Which is why format_type's built-in path takes no server version (json, the one that
    # would, is printed under its fixed name).
    for oid, name in TYPNAMES.items():
        if oid in _FIXED_NAMES:
            continue
        quoted = {quote_identifier(name, v) for v in (150000, 160000, 170000, 180000, None)}
        assert len(quoted) == 1, name


def test_user_type_names_by_server_version() -> None:
    names = {16384: ("json_query", "merge_action"), 16385: ("public", "json_table")}
    assert format_type(16384, type_names=names, server_version=150004) \
        == "json_query.merge_action"
    assert format_type_be(16384, type_names=names, server_version=170000) \
        == '"json_query"."merge_action"'
    assert format_type_sql(16385, 3, type_names=names, server_version=160000) == "json_table(3)"
    assert format_type(16385, type_names=names) == '"json_table"'
    # The built-in json is never quoted, whatever the version.
    assert {format_type(114, server_version=v) for v in (150000, 180000, None)} == {"json"}


def test_type_names() -> None:
    names = {
        16384: ("public", "mood"),
        16385: ("s", "Odd Type"),
        16386: ("", "int4"),  # how pgoutput describes a domain over int4
        16387: ("public", "_mood"),
        16388: ("pg_catalog", "pg_namespace"),
        16389: ("my schema", "t"),
    }
    assert format_type(16384, type_names=names) == "mood"
    assert format_type(16385, type_names=names) == 's."Odd Type"'
    assert format_type(16386, type_names=names) == "integer"
    assert format_type(16387, type_names=names) == "_mood"
    assert format_type(16388, type_names=names) == "pg_namespace"
    assert format_type(16389, type_names=names) == '"my schema".t'
    assert format_type(16384, 7, type_names=names) == "mood(7)"
    assert format_type(16390, type_names=names) == "???"
    # Built-in OIDs never consult type_names.
    assert format_type(23, type_names={23: ("public", "x")}) == "integer"


def test_table_is_consistent() -> None:
    for array, element in ARRAY_ELEMENTS.items():
        assert TYPNAMES[array] == "_" + TYPNAMES[element]


# --- against a server ----------------------------------------------------------------------


def _sql_format_type(db: Any, pairs: list[tuple[int, int | None]]) -> list[str]:
    """The server's format_type for each (oid, typmod), 'ERROR' where it fails."""
    db.execute(
        "CREATE OR REPLACE FUNCTION pg_temp.ft(o oid, t int) RETURNS text LANGUAGE plpgsql AS"
        " $$BEGIN RETURN format_type(o, t); EXCEPTION WHEN OTHERS THEN RETURN 'ERROR'; END$$"
    )
    rows = db.execute(
        "SELECT pg_temp.ft(o, t) FROM unnest(%s::oid[], %s::int4[]) WITH ORDINALITY AS u(o, t, n)"
        " ORDER BY n",
        ([p[0] for p in pairs], [p[1] for p in pairs]),
    )
    return [r[0] for r in rows]


def _ours(oid: int, typmod: int | None, **kwargs: Any) -> str:
    try:
        return format_type_sql(oid, typmod, **kwargs)
    except ValueError:
        return "ERROR"


def test_every_catalog_type(db: Any) -> None:
    rows = db.execute(
        "SELECT t.oid::int8, t.typname, t.typelem <> 0"
        "   AND t.typsubscript = 'array_subscript_handler'::regproc AND t.typstorage <> 'p',"
        "   format_type(t.oid, NULL), format_type(t.oid, -1)"
        " FROM pg_type t WHERE t.typnamespace = 'pg_catalog'::regnamespace ORDER BY t.oid"
    )
    assert len(rows) > 400
    fixed = {r[0] for r in rows if r[0] < 10000}
    assert fixed == set(TYPNAMES), "the built-in table differs from the server's pg_type"
    for oid, typname, is_array, sql_null, sql_minus_one in rows:
        if oid < 10000:
            assert TYPNAMES[oid] == typname
            assert (oid in ARRAY_ELEMENTS) == is_array, typname
            assert format_type(oid) == sql_null, typname
            assert format_type(oid, -1) == sql_null, typname
            assert format_type_be(oid) == sql_null, typname
            assert format_type_sql(oid) == sql_null, typname
            assert format_type_sql(oid, -1) == sql_minus_one, typname
        else:
            # Made by initdb after bootstrap (catalog and view row types and their arrays):
            # known only from a Type message, which names them as pg_catalog's typname.
            names = {oid: ("", typname)}
            if is_array:
                # A Type message names an array "_elem"; nothing tells it is one.
                assert sql_null == typname[1:] + "[]"
                assert format_type(oid, type_names=names) == typname
            else:
                assert format_type(oid, type_names=names) == sql_null, typname
                assert format_type_sql(oid, -1, type_names=names) == sql_minus_one, typname


# Declared column types whose typmods matter, each also as an array.
DECLARED = [
    "varchar(10)", "varchar", "char(3)", "char", "bpchar", "character(1)", "numeric(10,2)",
    "numeric(5)", "numeric", "numeric(1000,1000)", "numeric(5,-2)", "numeric(3,1)", "bit(4)",
    "bit", "bit varying(7)", "varbit", "time(2)", "time", "timetz(0)", "time(6) with time zone",
    "timestamp(3)", "timestamp", "timestamptz(6)", "timestamptz(0)", "timestamptz",
    "interval year", "interval month", "interval day", "interval hour", "interval minute",
    "interval second", "interval second(3)", "interval year to month", "interval day to hour",
    "interval day to minute", "interval day to second", "interval day to second(2)",
    "interval hour to minute", "interval hour to second", "interval hour to second(0)",
    "interval minute to second(1)", "interval(4)", "interval", '"char"', "name", "float(24)",
    "float(53)", "int", "smallint", "bigint", "boolean", "text", "json", "jsonb", "bytea",
]


def test_declared_typmods(db: Any) -> None:
    columns = [*DECLARED, *(f"{t}[]" for t in DECLARED)]
    db.execute(
        "CREATE TABLE typmods ("
        + ", ".join(f"c{i} {t}" for i, t in enumerate(columns))
        + ")"
    )
    rows = db.execute(
        "SELECT attname, atttypid::int8, atttypmod, format_type(atttypid, atttypmod),"
        " format_type(atttypid, nullif(atttypmod, -1)), format_type(atttypid, NULL)"
        " FROM pg_attribute WHERE attrelid = 'typmods'::regclass AND attnum > 0 ORDER BY attnum"
    )
    assert len(rows) == len(columns)
    for (_name, oid, typmod, sql, sql_no_minus_one, sql_null), declared in zip(
        rows, columns, strict=True
    ):
        assert format_type_sql(oid, typmod) == sql, declared
        assert format_type(oid, typmod) == sql_no_minus_one, declared
        assert format_type_be(oid) == sql_null, declared


def test_typmod_sweep(db: Any) -> None:
    """Every typmod-taking type and its array, under typmods real and made up (invalid interval
    ranges must fail as the server fails)."""
    oids = [1042, 1043, 1560, 1562, 1700, 1083, 1266, 1114, 1184, 1186, 25, 18, 16, 23, 2276]
    oids += [a for a, e in ARRAY_ELEMENTS.items() if e in oids]
    typmods: list[int | None] = [None, -1, -7, 0, 1, 3, 4, 5, 6, 14, 0xFFFF, 0x7FFFFFFF]
    masks = [2, 4, 8, 1024, 2048, 4096, 6, 8 | 1024, 8 | 1024 | 2048, 8 | 1024 | 2048 | 4096,
             1024 | 2048, 1024 | 2048 | 4096, 2048 | 4096, 0x7FFF, 1, 0, 8 | 4096]
    typmods += [(m << 16) | p for m in masks for p in (0, 3, 6, 0xFFFF)]
    typmods += [((p << 16) | (s & 0x7FF)) + 4 for p, s in [(10, 2), (5, 0), (5, -2), (1000, 1000)]]
    pairs = [(o, t) for o in oids for t in typmods]
    expected = _sql_format_type(db, pairs)
    mismatches = [
        (o, t, want, _ours(o, t))
        for (o, t), want in zip(pairs, expected, strict=True)
        if _ours(o, t) != want
    ]
    assert not mismatches


def test_quote_identifier_against_server(db: Any) -> None:
    # The server's keywords and the newest release's (pglast's), quoted for this server.
    words = sorted({w for (w,) in db.execute("SELECT word FROM pg_get_keywords()")}
                   | RESERVED_KEYWORDS | COL_NAME_KEYWORDS | TYPE_FUNC_NAME_KEYWORDS)
    words += ["Abc", "a b", 'x"y', "", "_x", "1a", "a1", "é", "a$", "ab9_"]
    ((version,),) = db.execute("SELECT current_setting('server_version_num')::int")
    rows = db.execute("SELECT w, quote_ident(w) FROM unnest(%s::text[]) AS w", (words,))
    assert [(w, quote_identifier(w, version)) for w, _ in rows] == rows
    if version // 10000 == _NEWEST:
        assert [(w, quote_identifier(w)) for w, _ in rows] == rows


# --- against contrib/test_decoding ----------------------------------------------------------

BUILTIN_COLUMNS = [
    *DECLARED, *(f"{t}[]" for t in DECLARED), "real", "double precision", "date", "uuid", "xml",
    "money", "inet", "cidr", "macaddr", "macaddr8", "point", "line", "lseg", "box", "path",
    "polygon", "circle", "tsvector", "tsquery", "pg_lsn", "txid_snapshot", "pg_snapshot", "xid8",
    "xid", "cid", "tid", "oid", "regclass", "regtype", "regproc", "regprocedure", "regoper",
    "regoperator", "regconfig", "regdictionary", "regnamespace", "regrole", "regcollation",
    "jsonpath", "int4range", "int8range", "numrange", "tsrange", "tstzrange", "daterange",
    "int4multirange", "int8multirange", "nummultirange", "tsmultirange", "tstzmultirange",
    "datemultirange", "int2vector", "oidvector", "aclitem", "refcursor", "int4range[]",
    "int4multirange[]", "pg_lsn[]", "uuid[]", "oidvector[]", "xid8[]",
]

_CHANGE = re.compile(r"table (\S+): INSERT: (.*)")


def _test_decoding_line(db: Any, table: str) -> str:
    # The clusters run with synchronous_commit off, and the SQL decoding functions read only
    # WAL already flushed: commit this insert synchronously.
    db.execute("SET synchronous_commit = on")
    db.execute(f"INSERT INTO {table} DEFAULT VALUES")
    rows = db.execute("SELECT data FROM pg_logical_slot_get_changes('td', NULL, NULL)")
    changes = [m.group(2) for (data,) in rows if (m := _CHANGE.fullmatch(data))]
    assert len(changes) == 1, rows
    return changes[0]


def _pgoutput(db: Any) -> tuple[RelationMessage, dict[int, tuple[str, str]]]:
    """The last Relation message pgoutput sent and the type names its Type messages gave."""
    rows = db.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes('po', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'pub')"
    )
    decoder = Decoder(1)
    relation = None
    names: dict[int, tuple[str, str]] = {}
    for (data,) in rows:
        message = decoder.decode(data)
        if isinstance(message, Type):
            names[message.type_oid] = (message.namespace, message.name)
        elif isinstance(message, RelationMessage):
            relation = message
    assert relation is not None
    return relation, names


@pytest.fixture
def slots(db: Any) -> Any:
    db.execute(
        "CREATE TYPE mood AS ENUM ('ok'); CREATE SCHEMA s; CREATE TYPE s.\"Odd Type\" AS (a int);"
        " CREATE TYPE s.pair AS (a int, b text); CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);"
        " CREATE DOMAIN s.code AS varchar(7); CREATE TYPE \"select\" AS ENUM ('x')"
    )
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    db.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    db.execute("SELECT pg_create_logical_replication_slot('po', 'pgoutput')")
    return db


def test_builtin_columns_as_test_decoding_prints_them(slots: Any) -> None:
    db = slots
    db.execute(
        "CREATE TABLE many ("
        + ", ".join(f"c{i} {t}" for i, t in enumerate(BUILTIN_COLUMNS))
        + ")"
    )
    line = _test_decoding_line(db, "many")
    relation, names = _pgoutput(db)
    assert names == {}  # built-in types never get a Type message
    assert len(relation.columns) == len(BUILTIN_COLUMNS)
    ours = " ".join(
        f"{quote_identifier(c.name)}[{format_type_be(c.type_oid)}]:null" for c in relation.columns
    )
    assert ours == line
    # With the typmods pgoutput sends: what the SQL function prints (typmod -1 meaning none).
    attributes = db.execute(
        "SELECT format_type(atttypid, nullif(atttypmod, -1)) FROM pg_attribute"
        " WHERE attrelid = 'many'::regclass AND attnum > 0 ORDER BY attnum"
    )
    assert [format_type(c.type_oid, c.type_modifier) for c in relation.columns] == [
        a for (a,) in attributes
    ]


USER_COLUMNS = {
    # column type: what test_decoding prints, if it differs from what we can print
    "mood": None,
    's."Odd Type"': None,
    "s.pair": None,
    '"select"': None,
    "pg_namespace": None,  # a pg_catalog row type made by initdb (OID >= 10000)
    "information_schema.sql_identifier": "name",  # a domain: pgoutput names its base type
    "posint": "integer",
    "s.code": "character varying",
    "mood[]": "_mood",  # an array of a non-built-in type: pgoutput names it "_mood"
    "posint[]": "_posint",
    "s.pair[]": "s._pair",
    "int4": None,
    "varchar(3)": None,
}


def test_user_types_as_test_decoding_prints_them(slots: Any) -> None:
    db = slots
    columns = list(USER_COLUMNS)
    db.execute(
        "CREATE TABLE users (" + ", ".join(f"c{i} {t}" for i, t in enumerate(columns)) + ")"
    )
    line = _test_decoding_line(db, "users")
    relation, names = _pgoutput(db)
    printed = re.findall(r"c\d+\[(.+?)\]:null", line)
    assert len(printed) == len(columns), line
    ours = [format_type_be(c.type_oid, type_names=names) for c in relation.columns]
    expected = [
        USER_COLUMNS[declared] or server for declared, server in zip(columns, printed, strict=True)
    ]
    assert ours == expected
    # The divergences are only where pgoutput does not tell: the test_decoding text is as
    # PostgreSQL names the type.
    assert printed[columns.index("posint")] == "posint"
    assert printed[columns.index("mood[]")] == "mood[]"
    assert printed[columns.index("information_schema.sql_identifier")] == (
        "information_schema.sql_identifier"
    )


def test_keyword_names_as_test_decoding_prints_them(slots: Any) -> None:
    """Names whose quoting changed between releases, printed as this server prints them."""
    db = slots
    db.execute(
        'CREATE SCHEMA "json_query"; CREATE TYPE "json_query"."merge_action" AS ENUM (\'m\');'
        ' CREATE TYPE "json_table" AS ENUM (\'j\');'
        ' CREATE TABLE "json_query"."system_user" ("json" int, "json_table" "json_table",'
        ' "merge_action" "json_query"."merge_action", "json_array" json, "system_user" text,'
        ' "select" int, recheck int)'
    )
    db.execute("SET synchronous_commit = on")
    db.execute('INSERT INTO "json_query"."system_user" DEFAULT VALUES')
    rows = db.execute("SELECT data FROM pg_logical_slot_get_changes('td', NULL, NULL)")
    (line,) = [data for (data,) in rows if ": INSERT: " in data]
    ((version,),) = db.execute("SELECT current_setting('server_version_num')::int")
    relation, names = _pgoutput(db)
    ours = (
        f"table {quote_identifier(relation.namespace, version)}."
        f"{quote_identifier(relation.name, version)}: INSERT: "
        + " ".join(
            f"{quote_identifier(c.name, version)}"
            f"[{format_type_be(c.type_oid, type_names=names, server_version=version)}]:null"
            for c in relation.columns
        )
    )
    assert ours == line
    # This server's release and the newest do differ here before 17.
    assert line.startswith("table json_query.") == (version < 170000)
