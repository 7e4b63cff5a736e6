"""Row filters and column lists: the worked examples of PostgreSQL's documentation against a real
server, configuration (API, config file, command line), and errors with PostgreSQL's words.

Each decoding is done twice from the same slot: through a publication with the filters,
decoded by the server, and through an unfiltered publication filtered by pgdecode. Both must
give the same changes, operation by operation.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import psycopg
import pytest
from support.rowfilters import create_slot, decode, rows, subscriber, workload_conn

from plugin_framework.rowfilter import (
    EvaluationError,
    NotSupportedError,
    PublicationFilters,
    RowFilterError,
    add_cli_arguments,
    config_from_args,
    from_cli_args,
    parse_config,
    read_config,
)

# --- the documentation's examples -------------------------------------------------------------

SEED_SCHEMA = """
CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));
CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));
CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');
CREATE PUBLICATION p2 FOR TABLE t1, t2 WHERE (e = 99);
CREATE PUBLICATION p3 FOR TABLE t2 WHERE (d = 10), t3 WHERE (g = 10);
CREATE PUBLICATION pall FOR ALL TABLES;
"""
SEED_KEYS = {"t1": ("a", "c"), "t2": ("d",), "t3": ("g",), "parent": ("a",),
             "child": ("a",)}


@pytest.fixture(scope="module")
def seed(pg_module_db: Any) -> Any:
    db = pg_module_db
    db.execute(SEED_SCHEMA)
    create_slot(db, "seed")
    conn = workload_conn(db)
    for row in [(2, 102, "NSW"), (3, 103, "QLD"), (4, 104, "VIC"), (5, 105, "ACT"),
                (6, 106, "NSW"), (7, 107, "NT"), (8, 108, "QLD"), (9, 109, "NSW")]:
        conn.execute("INSERT INTO t1 VALUES (%s, %s, %s)", row)
    conn.execute("UPDATE t1 SET b = 999 WHERE a = 6")
    conn.execute("UPDATE t1 SET a = 555 WHERE a = 2")
    conn.execute("UPDATE t1 SET c = 'VIC' WHERE a = 9")
    conn.execute("INSERT INTO t2 VALUES (10, 99, 1), (11, 99, 2), (12, 1, 3), (13, 2, 4)")
    conn.execute("INSERT INTO t3 VALUES (10, 1, 1), (11, 1, 1)")
    conn.close()
    return db


def test_seed_p1_inserts_and_the_three_update_transformations(seed: Any) -> None:
    with PublicationFilters.from_publication(seed.conninfo, "p1") as filters:
        mine = decode(seed, "seed", "pall", filters)
    server = decode(seed, "seed", "p1")
    assert mine == server
    changes = [ev for txn in mine for ev in txn]
    t1 = (("a", "6"), ("b", "106"), ("c", "NSW")), (("a", "9"), ("b", "109"), ("c", "NSW"))
    assert changes == [
        # only the rows satisfying (a > 5 AND c = 'NSW') are replicated
        ("change", "t1", "INSERT", t1[0], None, False),
        ("change", "t1", "INSERT", t1[1], None, False),
        # old and new rows both match: UPDATE
        ("change", "t1", "UPDATE", (("a", "6"), ("b", "999"), ("c", "NSW")), None, False),
        # old row (a = 2) does not match, the new one (a = 555) does: INSERT
        ("change", "t1", "INSERT", (("a", "555"), ("b", "102"), ("c", "NSW")), None, False),
        # old row matches, the new one (c = 'VIC') does not: DELETE of the old key
        ("change", "t1", "DELETE", None, (("a", "9"), ("b", None), ("c", "NSW")), True),
    ]
    # the subscriber's table at the end of the example
    assert subscriber(mine, SEED_KEYS) == {"t1": rows({"a": 6, "b": 999, "c": "NSW"},
                                                      {"a": 555, "b": 102, "c": "NSW"})}


@pytest.mark.parametrize("pubs", [["p2"], ["p3"], ["p1", "p2"], ["p2", "p3"], ["p1", "p3"]])
def test_seed_publications_alone_and_combined(seed: Any, pubs: list[str]) -> None:
    with PublicationFilters.from_publication(seed.conninfo, pubs) as filters:
        mine = decode(seed, "seed", "pall", filters)
    assert mine == decode(seed, "seed", ",".join(pubs))
    state = subscriber(mine, SEED_KEYS)
    if "p2" in pubs:  # t1 has no filter in p2: every row, the other filters are redundant
        assert len(state["t1"]) == 8
        expected_t2 = {"10", "11"} | ({"10"} if "p3" in pubs else set())
        assert {dict(r)["d"] for r in state["t2"]} == expected_t2
    if pubs == ["p3"]:
        assert state == {"t2": rows({"d": 10, "e": 99, "f": 1}),
                         "t3": rows({"g": 10, "h": 1, "i": 1})}


def test_seed_filters_written_by_hand_give_the_same(seed: Any) -> None:
    spec = PublicationFilters.from_spec(seed.conninfo, {"public.t1": "a > 5 AND c = 'NSW'"})
    with spec:
        mine = decode(seed, "seed", "pall", spec)
    server = decode(seed, "seed", "p1")
    # the hand-written specification publishes the other tables unfiltered
    assert [[e for e in txn if e[1] == "t1"] for txn in mine if any(e[1] == "t1" for e in txn)] \
        == server
    assert any(e[1] == "t2" for txn in mine for e in txn)


PARTITIONS = """
CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a);
CREATE TABLE child PARTITION OF parent DEFAULT;
CREATE PUBLICATION p4 FOR TABLE parent WHERE (a < 5), child WHERE (a >= 5)
    WITH (publish_via_partition_root = true);
