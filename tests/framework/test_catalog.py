"""Read-only catalog access for plugins: answers, caching, and no way to write."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from plugin_framework import MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.framework import Catalog, CatalogError


@pytest.fixture
def catalog_db(db: Any) -> Any:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text NOT NULL DEFAULT 'x', n int)")
    db.execute("CREATE SEQUENCE s")
    db.execute("CREATE FUNCTION writer() RETURNS int LANGUAGE sql AS "
               "$$ INSERT INTO t VALUES (99, 'written') RETURNING id $$")
    return db


def test_answers_from_the_catalog(catalog_db: Any) -> None:
    catalog = Catalog(catalog_db.conninfo)
    oid = catalog_db.execute("SELECT 't'::regclass::oid")[0][0]
    assert catalog.type_name(1043, 14) == "character varying(10)"
    assert catalog.not_null_columns(oid) == {"id", "name"}
    assert catalog.column_defaults(oid) == {"name": "'x'::text"}
    catalog.close()


def test_results_are_cached(catalog_db: Any) -> None:
    catalog = Catalog(catalog_db.conninfo)
    first = catalog.query("SELECT count(*) FROM t")
    catalog_db.execute("INSERT INTO t VALUES (1, 'a')")
    assert catalog.query("SELECT count(*) FROM t") == first == [(0,)]
    assert catalog.query("SELECT count(*) FROM t WHERE id > %s", (0,)) == [(1,)]
    catalog.invalidate()
    assert catalog.query("SELECT count(*) FROM t") == [(1,)]
    catalog.close()


@pytest.mark.parametrize("sql", [
    "DROP TABLE t",
    "SELECT 1; DROP TABLE t",
    "SELECT * INTO t2 FROM t",
    "SELECT * FROM t FOR UPDATE",
    "INSERT INTO t VALUES (5, 'x')",
    "SELEC 1",
])
def test_refuses_anything_but_one_plain_select(catalog_db: Any, sql: str) -> None:
    catalog = Catalog(catalog_db.conninfo)
    with pytest.raises(CatalogError):
        catalog.query(sql)
    assert catalog_db.execute("SELECT count(*) FROM t")[0][0] == 0
    assert catalog_db.execute("SELECT to_regclass('t2')")[0][0] is None


@pytest.mark.parametrize("sql", ["SELECT writer()", "SELECT nextval('s')"])
def test_writes_hidden_in_functions_hit_the_read_only_transaction(catalog_db: Any,
                                                                   sql: str) -> None:
    catalog = Catalog(catalog_db.conninfo)
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        catalog.query(sql)
    assert catalog_db.execute("SELECT count(*) FROM t")[0][0] == 0


class NotNullReporter(OutputPlugin):
    def begin(self, ctx: Any, txn: Any) -> None: ...
    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None: ...

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        ctx.emit(",".join(sorted(ctx.catalog.not_null_columns(relation.relation_id))))


def test_plugins_reach_it_through_the_context(catalog_db: Any) -> None:
    from support.capture import peek, pgoutput_options

    db = catalog_db
    db.execute("CREATE PUBLICATION p FOR TABLE t")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.dbname,))
    with db.connect(autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        captured = peek(conn, db.dbname, pgoutput_options(1, publication="p"))
    out = MemoryOutput()
    pipeline = Pipeline(proto_version=1, catalog=Catalog(db.conninfo))
    pipeline.add(NotNullReporter(), output=out)
    pipeline.startup()
    for item in captured:
        pipeline.feed(item.data, item.lsn)
    pipeline.shutdown()
    assert out.lines == ["id,name"]
