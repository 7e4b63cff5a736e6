"""The MERGE INTO recipe (``MergeIntoWriter``) against the server's tables, on each
version, through Spark SQL's own MERGE INTO, INSERT OVERWRITE and ALTER TABLE.

Delta Lake's and Iceberg's jars cannot be fetched here (no Maven Central), so the target
tables are those of tests/java/RowLevelCatalog.java, built with javac at the start: a
catalog of in-memory tables that take row-level operations as Delta's and Iceberg's do.
Spark parses, plans and runs each statement (MERGE INTO becomes a scan, a join and a
rewrite of the table's rows); only the storage is the catalog's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from support.mirror_workload import SCHEMA, assert_took_both_ways, run_workload
from support.spark_fixtures import arrow_rows, spark_session, table_columns, table_rows  # noqa: F401

from plugin_framework.spark import ForeachBatchStream, MergeIntoWriter, PgoutputDataSource
from plugin_framework.spark.columns.descriptions import SchemaChangeError
from plugin_framework.spark.mirrors.mergesql import target_name

pytestmark = pytest.mark.slow

JAVA = Path(__file__).parents[1] / "java" / "RowLevelCatalog.java"
CATALOG = "pgdecode_mem"
CATALOG_CLASS = "pgdecode.testing.RowLevelCatalog"


@pytest.fixture(scope="session", name="rowlevel_jar")
def rowlevel_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test catalog, compiled against the installed Spark."""
    import pyspark

    javac = shutil.which("javac")
    assert javac is not None, "javac (the JDK of Java 17) builds the MERGE INTO test catalog"
    work = tmp_path_factory.mktemp("rowlevel")
    classes = work / "classes"
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    subprocess.run([javac, "-nowarn", "-d", str(classes), "-cp",
                    os.pathsep.join(map(str, jars)), str(JAVA)], check=True)
    jar = work / "rowlevel.jar"
    with zipfile.ZipFile(jar, "w") as out:
        for path in classes.rglob("*.class"):
            out.write(path, path.relative_to(classes).as_posix())
    return jar


@pytest.fixture(scope="session", name="catalog")
def row_level_catalog(spark: Any, rowlevel_jar: Path) -> Iterator[str]:
    """The test catalog, added to the session's Spark."""
    spark.sql(f"ADD JAR '{rowlevel_jar}'")
    spark.conf.set(f"spark.sql.catalog.{CATALOG}", CATALOG_CLASS)
    yield CATALOG


