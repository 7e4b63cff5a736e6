"""Fixtures and helpers for the Spark tests: one local SparkSession per test session, a
workload of about 20,000 changes, comparisons of Parquet state with the source tables, and a
pipeline runner to start (and kill) as a subprocess:

    PYTHONPATH=tests python tests/support/spark_fixtures.py emitter|source --dsn ... \\
        --slot ... --work DIR [--kill-at BATCH_ID]

The foreachBatch function writes the change log, the Parquet state, the Delta state and the
Delta history. With
``--kill-at N`` it does so in batch N up to the Delta state of the first table, then touches
``DIR/killme`` and sleeps: the test kills the process group with SIGKILL there, in the
middle of the batch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PUBLICATION = "spark_pub"
TABLES = ("public.accounts", "public.ledger", "public.scratch", "public.fulltab")
KEYS = {"public.accounts": ("id",), "public.ledger": ("id",), "public.scratch": ("id",),
        "public.fulltab": ("a", "b")}

SCHEMA = f"""
CREATE TABLE accounts (id integer PRIMARY KEY, owner text, balance numeric(12,2),
    tags text[], scores integer[], photo bytea, opened timestamp, seen timestamptz,
    active boolean, note jsonb, big text);
ALTER TABLE accounts ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE ledger (id bigint PRIMARY KEY, account integer, amount numeric(12,2),
    at timestamptz, memo varchar(40));
CREATE TABLE scratch (id integer PRIMARY KEY, v text);
CREATE TABLE fulltab (a integer, b text);
ALTER TABLE fulltab REPLICA IDENTITY FULL;
CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES;
"""

ACCOUNT_ROWS = """
INSERT INTO accounts
SELECT g, 'owner ' || g, (g * 7 %% 10000) / 100.0, ARRAY['t' || g %% 5, 'x,y'],
       ARRAY[g %% 3, NULL, g], decode(md5(g::text), 'hex'),
       timestamp '2024-01-01 00:00' + g * interval '1 minute',
       timestamptz '2024-01-01 00:00+00' + g * interval '90 seconds', g %% 2 = 0,
       jsonb_build_object('g', g, 'tag', 'n' || g),
       CASE WHEN g %% 5 = 1 THEN repeat(md5(g::text), 120) END
FROM generate_series(%s::int, %s::int) g
"""

LEDGER_ROWS = """
INSERT INTO ledger
SELECT g, g %% 4000 + 1, (g %% 997) / 10.0, timestamptz '2024-02-01 00:00+00' + g * interval '1 s',
       'memo ' || g