CREATE PUBLICATION p4f FOR TABLE parent, child WHERE (a >= 5)
    WITH (publish_via_partition_root = false);
CREATE PUBLICATION ppall FOR ALL TABLES;
CREATE PUBLICATION ppall_root FOR ALL TABLES WITH (publish_via_partition_root = true);
"""


@pytest.fixture(scope="module")
def partitioned(pg_module_db: Any) -> Any:
    db = pg_module_db
    db.execute("CREATE SCHEMA part")
    db.execute("SET search_path = part")
    db.execute(PARTITIONS)
    create_slot(db, "part")
    conn = workload_conn(db)
    conn.execute("SET search_path = part")
    conn.execute("INSERT INTO parent VALUES (2), (4), (6)")
    conn.execute("INSERT INTO child VALUES (3), (5), (7)")
    conn.execute("UPDATE parent SET a = a + 10 WHERE a IN (3, 4)")
    conn.execute("DELETE FROM parent WHERE a = 2")
    conn.execute("TRUNCATE parent")
    conn.close()
    return db


@pytest.mark.parametrize("source", ["ppall", "ppall_root"])
def test_seed_partitions_via_root_use_the_roots_filter(partitioned: Any, source: str) -> None:
    with PublicationFilters.from_publication(partitioned.conninfo, "p4") as filters:
        mine = decode(partitioned, "part", source, filters)
    server = decode(partitioned, "part", "p4")
    if source == "ppall":
        # A source that publishes partitions says "TRUNCATE child" both for TRUNCATE parent
        # and for TRUNCATE child; only the former is published via the root: not knowable.
        assert mine == server[:-1]
    else:
        assert mine == server
    inserts = [ev for ev in server[0] + server[1]]
    # published as the root, with the root's filter (a < 5): 2, 4 and 3
    assert [(e[1], e[2], dict(e[3])["a"]) for e in inserts] == [
        ("parent", "INSERT", "2"), ("parent", "INSERT", "4"), ("parent", "INSERT", "3")]
    assert subscriber(server[:2], SEED_KEYS)["parent"] == rows({"a": 2}, {"a": 3}, {"a": 4})
    # TRUNCATE is never filtered, and is published for the root
    assert server[-1] == [("truncate", ("parent",), False, False)]


def test_seed_partitions_not_via_root_use_each_partitions_filter(partitioned: Any) -> None:
    with PublicationFilters.from_publication(partitioned.conninfo, "p4f") as filters:
        mine = decode(partitioned, "part", "ppall", filters)
    server = decode(partitioned, "part", "p4f")
    assert mine == server
    inserts = [ev for ev in server[0] + server[1]]
    assert [(e[1], dict(e[3])["a"]) for e in inserts] == [("child", "6"), ("child", "5"),
                                                          ("child", "7")]
    assert subscriber(server[:2], SEED_KEYS)["child"] == rows({"a": 5}, {"a": 6}, {"a": 7})


def test_partition_root_stream_with_partition_filters_is_refused(partitioned: Any) -> None:
    with PublicationFilters.from_publication(partitioned.conninfo, "p4f") as filters, \
            pytest.raises(RowFilterError, match="arrive under the partition root"):
        decode(partitioned, "part", "ppall_root", filters)


# --- configuration -----------------------------------------------------------------------------

def test_config_file_toml_and_json(tmp_path: Any) -> None:
    toml = tmp_path / "filters.toml"
    toml.write_text('publish = ["insert", "update"]\npublish_via_partition_root = true\n'
                    'publications = ["p1"]\n'
                    '[tables."public.t1"]\nrow_filter = "a > 5 AND c = \'NSW\'"\n'
                    'columns = ["a", "c"]\n[tables.t2]\ncolumns = "d, e"\n')
    cfg = read_config(toml)
    assert cfg.row_filters == {"public.t1": "a > 5 AND c = 'NSW'"}
    assert cfg.column_lists == {"public.t1": ["a", "c"], "t2": "d, e"}
    assert cfg.publish == {"insert", "update"} and cfg.via_root and cfg.publications == ["p1"]
    js = tmp_path / "filters.json"
    js.write_text(json.dumps({"tables": {"public.t1": {"row_filter": "a > 5"}}}))
    assert read_config(js).row_filters == {"public.t1": "a > 5"}


@pytest.mark.parametrize("data, message", [
    ({"tables": {"t": {"where": "a"}}}, "takes row_filter and columns"),
    ({"publish": ["insert", "upsert"]}, 'unrecognized value for publication option "publish"'),
    ({"filters": {}}, "unknown setting 'filters'"),
    ({"tables": {"t": {"columns": [1]}}}, "must be a list of names"),
    ({"publish_via_partition_root": "yes"}, "must be true or false"),
])
def test_config_file_errors(data: Any, message: str) -> None:
    with pytest.raises(RowFilterError, match=message):
        parse_config(data)


def test_config_file_unreadable(tmp_path: Any) -> None:
    with pytest.raises(RowFilterError, match="cannot read filter configuration"):
        read_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("tables = [")
    with pytest.raises(RowFilterError, match="invalid filter configuration"):
        read_config(bad)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    return parser.parse_args(argv)


def test_cli_arguments(tmp_path: Any) -> None:
    assert config_from_args(parse_args([])) is None
    cfg_file = tmp_path / "f.toml"
    cfg_file.write_text('[tables."s.t9"]\nrow_filter = "x = 1"\n')
    args = parse_args(["--row-filter", "public.t1:(a > 5 AND c = 'NSW')",
                       "--row-filter", '"we:ird".t2:e = 99',
                       "--column-list", "public.t1:a, c", "--filter-config", str(cfg_file),
                       "--filters-from-publication", "p3",
                       "--filters-from-publication", "p1"])
    cfg = config_from_args(args)
    assert cfg is not None
    assert cfg.row_filters == {"s.t9": "x = 1", "public.t1": "(a > 5 AND c = 'NSW')",
                               '"we:ird".t2': "e = 99"}
    assert cfg.column_lists == {"public.t1": "a, c"}
    assert cfg.publications == ["p3", "p1"]
    with pytest.raises(RowFilterError, match="expects TABLE:VALUE"):
        config_from_args(parse_args(["--row-filter", "a > 5"]))
    with pytest.raises(RowFilterError, match="given twice"):
        config_from_args(parse_args(["--row-filter", "t:a", "--row-filter", "t:b"]))
    with pytest.raises(RowFilterError, match="given twice"):
        config_from_args(parse_args(["--row-filter", "s.t9:a", "--filter-config",
                                     str(cfg_file)]))


def test_cli_options_fit_pgdecode_stream() -> None:
    """``pgdecode stream`` has the options (wired in by the CLI) and they parse."""
    from plugin_framework.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["stream", "-S", "slot", "--publication", "pall",
                              "--row-filter", "public.t1:a > 5", "--column-list", "t2:d",
                              "--filters-from-publication", "p1"])
    cfg = config_from_args(args)
    assert cfg is not None and cfg.row_filters == {"public.t1": "a > 5"}


def test_cli_builds_filters(seed: Any) -> None:
    args = parse_args(["--row-filter", "public.t1:(a > 5 AND c = 'NSW')",
                       "--column-list", "public.t1:a,c", "--filters-from-publication", "p3"])
    filters = from_cli_args(args, seed.conninfo)
    assert filters is not None
    with filters:
        mine = decode(seed, "seed", "pall", filters)
    # ORed: the hand-written t1 (columns a, c) and p3's t2 and t3
    t1 = [e for txn in mine for e in txn if e[1] == "t1"]
    assert dict(t1[0][3] or t1[0][4]) == {"a": "6", "c": "NSW"}
    assert {e[1] for txn in mine for e in txn} == {"t1", "t2", "t3"}
    assert from_cli_args(parse_args([]), seed.conninfo) is None


def test_without_a_connection_only_column_lists_and_operations(seed: Any) -> None:
    with pytest.raises(RowFilterError, match="need a connection to the source database"):
        PublicationFilters.from_spec(None, {"public.t1": "a > 5"})
    with PublicationFilters.from_spec(None, {}, {"public.t2": ["d", "e"]},
                                      publish=["insert"]) as filters:
        mine = decode(seed, "seed", "pall", filters)
    t2 = [e for txn in mine for e in txn if e[1] == "t2"]
    assert t2 and all(dict(e[3]).keys() == {"d", "e"} for e in t2)
    with PublicationFilters.from_spec(None, {}, {"public.t2": ["e"]}) as filters, \
            pytest.raises(RowFilterError, match='replica identity column "d"'):
        decode(seed, "seed", "pall", filters)


# --- errors: PostgreSQL's own, in PostgreSQL's words ---------------------------------------------

ERRORS_SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE FUNCTION plus1(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 + 1';
CREATE FUNCTION myeq(int, int) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1 = $2';
CREATE OPERATOR === (LEFTARG = int, RIGHTARG = int, FUNCTION = myeq);
CREATE COLLATION mycoll FROM "C";
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE e1 (id int PRIMARY KEY, a int, t text, m mood, p posint, ts timestamptz,
                 v varchar(10), tc text COLLATE mycoll);
CREATE TABLE e2 (id int PRIMARY KEY, a int) PARTITION BY RANGE (id);
CREATE TABLE e2a PARTITION OF e2 FOR VALUES FROM (0) TO (100);
CREATE TABLE e3 (id int, a int);
ALTER TABLE e3 REPLICA IDENTITY FULL;
"""