def target_rows(spark: Any, target: str, columns: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(arrow_rows(spark.table(target).select(*columns).toArrow(), columns))


def test_merge_into_gives_the_table_for_batches_applied_twice(db: Any, spark: Any, catalog: str,
                                                              tmp_path: Path) -> None:
    """The mirror test's workload on m_pk (key-change chains within and across batches,
    TOAST values that updates leave unchanged, deletes and reinserts, rolled-back
    savepoints, two-phase commits and rollbacks, streamed transactions), without its
    ALTER TABLEs: in batches of 7, each merged twice (as a batch delivered again after a
    crash: the second merge takes the staged rows) through ForeachBatchStream, and in batches
    of 10,000 through the data source; and its first 20 transactions in batches of 1 (a
    MERGE per transaction), compared with the table as it was then."""
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
    sizes = (1, 7, 10_000)
    for size in sizes:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (f"mi{size}",))
    early: list[tuple[str, Counter[tuple[Any, ...]]]] = []

    def record() -> None:
        if len(early) < 20:
            lsn = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
            early.append((lsn, table_rows(db, "public.m_pk")))

    with db.connect(autocommit=True) as conn:
        made = run_workload(conn, seed=29, transactions=60, record=record, alter=False)
    assert made.prepared and made.rolled_back and made.large, vars(made)
    end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    db.execute("SELECT pg_switch_wal()")
    columns = table_columns(db, "public.m_pk")
    namespace = f"{catalog}.s{uuid.uuid4().hex[:8]}_"  # (the catalog lives as long as Spark)
    for size in sizes:
        endpos, expected = early[-1] if size == 1 else (end, table_rows(db, "public.m_pk"))
        target = f"{namespace}{size}.{{table}}"
        writer = MergeIntoWriter(target, str(tmp_path / f"staging{size}"),
                                 tables=["public.m_pk"], create="")
        merged: list[int] = []

        def fn(df: Any, batch_id: int, writer: Any = writer, size: int = size,
               merged: list[int] = merged) -> None:
            for _ in range(2 if size == 7 else 1):
                writer(df, batch_id)
            merged.append(batch_id)

        if size < 10_000:
            ForeachBatchStream(spark, fn, dsn=db.conninfo, slot=f"mi{size}",
                               publications=["mirror_pub"],
                               checkpoint=str(tmp_path / f"ck{size}"), max_rows=size,
                               endpos=endpos).run()
            if size == 7:
                assert_took_both_ways(db, f"mi{size}")
        else:  # the other way in
            spark.dataSource.register(PgoutputDataSource)
            (spark.readStream.format("pgoutput").option("dsn", db.conninfo)
             .option("slot", f"mi{size}").option("publication", "mirror_pub")
             .option("maxChangesPerBatch", str(size)).load().writeStream.foreachBatch(fn)
             .option("checkpointLocation", str(tmp_path / f"ck{size}"))
             .trigger(availableNow=True).start().awaitTermination(300))
        assert len(merged) > (5 if size < 10_000 else 0)
        got = target_rows(spark, f"{namespace}{size}.m_pk", columns)
        missing, extra = expected - got, got - expected
        assert not missing and not extra, (
            f"batches of {size}: {len(missing)} rows missing (e.g. "
            f"{str(sorted(missing)[:1])[:300]}), {len(extra)} unexpected (e.g. "
            f"{str(sorted(extra)[:1])[:300]})")
        lsns = [r[0] for r in spark.table(f"{namespace}{size}.m_pk").select("_commit_lsn")
                .collect()]
        assert all(lsn is not None and lsn > 0 for lsn in lsns)
        # only one batch's net changes stay staged: the last with changes of m_pk (in
        # batches of 1, some have m_full's only)
        staged = sorted(p.name for p in (tmp_path / f"staging{size}").rglob("*.parquet"))
        assert len(staged) == 1 and staged[0] in {f"batch-{b}.parquet" for b in merged[-3:]}, \
            (staged, merged[-3:])


def test_merge_into_refuses_what_it_cannot_apply_and_says_what_to_do(
        db: Any, spark: Any, catalog: str, tmp_path: Path) -> None:
    """A target that does not exist, a column the target lacks after an ALTER TABLE, a
    truncating batch, and a table without a key."""
    with db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE r (id int PRIMARY KEY, v text);"
                     "CREATE TABLE nokey (a int, b text);"
                     "ALTER TABLE nokey REPLICA IDENTITY FULL;"
                     "CREATE PUBLICATION r_pub FOR TABLE r, nokey")
    db.execute("SELECT pg_create_logical_replication_slot('mr', 'pgoutput')")
    refused = f"{catalog}.refused_{uuid.uuid4().hex[:8]}"  # (the catalog lives as long as Spark)
    writer = MergeIntoWriter(f"{refused}.{{table}}", str(tmp_path / "staging"),
                             tables=["public.r"])
    batches: list[int] = []

    def fn(df: Any, batch_id: int) -> None:
        writer(df, batch_id)
        batches.append(batch_id)

    def run() -> None:
        end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
        ForeachBatchStream(spark, fn, dsn=db.conninfo, slot="mr", publications=["r_pub"],
                           checkpoint=str(tmp_path / "ck"), endpos=end).run()

    def expect_target() -> None:
        assert target_rows(spark, f"{refused}.r", ["id", "v"]) == \
            table_rows(db, "public.r")

    db.execute("INSERT INTO r SELECT g, 'v' || g FROM generate_series(1, 5) g")
    with pytest.raises(SchemaChangeError, match="does not exist") as missing:
        run()
    statement = str(missing.value).split("\n", 1)[1]
    assert statement.startswith(f"CREATE TABLE {refused}.`r` (`id` int, `v` string, "
                                "`_commit_lsn` bigint, `_lsn` bigint)"), statement
    spark.sql(statement)
    run()  # the batch again, now merged
    expect_target()
    db.execute("ALTER TABLE r ADD COLUMN w int")
    db.execute("UPDATE r SET w = id * 10 WHERE id < 3")
    with pytest.raises(SchemaChangeError, match="missing: w") as added:
        run()
    fixes = str(added.value).split("\n", 1)[1]
    assert fixes == f"ALTER TABLE {refused}.`r` ADD COLUMNS (`w` int)", fixes
    before = len(batches)
    spark.sql(fixes)
    run()
    assert len(batches) == before + 1
    assert target_rows(spark, f"{refused}.r", ["id", "v", "w"]) == \
        table_rows(db, "public.r")
    # a TRUNCATE: the rows after it replace the target's
    with db.connect() as conn:
        conn.execute("TRUNCATE r")
        conn.execute("INSERT INTO r VALUES (40, 'after', 4)")
    run()
    assert target_rows(spark, f"{refused}.r", ["id", "v", "w"]) == \
        table_rows(db, "public.r") == Counter({(40, "after", 4): 1})
    # a table without a key
    keyless = MergeIntoWriter(f"{refused}.{{table}}", str(tmp_path / "staging2"),
                              create="")
    db.execute("INSERT INTO nokey VALUES (1, 'x')")
    with pytest.raises(ValueError, match="no key a MERGE could match rows on"):
        end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
        ForeachBatchStream(spark, keyless, dsn=db.conninfo, slot="mr", publications=["r_pub"],
                           checkpoint=str(tmp_path / "ck"), endpos=end).run()