FROM generate_series(%s::bigint, %s::bigint) g
"""


def run_big_workload(conn: Any) -> dict[str, int]:
    """About 20,000 changes: inserts, updates (some leaving TOAST unchanged), key-changing
    updates, deletes, TRUNCATE, a committed and a rolled-back prepared transaction (both
    undecided while other transactions commit), and a large streamed transaction. Returns
    the number of changes each kind of statement made (informative)."""
    ex = conn.execute
    ex("SET synchronous_commit = on")
    counts: dict[str, int] = {}
    for first in range(1, 4001, 500):
        ex(ACCOUNT_ROWS, (first, first + 499))
    counts["accounts inserts"] = 4000
    for first in range(1, 6001, 1000):
        ex(LEDGER_ROWS, (first, first + 999))
    counts["ledger inserts"] = 6000

    ex("BEGIN")
    ex(ACCOUNT_ROWS, (4001, 4100))
    ex("UPDATE ledger SET amount = amount + 100 WHERE id <= 50 AND id % 4 <> 0")
    ex("PREPARE TRANSACTION 'spark-commit'")
    ex("BEGIN")
    ex(ACCOUNT_ROWS, (5001, 5050))
    ex("DELETE FROM ledger WHERE id BETWEEN 100 AND 150 AND id % 4 = 1")
    ex("PREPARE TRANSACTION 'spark-rollback'")

    ex("UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0")  # big stays TOASTed
    ex("UPDATE accounts SET id = id + 10000 WHERE id % 10 = 1")  # key change, some TOASTed
    ex("DELETE FROM ledger WHERE id % 4 = 0")
    ex("INSERT INTO scratch SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    ex("BEGIN")
    ex("TRUNCATE scratch")
    ex("INSERT INTO scratch SELECT g, 'w' || g FROM generate_series(1, 300) g")
    ex("COMMIT")
    ex("INSERT INTO scratch SELECT g, 'z' || g FROM generate_series(301, 500) g")
    ex("INSERT INTO fulltab SELECT g, 'b' || g FROM generate_series(1, 300) g")
    ex("UPDATE fulltab SET b = b || 'x' WHERE a <= 100")
    ex("DELETE FROM fulltab WHERE a > 250")

    ex("BEGIN")  # large: streamed (logical_decoding_work_mem = 64kB)
    ex(LEDGER_ROWS, (6001, 9000))
    ex("UPDATE accounts SET note = note || '{\"streamed\": true}' WHERE id BETWEEN 100 AND 600")
    ex("SAVEPOINT s1")
    ex("DELETE FROM ledger WHERE id > 8000")
    ex("ROLLBACK TO SAVEPOINT s1")
    ex("COMMIT")

    ex("COMMIT PREPARED 'spark-commit'")
    ex("ROLLBACK PREPARED 'spark-rollback'")
    ex("UPDATE accounts SET active = NOT active, photo = NULL WHERE id % 7 = 0")
    ex("UPDATE ledger SET memo = NULL, at = NULL WHERE id % 9 = 0")
    return counts


def setup_big(db: Any, slots: tuple[str, ...]) -> None:
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
    for slot in slots:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (slot,))


def end_lsn(db: Any) -> str:
    """A position past everything the workload did (flushed)."""
    row = db.execute("SELECT pg_current_wal_insert_lsn()::text")
    db.execute("SELECT pg_switch_wal()")
    return str(row[0][0])


# --- comparing Parquet state with the tables ---------------------------------------------------


def _norm(value: Any) -> Any:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, decimal.Decimal):
        return value.normalize()
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, list):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _norm(v)) for k, v in value.items()))
    return value


def table_rows(db: Any, table: str) -> Counter[tuple[Any, ...]]:
    """The table as SELECT shows it, equal rows counted: text for json and for numeric
    without a precision (Spark holds it as a string, every digit kept: docs/spark.md),
    dates as days and timestamps as microseconds from 1970 (``epoch_numbers``), infinite
    ones NULL (the documented policy), the rest in psycopg's Python types."""
    cols = [r[0] for r in db.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (table,))]
    types = dict(db.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0", (table,)))

    def value(column: str) -> str:
        kind = types[column]
        if kind in ("jsonb", "json", "numeric"):
            return f"{column}::text"
        if kind.startswith("timestamp"):
            return (f"CASE WHEN isfinite({column}) "
                    f"THEN (extract(epoch FROM {column}) * 1000000)::bigint END")
        if kind == "date":
            return f"CASE WHEN isfinite({column}) THEN {column} - date '1970-01-01' END"
        return column

    select = ", ".join(value(c) for c in cols)
    return Counter(tuple(_norm(v) for v in row)
                   for row in db.execute(f"SELECT {select} FROM {table}"))


def epoch_numbers(table: Any) -> Any:
    """An Arrow table with its dates as days and its timestamps as microseconds from 1970,
    as ``table_rows`` gives them: Python's datetime has no year before 1, which PostgreSQL
    and Spark both have."""
    import pyarrow as pa

    columns = []
    for column in table.columns:
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64())
        elif pa.types.is_date32(column.type):
            column = column.cast(pa.int32())
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def arrow_rows(table: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    """``columns`` of each row of an Arrow table, as ``table_rows`` gives them."""
    data = epoch_numbers(table.select(columns)).to_pylist()
    return [tuple(_norm(row[c]) for c in columns) for row in data]


def state_rows(spark: Any, path: str, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """``TableStateWriter``'s state of a table, read by Spark (``spark`` None: by pyarrow,
    the files its manifest lists)."""
    from plugin_framework.spark import read_state
    from plugin_framework.spark.mirrors.statefiles import StateFiles

    if spark is not None:
        return arrow_rows(read_state(spark, path, table).select(*columns).toArrow(), columns)
    files = StateFiles.at(path, table)
    manifest = files.recover()
    assert manifest is not None, f"no state of {table} under {path}"
    return arrow_rows(files.read(list(manifest.files)), columns)


def table_columns(db: Any, table: str) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (table,))]