# Filters PostgreSQL refuses at CREATE PUBLICATION: pgdecode must refuse them with the same
# message and detail.
REFUSED = [
    "a >",
    "zz = 1",
    "e1.zz = 1",
    "a",
    "a = 'abc'",
    "errs.plus1(a) = 2",
    "a OPERATOR(errs.===) 1",
    "m = 'happy'",
    "p = 1",
    "t COLLATE errs.mycoll < 'x'",
    "tc = 'x'",
    "xmin = '1'",
    "ctid IS NOT NULL",
    "now() > ts",
    "random() > 0.5",
    "ts > '2024-01-01'::date",
    "a::text = '1'",
    "t || a = '1'",
    "concat(t) = 'x'",
    "v IN ('a', 'b')",
    "current_date > '2024-01-01'",
    "a IN (SELECT 1)",
    "count(*) > 1",
    "nosuchfunction(a)",
    "a = $1",
    "t COLLATE \"nosuchcoll\" = 'x'",
    "(ARRAY[1,2])[1] = a",
]


@pytest.fixture(scope="module")
def errors_db(pg_module_db: Any) -> Any:
    db = pg_module_db
    db.execute("CREATE SCHEMA errs")
    db.execute("SET search_path = errs, public")
    db.execute(ERRORS_SCHEMA)
    return db