def test_the_spark_emitter_merges_into_the_catalog_s_tables(db: Any, rowlevel_jar: Path,
                                                            tmp_path: Path) -> None:
    """``pgdecode stream --emitter spark -o merge-into=...``: the sink runs before
    ``foreach-batch``, whose function records the target after each batch."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t")
    db.execute("SELECT pg_create_logical_replication_slot('cli_merge', 'pgoutput')")
    db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 30) g")
    db.execute("UPDATE t SET id = id + 100, v = 'moved' WHERE id <= 10")
    db.execute("DELETE FROM t WHERE id BETWEEN 20 AND 25")
    end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    out = tmp_path / "target.json"
    (tmp_path / "cli_merge_fn.py").write_text(
        "import json\n"
        "def fn(df, batch_id):\n"
        f"    rows = df.sparkSession.table('{CATALOG}.cli.t').collect()\n"
        f"    with open({str(out)!r}, 'w') as f:\n"
        "        json.dump(sorted([r['id'], r['v']] for r in rows), f)\n")
    env = {"PYTHONPATH": str(tmp_path), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    conf = f"spark.ui.enabled=false,spark.jars={rowlevel_jar}," \
           f"spark.sql.catalog.{CATALOG}={CATALOG_CLASS}"
    result = subprocess.run(
        [sys.executable, "-m", "plugin_framework.cli", "stream", "-d", db.conninfo,
         "-S", "cli_merge", "--publication", "p", "--emitter", "spark",
         "-o", f"checkpoint={tmp_path / 'ck'}", "-o", f"merge-into={CATALOG}.cli.{{table}}",
         "-o", "merge-create=USING memory", "-o", "foreach-batch=cli_merge_fn:fn",
         "-o", "max-rows=20", "-o", "master=local[1]", "-o", f"spark-conf={conf}",
         "-E", end, "--status-interval", "1", "-q"],
        env=env, capture_output=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    expected = sorted([i, v] for i, v in db.execute("SELECT id, v FROM t"))
    assert json.loads(out.read_text()) == expected
    # the staging is in the checkpoint directory unless merge-staging says otherwise
    assert list((tmp_path / "ck" / "merge-staging" / "public" / "t").glob("batch-*.parquet"))


# --- hand-made batches: what the workloads above do not reach ------------------------------

_LSN = [0x1000]


def change(table: str, op: str, spec: list[tuple[str, str, bool]], *,
           after: dict[str, str | None] | None = None, key: dict[str, str] | None = None,
           toast: tuple[str, ...] = (), schema: str = "public") -> dict[str, Any]:
    """A change row in the server's text (its own transaction)."""
    _LSN[0] += 0x10

    def pairs(row: dict[str, str | None] | None) -> list[tuple[str, str | None]] | None:
        return None if row is None else list(row.items())

    return {"lsn": _LSN[0], "commit_lsn": _LSN[0], "seq": 0, "xid": 1,
            "commit_time": datetime(2024, 1, 1, tzinfo=UTC), "op": op, "schema": schema,
            "table": table, "key": pairs(key), "before": pairs(key), "after": pairs(after),
            "before_json": None if key is None else json.dumps(key),
            "after_json": None if after is None else json.dumps(after),
            "unchanged_toast": list(toast), "origin": None, "gid": None,
            "columns": [{"name": n, "type": t, "type_oid": 0, "key": k} for n, t, k in spec]}