def delta_rows(path: str, table: str, columns: list[str],
               history: bool = False) -> list[tuple[Any, ...]]:
    """``DeltaTableWriter``'s state of a table (``history``: the current versions of
    ``HistoryWriter``'s), as deltalake reads it (no Spark)."""
    from plugin_framework.spark import read_delta
    from plugin_framework.spark.mirrors.deltatables import delta_arrow

    data = delta_arrow(read_delta(path, table))
    if history:
        data = data.filter(data.column("_is_current"))
    return arrow_rows(data, columns)


def assert_state_equals_tables(spark: Any, db: Any, path: str, *, delta: bool = False,
                               history: bool = False) -> None:
    """The state at ``path`` (Parquet; ``delta``: Delta; ``history``: the current versions
    of a Delta history) equals the tables."""
    for table in TABLES:
        columns = table_columns(db, table)
        rows = delta_rows(path, table, columns, history) if delta or history else \
            state_rows(spark, path, table, columns)
        expected = table_rows(db, table)
        missing, extra = expected - Counter(rows), Counter(rows) - expected
        assert not missing and not extra, (
            f"{table}: {len(missing)} rows missing from the state (e.g. {sorted(missing)[:2]}), "
            f"{len(extra)} unexpected (e.g. {sorted(extra)[:2]})")


def expected_changes(db: Any, slot: str,
                     publication: str = PUBLICATION) -> dict[tuple[int, int], str]:
    """(commit_lsn, seq) -> "op schema.table" of every change a slot holds, decoded by a
    minimal plugin of its own (not the Spark code under test)."""
    from plugin_framework import LSN, MemoryOutput, OutputPlugin, Pipeline

    class Changes(OutputPlugin):
        def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
            self.rows: dict[tuple[int, int], str] = {}
            self.txn: list[str] = []

        def begin(self, ctx: Any, txn: Any) -> None:
            self.txn = []

        def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
            self.txn.append(f"{change.action} {relation.qualified_name}")

        def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
            self.txn += [f"TRUNCATE {r.qualified_name}" for r in relations]

        def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
            for seq, what in enumerate(self.txn):
                self.rows[(int(commit_lsn), seq)] = what

    proto = 4 if db.major_version >= 16 else 3
    plugin = Changes()
    pipeline = Pipeline(proto_version=proto)
    pipeline.add(plugin, output=MemoryOutput())
    pipeline.startup()
    options = ["proto_version", str(proto), "publication_names", publication,
               "streaming", "on" if proto >= 4 else "true"]
    for lsn, data in db.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "VARIADIC %s::text[])", (slot, options)):
        pipeline.feed(bytes(data), LSN(lsn))
    return plugin.rows


def changelog_rows(spark: Any, path: str) -> list[tuple[int, int, str, int]]:
    """(commit_lsn, seq, "op schema.table", batch_id) of every row of a change log, read by
    Spark (``spark`` None: by pyarrow, its partitions as Hive's)."""
    if spark is None:
        import pyarrow.dataset as ds

        data = ds.dataset(path, format="parquet", partitioning="hive").to_table(
            columns=["commit_lsn", "seq", "op", "schema", "table", "batch_id"]).to_pylist()
        return [(r["commit_lsn"], r["seq"], f"{r['op']} {r['schema']}.{r['table']}",
                 r["batch_id"]) for r in data]
    rows = spark.read.parquet(path).selectExpr(
        "commit_lsn", "seq", "concat(op, ' ', schema, '.', `table`)", "batch_id").collect()
    return [(int(r[0]), int(r[1]), str(r[2]), int(r[3])) for r in rows]


def assert_changelog_complete(spark: Any, db: Any, path: str, ref_slot: str,
                              publication: str = PUBLICATION) -> None:
    """The change log holds each change of ``ref_slot`` (a slot made with the one it was
    written from) once; besides them, only the rows the mirrors had read again (after an
    ALTER TABLE: SNAPSHOT rows, which the slot does not have)."""
    expected = expected_changes(db, ref_slot, publication)
    rows = changelog_rows(spark, path)
    seen: dict[tuple[int, int], str] = {}
    for commit_lsn, seq, what, _ in rows:
        if what.startswith("SNAPSHOT ") and (commit_lsn, seq) not in expected:
            continue
        assert (commit_lsn, seq) not in seen, f"change {commit_lsn}/{seq} logged twice"
        seen[(commit_lsn, seq)] = what
    assert seen == expected


# --- the session ----------------------------------------------------------------------------