def server_refusal(db: Any, table: str, where: str) -> tuple[str, str | None]:
    with db.connect(autocommit=True) as conn:
        conn.execute("SET search_path = errs, public")
        try:
            conn.execute(f"CREATE PUBLICATION refused FOR TABLE {table} WHERE ({where})")
        except psycopg.Error as exc:
            return exc.diag.message_primary or "", exc.diag.message_detail
        conn.execute("DROP PUBLICATION refused")
    raise AssertionError(f"the server accepted {where!r}")


@pytest.mark.parametrize("where", REFUSED)
def test_refused_filters_give_postgresqls_error(errors_db: Any, where: str) -> None:
    message, detail = server_refusal(errors_db, "errs.e1", where)
    with pytest.raises(RowFilterError) as info:
        PublicationFilters.from_spec(errors_db.conninfo, {"errs.e1": where},
                                     publish=["insert"])
    err = info.value
    assert not isinstance(err, NotSupportedError)
    assert (err.message, err.detail) == (message, detail)
    assert err.context is not None and '"errs.e1"' in err.context


@pytest.mark.parametrize("where, detail", [
    ("m = 'happy'", "User-defined types are not allowed."),
    ("errs.plus1(a) = 2", "User-defined or built-in mutable functions are not allowed."),
    ("a OPERATOR(errs.===) 1", "User-defined operators are not allowed."),
    ("t COLLATE errs.mycoll < 'x'", "User-defined collations are not allowed."),
    ("xmin = '1'", "System columns are not allowed."),
    ("a::text = '1'", "Only columns, constants, built-in operators, built-in data types, "
                      "built-in collations, and immutable built-in functions are allowed."),
])
def test_refusal_details(errors_db: Any, where: str, detail: str) -> None:
    with pytest.raises(RowFilterError) as info:
        PublicationFilters.from_spec(errors_db.conninfo, {"errs.e1": where},
                                     publish=["insert"])
    assert info.value.message == "invalid publication WHERE expression"
    assert info.value.detail == detail
    assert "DETAIL:  " + detail in str(info.value)


