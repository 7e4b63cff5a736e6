"""The MERGE INTO recipe (``MergeIntoWriter``, #16) against the server's tables, on each
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
import subprocess
import sys
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_fixtures import _norm, spark_session, table_rows  # noqa: F401
from test_spark_mirror import SCHEMA, assert_took_both_ways, run_workload

from plugin_framework.spark import ForeachBatchStream, MergeIntoWriter, PgoutputDataSource
from plugin_framework.spark.schemas import SchemaChangeError

pytestmark = pytest.mark.slow

JAVA = Path(__file__).parent / "java" / "RowLevelCatalog.java"
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
    return Counter(tuple(_norm(r[c]) for c in columns) for r in spark.table(target).collect())


def test_merge_into_gives_the_table_for_batches_applied_twice(db: Any, spark: Any, catalog: str,
                                                              tmp_path: Path) -> None:
    """The mirror test's workload on m_pk (key-change chains within and across batches,
    TOAST values that updates leave unchanged, deletes and reinserts, rolled-back
    savepoints, two-phase commits and rollbacks, streamed transactions), without its
    ALTER TABLEs: in batches of 7, each merged twice (as a batch delivered again after a
    crash: the second merge takes the staged rows) through ForeachBatchStream, and in batches
    of 10,000 through the data source."""
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
    sizes = (7, 10_000)
    for size in sizes:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (f"mi{size}",))
    with db.connect(autocommit=True) as conn:
        made = run_workload(conn, seed=29, transactions=60, alter=False)
    assert made.prepared and made.rolled_back and made.large, vars(made)
    end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    db.execute("SELECT pg_switch_wal()")
    columns = ["id", "v", "big", "note"]
    namespace = f"{catalog}.s{uuid.uuid4().hex[:8]}_"  # (the catalog lives as long as Spark)
    expected = table_rows(db, "public.m_pk")
    for size in sizes:
        target = f"{namespace}{size}.{{table}}"
        writer = MergeIntoWriter(target, str(tmp_path / f"staging{size}"),
                                 tables=["public.m_pk"], create="")
        merged: list[int] = []

        def fn(df: Any, batch_id: int, writer: Any = writer, size: int = size,
               merged: list[int] = merged) -> None:
            for _ in range(2 if size == sizes[0] else 1):
                writer(df, batch_id)
            merged.append(batch_id)

        if size == sizes[0]:
            ForeachBatchStream(spark, fn, dsn=db.conninfo, slot=f"mi{size}",
                               publications=["mirror_pub"],
                               checkpoint=str(tmp_path / f"ck{size}"), max_rows=size,
                               endpos=end).run()
            assert_took_both_ways(db, f"mi{size}")
        else:  # the other way in
            spark.dataSource.register(PgoutputDataSource)
            (spark.readStream.format("pgoutput").option("dsn", db.conninfo)
             .option("slot", f"mi{size}").option("publication", "mirror_pub")
             .option("maxChangesPerBatch", str(size)).load().writeStream.foreachBatch(fn)
             .option("checkpointLocation", str(tmp_path / f"ck{size}"))
             .trigger(availableNow=True).start().awaitTermination(300))
        assert len(merged) > (5 if size == sizes[0] else 0)
        got = target_rows(spark, f"{namespace}{size}.m_pk", columns)
        missing, extra = expected - got, got - expected
        assert not missing and not extra, (
            f"batches of {size}: {len(missing)} rows missing (e.g. "
            f"{str(sorted(missing)[:1])[:300]}), {len(extra)} unexpected (e.g. "
            f"{str(sorted(extra)[:1])[:300]})")
        lsns = [r[0] for r in spark.table(f"{namespace}{size}.m_pk").select("_commit_lsn")
                .collect()]
        assert all(lsn is not None and lsn > 0 for lsn in lsns)
        # only the last batch's net changes stay staged
        staged = sorted(p.name for p in (tmp_path / f"staging{size}").rglob("*.parquet"))
        assert staged == [f"batch-{merged[-1]}.parquet"], staged


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
    assert statement.startswith(f"CREATE TABLE {refused}.r (`id` int, `v` string, "
                                "`_commit_lsn` bigint, `_lsn` bigint)"), statement
    spark.sql(statement)
    run()  # the batch again, now merged
    expect_target()
    db.execute("ALTER TABLE r ADD COLUMN w int")
    db.execute("UPDATE r SET w = id * 10 WHERE id < 3")
    with pytest.raises(SchemaChangeError, match="missing: w") as added:
        run()
    fixes = str(added.value).split("\n", 1)[1]
    assert fixes == f"ALTER TABLE {refused}.r ADD COLUMNS (`w` int)", fixes
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