def batch(spark: Any, rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    from plugin_framework.spark.changes.schema import arrow_schema, change_schema

    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=arrow_schema()),
                                 change_schema())


def test_timestamps_keep_their_values_in_any_session_time_zone(spark: Any, catalog: str,
                                                               tmp_path: Path) -> None:
    """timestamp (timestamp_ntz) and timestamptz values, one in a daylight saving gap of the
    session's zone, in a batch with and one without unchanged TOAST values."""
    spec = [("id", "integer", True), ("ts", "timestamp without time zone", False),
            ("tz", "timestamp with time zone", False), ("big", "text", False)]
    ns = f"{catalog}.ts_{uuid.uuid4().hex[:8]}"
    writer = MergeIntoWriter(f"{ns}.{{table}}", str(tmp_path / "staging"), create="")
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        writer(batch(spark, [
            change("t", "INSERT", spec, after={"id": "1", "ts": "2024-01-01 12:00:00",
                                               "tz": "2024-01-01 12:00:00+00", "big": "B1"}),
            change("t", "INSERT", spec, after={"id": "2", "ts": "2024-03-10 02:30:00",
                                               "tz": "2024-03-10 07:30:00+00", "big": "B2"}),
        ]), 0)
        writer(batch(spark, [
            change("t", "UPDATE", spec, key={"id": "1"}, toast=("big",),
                   after={"id": "1", "ts": "2024-01-01 12:00:01",
                          "tz": "2024-01-01 12:00:01+00", "big": None}),
            change("t", "INSERT", spec, after={"id": "3", "ts": "2024-06-01 08:00:00",
                                               "tz": "2024-06-01 08:00:00+02", "big": "B3"}),
        ]), 1)
        got = sorted(tuple(r) for r in spark.sql(
            f"SELECT id, CAST(ts AS STRING), unix_micros(tz), big FROM {ns}.t").collect())
        types = {f.name: f.dataType.simpleString() for f in spark.table(f"{ns}.t").schema}
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)

    def micros(text: str) -> int:
        return int(datetime.fromisoformat(text).timestamp()) * 1_000_000

    assert got == [(1, "2024-01-01 12:00:01", micros("2024-01-01 12:00:01+00:00"), "B1"),
                   (2, "2024-03-10 02:30:00", micros("2024-03-10 07:30:00+00:00"), "B2"),
                   (3, "2024-06-01 08:00:00", micros("2024-06-01 08:00:00+02:00"), "B3")]
    assert (types["ts"], types["tz"]) == ("timestamp_ntz", "timestamp")


def test_any_table_name_gets_a_target_of_its_own(spark: Any, catalog: str,
                                                 tmp_path: Path) -> None:
    """Names with blanks, dots, backquotes and letters beyond ASCII stay one part of the
    target's name (and of the staging path); two tables that would share a target are
    refused."""
    spec = [("id", "integer", True), ("v", "text", False)]
    ns = f"n{uuid.uuid4().hex[:8]}"
    writer = MergeIntoWriter(f"{catalog}.{ns}_{{schema}}.{{table}}", str(tmp_path / "staging"),
                             create="")
    names = [("Odd Schema", "My Table"), ("public", "a.b"), ("public", "données"),
             ("public", "x`y"), ("a/..", "b")]
    writer(batch(spark, [change(table, "INSERT", spec, schema=schema,
                                after={"id": str(i), "v": f"{schema}.{table}"})
                         for i, (schema, table) in enumerate(names)]), 0)
    for i, (schema, table) in enumerate(names):
        target = target_name(f"{catalog}.{ns}_{{schema}}.{{table}}", schema, table)
        assert [tuple(r) for r in spark.table(target).select("id", "v").collect()] == \
            [(i, f"{schema}.{table}")], target
    assert len(list((tmp_path / "staging").rglob("batch-0.parquet"))) == len(names)
    shared = MergeIntoWriter(f"{catalog}.{ns}_shared.{{table}}", str(tmp_path / "s2"),
                             create="")
    with pytest.raises(ValueError, match="would both go to"):
        shared(batch(spark, [change("t", "INSERT", spec, schema=schema,
                                    after={"id": "1", "v": "x"}) for schema in ("a", "b")]), 0)