@pytest.mark.parametrize("spec, columns, publish, message", [
    ({"errs.e1": "a > 1"}, {}, None, 'uses column "a", which is not part of the replica'),
    ({"errs.e1": "id > 1 AND t = 'x'"}, {}, ["insert", "delete"], 'column "t", which is not'),
    ({}, {"errs.e1": ["a", "t"]}, None, 'does not include replica identity column "id"'),
    ({}, {"errs.e3": ["id", "a"]}, None, "REPLICA IDENTITY FULL cannot have a column list"),
    ({}, {"errs.e1": ["id", "nope"]}, None, 'column "nope" of relation "e1" does not exist'),
    ({}, {"errs.e1": ["id", "id"]}, None, 'duplicate column "id"'),
    ({"errs.nope": "a > 1"}, {}, None, 'relation "errs.nope" does not exist'),
    ({"errs.e2": "id > 1"}, {}, None, "cannot use publication WHERE clause for relation"),
    ({}, {"errs.e2": ["id"]}, None, 'cannot use column list for relation "errs.e2"'),
    ({"errs.e1": "t ~ 'x'"}, {}, ["insert"], "not supported by pgdecode"),
    ({"errs.e1": "a IN (1,"}, {}, None, 'syntax error at or near "\\)"'),
    ({"errs.e1": "a > 1) OR (true"}, {}, None, 'syntax error at or near "OR"'),
    ({"errs.e1": "a > 1); DROP TABLE e1; SELECT (1"}, {}, None, "syntax error"),
])
def test_configuration_errors(errors_db: Any, spec: dict[str, str],
                              columns: dict[str, list[str]], publish: list[str] | None,
                              message: str) -> None:
    kwargs: dict[str, Any] = {} if publish is None else {"publish": publish}
    with pytest.raises(RowFilterError, match=message):
        PublicationFilters.from_spec(errors_db.conninfo, spec, columns, **kwargs)