def spark_env() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def new_session(app: str = "pgdecode-tests") -> Any:
    spark_env()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             # one JVM takes every Spark test of a worker: its heap fills up as they go
             .config("spark.driver.memory", "2g")
             # short-lived JVMs: C1 only starts and warms up much faster. A driver out of
             # memory leaves Spark's scheduler hanging: exit instead, so that the test says
             .config("spark.driver.extraJavaOptions",
                     "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.fixture(scope="session", name="spark")
def spark_session() -> Iterator[Any]:
    """One local SparkSession for the whole test session (import this into a test module
    and ask for ``spark``)."""
    session = new_session()
    yield session
    session.stop()


# --- the subprocess runner --------------------------------------------------------------------


def _batch_function(work: Path, kill_at: int | None) -> Any:
    from plugin_framework.spark import (
        ChangeLogWriter,
        DeltaTableWriter,
        HistoryWriter,
        TableStateWriter,
    )

    def applied(table: str, batch_id: int) -> None:
        if batch_id == kill_at:
            (work / "killme").touch()
            time.sleep(600)  # killed here, in the middle of the batch

    log = ChangeLogWriter(str(work / "log"))
    state = TableStateWriter(str(work / "state"))
    delta = DeltaTableWriter(str(work / "delta"), on_table=applied)
    history = HistoryWriter(str(work / "history"))
    batches = work / "batches"

    def fn(df: Any, batch_id: int) -> None:
        with open(batches, "a") as f:
            f.write(f"{batch_id}\n")
        started = time.monotonic()
        log(df, batch_id)
        logged = time.monotonic()
        state(df, batch_id)
        stated = time.monotonic()
        delta(df, batch_id)
        delta_done = time.monotonic()
        history(df, batch_id)
        print(f"batch {batch_id}: change log {logged - started:.1f} s, state "
              f"{stated - logged:.1f} s, delta {delta_done - stated:.1f} s, history "
              f"{time.monotonic() - delta_done:.1f} s", flush=True)

    return fn


def run_pipeline(args: argparse.Namespace) -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    work = Path(args.work)
    started = time.monotonic()
    spark = new_session(f"pgdecode-{args.way}")
    print(f"spark session in {time.monotonic() - started:.1f} s", flush=True)
    fn = _batch_function(work, args.kill_at)
    if args.way == "emitter":
        from plugin_framework.spark import ForeachBatchStream

        ForeachBatchStream(spark, fn, dsn=args.dsn, slot=args.slot,
                           publications=[args.publication],
                           checkpoint=str(work / "checkpoint"),
                           max_rows=args.max_rows, endpos=args.endpos).run()
    else:
        from plugin_framework.spark.datasource.reader import PgoutputDataSource

        spark.dataSource.register(PgoutputDataSource)
        query = (spark.readStream.format("pgoutput").option("dsn", args.dsn)
                 .option("slot", args.slot).option("publication", args.publication)
                 .option("maxChangesPerBatch", str(args.max_rows)).load()
                 .writeStream.foreachBatch(fn)
                 .option("checkpointLocation", str(work / "spark-checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    (work / "done").touch()
    spark.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("way", choices=("emitter", "source"))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--endpos")
    parser.add_argument("--max-rows", type=int, default=12000)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--publication", default=PUBLICATION)
    run_pipeline(parser.parse_args(argv))


if __name__ == "__main__":
    main()


def feed_inserts(plugin: Any, transactions: list[range]) -> None:
    """Run ``plugin`` over hand-made transactions of inserts into public.t (id int4, the
    key), one transaction per range of ids, then shut it down."""
    from plugin_framework import LSN, Pipeline
    from plugin_framework.protocol import (
        Begin,
        Commit,
        Insert,
        RelationColumn,
        RelationMessage,
        TupleData,
        encode,
    )
    from support.native import WHEN

    relation = RelationMessage(16400, "public", "t", "d", (RelationColumn(True, "id", 23, -1),))
    messages = [encode(relation)]
    for n, ids in enumerate(transactions):
        end = LSN(0x3000000 + 0x1000 * n)
        messages += [encode(Begin(end, WHEN, 900 + n)),
                     *(encode(Insert(16400, TupleData(b"t", (str(i).encode(),)))) for i in ids),
                     encode(Commit(end, LSN(end + 0x100), WHEN))]
    pipeline = Pipeline(proto_version=1)
    pipeline.add(plugin, output=plugin.make_output())
    pipeline.startup()
    for i, data in enumerate(messages):
        pipeline.feed(data, LSN(0x2000000 + i))
    pipeline.shutdown()