def test_a_batch_delivered_again_with_other_rows_is_refused(spark: Any, catalog: str,
                                                            tmp_path: Path) -> None:
    """The TOAST values of its key changes were taken from the target before it was merged:
    the same batch id with other rows of the same query cannot take them again."""
    spec = [("id", "integer", True), ("big", "text", False)]
    ns = f"{catalog}.again_{uuid.uuid4().hex[:8]}"
    writer = MergeIntoWriter(f"{ns}.{{table}}", str(tmp_path / "staging"), create="")
    context = spark.sparkContext
    context.setLocalProperty("pgdecode.queryId", "q1")
    try:
        writer(batch(spark, [change("t", "INSERT", spec, after={"id": "1", "big": "BIG"})]), 0)
        moved = [change("t", "UPDATE", spec, key={"id": "1"}, toast=("big",),
                        after={"id": "2", "big": None})]
        writer(batch(spark, moved), 1)
        writer(batch(spark, moved), 1)  # the same rows again: merged again, the same table
        assert [tuple(r) for r in spark.table(f"{ns}.t").select("id", "big").collect()] == \
            [(2, "BIG")]
        other = [*moved, change("t", "INSERT", spec, after={"id": "9", "big": "X"})]
        with pytest.raises(RuntimeError, match="delivered again with other rows"):
            writer(batch(spark, other), 1)
        assert [tuple(r) for r in spark.table(f"{ns}.t").select("id", "big").collect()] == \
            [(2, "BIG")]
        context.setLocalProperty("pgdecode.queryId", "q2")  # another query's batch 1
        writer(batch(spark, other), 1)
    finally:
        context.setLocalProperty("pgdecode.queryId", None)
    assert sorted(tuple(r) for r in spark.table(f"{ns}.t").select("id", "big").collect()) == \
        [(2, None), (9, "X")]  # (its fill was staged again from the merged target: NULL)


def test_type_changes_float_keys_and_truncates(spark: Any, catalog: str,
                                               tmp_path: Path) -> None:
    """A column whose type changed is refused with the ALTER TABLE the target needs; a float
    key changed from 0 to -0 (one row for SQL) is one update; a TRUNCATE empties the target
    in the session's dynamic partition overwrite mode too."""
    ns = f"{catalog}.misc_{uuid.uuid4().hex[:8]}"
    writer = MergeIntoWriter(f"{ns}.{{table}}", str(tmp_path / "staging"), create="")
    numeric = [("id", "integer", True), ("n", "numeric(10,2)", False)]
    writer(batch(spark, [change("t", "INSERT", numeric, after={"id": "1", "n": "1.25"})]), 0)
    wider = [("id", "integer", True), ("n", "numeric(12,4)", False)]
    with pytest.raises(SchemaChangeError, match=r"of another type: n \(decimal\(10,2\), not "
                                                r"decimal\(12,4\)\)") as retyped:
        writer(batch(spark, [change("t", "UPDATE", wider, key={"id": "1"},
                                    after={"id": "1", "n": "1.2345"})]), 1)
    assert str(retyped.value).endswith(f"ALTER TABLE {ns}.`t` ALTER COLUMN `n` TYPE "
                                       "decimal(12,4)")
    floats = [("k", "double precision", True), ("v", "text", False)]
    writer(batch(spark, [change("f", "INSERT", floats, after={"k": "0", "v": "a"})]), 0)
    writer(batch(spark, [change("f", "UPDATE", floats, key={"k": "0"},
                                after={"k": "-0", "v": "b"})]), 1)
    assert [tuple(r) for r in spark.table(f"{ns}.f").select("k", "v").collect()] == \
        [(0.0, "b")]
    mode = "spark.sql.sources.partitionOverwriteMode"
    spark.conf.set(mode, "dynamic")
    try:
        writer(batch(spark, [{**change("f", "TRUNCATE", floats), "before": None,
                              "key": None, "before_json": None}]), 2)
        assert spark.conf.get(mode) == "dynamic"
    finally:
        spark.conf.unset(mode)
    assert spark.table(f"{ns}.f").count() == 0