def test_identity_rules_accept_what_they_should(errors_db: Any) -> None:
    ok = [
        ({"errs.e1": "a > 1 AND t = 'x'"}, {}, ["insert"]),  # INSERT only: any column
        ({"errs.e1": "id > 1"}, {"errs.e1": ["id", "t"]}, None),
        ({"errs.e3": "a > 1"}, {}, None),  # FULL: any column
        ({"errs.e3": "a > 1"}, {"errs.e3": ["a"]}, ["insert"]),
        ({"errs.e2a": "a > 1"}, {}, ["insert", "truncate"]),
    ]
    for spec, columns, publish in ok:
        kwargs: dict[str, Any] = {} if publish is None else {"publish": publish}
        PublicationFilters.from_spec(errors_db.conninfo, spec, columns, **kwargs).close()
    PublicationFilters.from_spec(errors_db.conninfo, {"errs.e2": "id > 1 AND a = 1"},
                                 publish=["insert"], publish_via_partition_root=True).close()


def test_publication_errors(errors_db: Any) -> None:
    with pytest.raises(RowFilterError, match='publication "nope" does not exist'):
        PublicationFilters.from_publication(errors_db.conninfo, "nope")
    errors_db.execute("CREATE PUBLICATION lists1 FOR TABLE errs.e1 (id, a)")
    errors_db.execute("CREATE PUBLICATION lists2 FOR TABLE errs.e1 (id, t)")
    with pytest.raises(RowFilterError, match=r'cannot use different column lists for table '
                                             r'"errs.e1" in different publications'):
        PublicationFilters.from_publication(errors_db.conninfo, ["lists1", "lists2"])