def test_a_replica_identity_full_table_is_merged_by_the_key_given(spark: Any, catalog: str,
                                                                  tmp_path: Path) -> None:
    """Its rows mark every column as the key; ``keys`` names the primary key the MERGE
    matches on (a key change with a TOAST value left unchanged, merged twice)."""
    spec = [("id", "integer", True), ("v", "text", True), ("big", "text", True)]
    ns = f"{catalog}.full_{uuid.uuid4().hex[:8]}"
    writer = MergeIntoWriter(f"{ns}.{{table}}", str(tmp_path / "staging"), create="",
                             keys={"public.f": ["id"]})
    writer(batch(spark, [change("f", "INSERT", spec, after={"id": "1", "v": "a", "big": "B"}),
                         change("f", "INSERT", spec, after={"id": "2", "v": "a", "big": "C"})]),
           0)
    moved = batch(spark, [
        change("f", "UPDATE", spec, key={"id": "1", "v": "a", "big": "B"}, toast=("big",),
               after={"id": "3", "v": "a", "big": None}),
        change("f", "DELETE", spec, key={"id": "2", "v": "a", "big": "C"})])
    for _ in range(2):
        writer(moved, 1)
        assert [tuple(r) for r in spark.table(f"{ns}.f").select("id", "v", "big").collect()] \
            == [(3, "a", "B")]
    with pytest.raises(ValueError, match="no key a MERGE could match rows on"):
        MergeIntoWriter(f"{ns}.{{table}}", str(tmp_path / "s2"), create="")(moved, 1)


def run_key_changes(conn: Any, seed: int, transactions: int) -> None:
    """Rows of m_pk with TOAST values, then transactions of key changes and updates that
    leave them unchanged, deletes and new rows: no later change writes a value again, so a
    value lost in a key change stays lost (the mirror workload's large transactions rewrite
    every row's). Some transactions are prepared, then committed or rolled back, some roll
    a savepoint back, and some are large enough for the server to stream them (many
    updates that leave the TOAST values as they are)."""
    import random

    from support.mirror_workload import big

    r = random.Random(seed)
    ex = conn.execute
    ex("INSERT INTO m_pk SELECT g, g, %s, 'n' || g FROM generate_series(1, 30) g", (big(r),))
    for number in range(transactions):
        ex("BEGIN")
        if r.random() < 0.08:  # some 1,200 small changes: more than logical_decoding_work_mem
            for _ in range(40):
                ex("UPDATE m_pk SET v = v + 1")
        if r.random() < 0.2:
            ex("SAVEPOINT s")
            ex("UPDATE m_pk SET big = 'gone', id = id + 1000")
            ex("ROLLBACK TO SAVEPOINT s")
        for _ in range(r.randint(1, 3)):
            k, choice = r.randint(1, 30), r.randrange(4)
            if choice == 0:  # up and back down: key-change chains, within a batch or not
                ex("UPDATE m_pk SET id = id + 100 WHERE id = %s", (k,))
            elif choice == 1:
                ex("UPDATE m_pk SET id = id - 100, v = v + 1 WHERE id = %s "
                   "AND NOT EXISTS (SELECT FROM m_pk WHERE id = %s)", (k + 100, k))
            elif choice == 2:
                ex("UPDATE m_pk SET v = v + 1, note = %s WHERE id IN (%s, %s)",
                   (f"u{number}", k, k + 100))
            else:
                ex("DELETE FROM m_pk WHERE id IN (%s, %s)", (k, k + 100))
                ex("INSERT INTO m_pk VALUES (%s, 0, %s, 'again')", (k, big(r)))
        if r.random() < 0.15:
            gid = f"keys_{seed}_{number}"
            ex(f"PREPARE TRANSACTION '{gid}'")
            ex(f"{'ROLLBACK' if r.random() < 0.3 else 'COMMIT'} PREPARED '{gid}'")
        else:
            ex("COMMIT")


@pytest.mark.soak
def test_kill_9s_after_merges_give_the_table(db: Any, spark: Any, catalog: str,
                                             rowlevel_jar: Path, tmp_path: Path) -> None:
    """A workload of key changes (with prepared, streamed and savepoint-rolled-back
    transactions) merged in batches of 7 by a process killed with SIGKILL three times,
    each time after the MERGE of a batch with key changes that leave TOAST values unchanged
    and before its checkpoint record: each restart delivers that batch again, merges its
    staged rows again (the target's values taken before the first merge), and the target
    (kept on disk by the test catalog) ends equal to ``SELECT *``."""
    from support.merge_runner import CATALOG, CATALOG_CLASS
    from support.runners import start_runner, wait_runner, wait_slot_free

    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
    db.execute("SELECT pg_create_logical_replication_slot('mk', 'pgoutput', false, true)")
    with db.connect(autocommit=True) as conn:
        run_key_changes(conn, seed=31, transactions=80)
    end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    runner = Path(__file__).parents[1] / "support" / "merge_runner.py"
    args = [sys.executable, str(runner), "--dsn", db.conninfo, "--slot", "mk", "--work",
            str(tmp_path), "--jar", str(rowlevel_jar), "--endpos", end]
    killed: list[int] = []
    for _ in range(3):
        (tmp_path / "killme").unlink(missing_ok=True)
        start = killed[-1] + 1 if killed else 0
        proc = start_runner([*args, "--kill-from", str(start)], tmp_path)
        wait_runner(proc, tmp_path, "killme")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed.append(int((tmp_path / "killme").read_text()))
        wait_slot_free(db, "mk")
    proc = start_runner(args, tmp_path)
    wait_runner(proc, tmp_path, "done")
    assert proc.wait(60) == 0
    assert_took_both_ways(db, "mk")  # streamed transactions, prepared ones at PREPARE
    merged = [int(x) for x in (tmp_path / "merged").read_text().split()]
    for batch_id in killed:  # merged, killed, merged again from the staged rows
        assert merged.count(batch_id) == 2, (killed, merged)
    # (read back in this process's Spark, the catalog's jar added: a catalog of each test)
    kept = f"{CATALOG}_{uuid.uuid4().hex[:8]}"
    spark.conf.set(f"spark.sql.catalog.{kept}", CATALOG_CLASS)
    spark.conf.set(f"spark.sql.catalog.{kept}.path", str(tmp_path / "tables"))
    got = target_rows(spark, f"{kept}.mirror.m_pk", table_columns(db, "public.m_pk"))
    expected = table_rows(db, "public.m_pk")
    missing, extra = expected - got, got - expected
    assert not missing and not extra, (
        f"killed after batches {killed}: {len(missing)} rows missing (e.g. "
        f"{str(sorted(missing)[:1])[:200]}), {len(extra)} unexpected (e.g. "
        f"{str(sorted(extra)[:1])[:200]})")


def test_a_target_with_wider_types_is_merged_into(spark: Any, catalog: str,
                                                 tmp_path: Path) -> None:
    """A target made by hand (or by a format that widens, as Iceberg keeps a smallint as an
    int) whose columns hold every value of the table's types takes the rows; a narrower one
    is refused. So is a template that quotes part of a part."""
    spec = [("id", "integer", True), ("s", "smallint", False), ("r", "real", False),
            ("n", "numeric(10,2)", False), ("a", "smallint[]", False)]
    ns = f"{catalog}.wide_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {ns}.t (id bigint, s int, r double, n decimal(14,4), "
              "a array<int>, _commit_lsn bigint, _lsn bigint)")
    spark.sql(f"CREATE TABLE {ns}.narrow (id smallint, s int, r double, n decimal(14,4), "
              "a array<int>, _commit_lsn bigint, _lsn bigint)")
    writer = MergeIntoWriter(f"{ns}.{{table}}", str(tmp_path / "staging"))
    row = change("t", "INSERT", spec, after={
        "id": "1", "s": "-32768", "r": "1.5", "n": "12345678.91", "a": "{1,NULL,-2}"})
    row["after_json"] = json.dumps(  # (as the json emitter converts: arrays as arrays)
        {"id": 1, "s": -32768, "r": 1.5, "n": "12345678.91", "a": [1, None, -2]})
    writer(batch(spark, [row]), 0)
    assert [tuple(r) for r in spark.table(f"{ns}.t").select("id", "s", "r", "n", "a")
            .collect()] == [(1, -32768, 1.5, Decimal("12345678.9100"), [1, None, -2])]
    with pytest.raises(SchemaChangeError, match=r"of another type: id \(smallint, not int\)"):
        writer(batch(spark, [change("narrow", "INSERT", spec, after={
            "id": "1", "s": "1", "r": "1", "n": "1", "a": "{}"})]), 1)
    with pytest.raises(ValueError, match="whole or not at all"):
        MergeIntoWriter(f"{ns}.`x`{{table}}", str(tmp_path / "s2"))