def test_a_catalog_publication_outside_the_identity_rules_is_accepted(
        errors_db: Any, caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL creates it, and refuses UPDATE and DELETE of the table instead."""
    errors_db.execute("CREATE PUBLICATION loose FOR TABLE errs.e1 WHERE (a > 1)")
    with caplog.at_level("WARNING", "pgdecode.rowfilter"):
        PublicationFilters.from_publication(errors_db.conninfo, "loose").close()
    assert "not part of the replica identity" in caplog.text
    with pytest.raises(psycopg.errors.InvalidColumnReference, match='cannot update table "e1"'):
        errors_db.execute("UPDATE errs.e1 SET a = 2")
    errors_db.execute("DROP PUBLICATION loose")


# --- errors while streaming ----------------------------------------------------------------------

def server_decode_error(db: Any, slot: str, publication: str) -> str:
    with pytest.raises(psycopg.Error) as info:
        decode(db, slot, publication)
    return info.value.diag.message_primary or ""


def test_division_by_zero_stops_decoding_like_the_server(db: Any) -> None:
    db.execute("CREATE TABLE z (id int PRIMARY KEY, a int)")
    db.execute("CREATE PUBLICATION pz FOR TABLE z WHERE (10 / a > 1)")
    db.execute("CREATE PUBLICATION pzc FOR TABLE z WHERE (id = 1 / 0)")
    db.execute("CREATE PUBLICATION pall FOR ALL TABLES")
    create_slot(db, "z")
    conn = workload_conn(db)
    conn.execute("INSERT INTO z VALUES (1, 5)")
    conn.execute("INSERT INTO z VALUES (2, 0)")
    conn.close()
    # a row that divides by zero
    assert server_decode_error(db, "z", "pz") == "division by zero"
    with PublicationFilters.from_publication(db.conninfo, "pz") as filters, \
            pytest.raises(EvaluationError, match="division by zero") as info:
        decode(db, "z", "pall", filters)
    assert info.value.context == 'row filter of table "public.z"'
    # a constant that divides by zero: refused when the filter is first used
    assert server_decode_error(db, "z", "pzc") == "division by zero"
    with PublicationFilters.from_publication(db.conninfo, "pzc") as filters, \
            pytest.raises(EvaluationError, match="division by zero"):
        decode(db, "z", "pall", filters)


def test_a_column_dropped_after_configuration(db: Any) -> None:
    db.execute("CREATE TABLE d (id int PRIMARY KEY, a int, b int)")
    db.execute("CREATE PUBLICATION pall FOR ALL TABLES")
    filters = PublicationFilters.from_spec(db.conninfo, {"public.d": "a > 1"}, {},
                                           publish=["insert"])
    create_slot(db, "d")
    conn = workload_conn(db)
    conn.execute("ALTER TABLE d DROP COLUMN a")
    conn.execute("INSERT INTO d VALUES (1, 2)")
    conn.close()
    with filters, pytest.raises(RowFilterError, match='column "a" used by the row filter is '
                                                      "missing from the stream"):
        decode(db, "d", "pall", filters)


# --- TOAST ---------------------------------------------------------------------------------------

def test_unchanged_toast_takes_the_old_value(db: Any) -> None:
    """An UPDATE that leaves a TOASTed column alone sends it as "unchanged": the filter sees
    the old row's value, and an UPDATE turned INSERT carries it."""
    db.execute("CREATE TABLE big (id int, x int, doc text)")
    db.execute("ALTER TABLE big REPLICA IDENTITY FULL")
    db.execute("ALTER TABLE big ALTER COLUMN doc SET STORAGE EXTERNAL")
    db.execute("CREATE PUBLICATION pbig FOR TABLE big WHERE (length(doc) > 5000 AND x > 2)")
    db.execute("CREATE PUBLICATION pall FOR ALL TABLES")
    create_slot(db, "big")
    doc = "".join(chr(ord("a") + i % 26) for i in range(8000))
    conn = workload_conn(db)
    conn.execute("INSERT INTO big VALUES (1, 1, %s), (2, 5, %s)", (doc, doc))
    conn.execute("UPDATE big SET x = 3 WHERE id = 1")  # old no, new yes: INSERT with doc
    conn.execute("UPDATE big SET x = 7 WHERE id = 2")  # both: UPDATE, doc unchanged
    conn.execute("UPDATE big SET x = 0 WHERE id = 2")  # old yes, new no: DELETE
    conn.close()
    server = decode(db, "big", "pbig")
    with PublicationFilters.from_publication(db.conninfo, "pbig") as filters:
        mine = decode(db, "big", "pall", filters)
    assert mine == server
    changes = [ev for txn in server for ev in txn]
    assert [ev[2] for ev in changes] == ["INSERT", "INSERT", "UPDATE", "DELETE"]
    assert dict(changes[1][3])["doc"] == doc  # the old row's value, sent in full
    from plugin_framework import UNCHANGED_TOAST
    assert dict(changes[2][3])["doc"] is UNCHANGED_TOAST  # an UPDATE stays as it is


def test_the_catalog_connection_comes_back(seed: Any) -> None:
    with PublicationFilters.from_publication(seed.conninfo, "p3") as filters:
        assert filters.catalog is not None
        filters.catalog.conn.close()
        assert decode(seed, "seed", "pall", filters) == decode(seed, "seed", "p3")
        filters.catalog.conn.close()
        assert filters.catalog._rows("SELECT 1") == [(1,)]
