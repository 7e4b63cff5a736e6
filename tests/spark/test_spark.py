"""The Spark ways in, in-process, on each server version: the foreachBatch stream (emitter)
and the ``pgoutput`` data source deliver the same change rows; batches, replays and
acknowledgements; per-table types; the emitter's options.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support.parity_workload import run_parity_workload, setup_parity
from support.spark_fixtures import feed_inserts, spark_session  # noqa: F401  (the fixture "spark")
from support.streamkit import free_port, scrape, wait_for
from support.workload import STREAM_ROWS, create_schema, run_workload

from plugin_framework import LSN
from plugin_framework.framework import CallbackError
from plugin_framework.spark import (
    Checkpoint,
    ForeachBatchStream,
    TableStateWriter,
    change_schema,
    lsn_text,
    read_state,
    split_tables,
)
from plugin_framework.spark.datasource.options import SourceOptions
from plugin_framework.spark.datasource.reader import PgoutputDataSource, PgoutputStreamReader

# Slow: it starts a Spark session (a JVM).
# `pytest -m "not server and not slow"`, the quick in-process suite, leaves it out.
pytestmark = pytest.mark.slow

KEY = ("commit_lsn", "seq")


def _slot(db: Any, name: str) -> str:
    slot = f"{db.dbname}_{name}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,))
    return slot


def _end(db: Any) -> str:
    lsn = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    db.execute("SELECT pg_switch_wal()")
    return lsn


def _confirmed(db: Any, slot: str) -> LSN:
    return LSN(db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                          "WHERE slot_name = %s", (slot,))[0][0])


class Collect:
    """A foreachBatch function keeping every batch's rows (as dicts)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[dict[str, Any]]]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches.append((batch_id, [r.asDict(recursive=True) for r in df.collect()]))

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for _, rows in self.batches for r in rows]


def _comparable(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for r in rows:
        out.append((r["commit_lsn"], r["seq"], r["lsn"], r["xid"], r["op"], r["schema"],
                    r["table"], json.dumps(r["key"], sort_keys=True),
                    json.dumps(r["before"], sort_keys=True),
                    json.dumps(r["after"], sort_keys=True), r["before_json"], r["after_json"],
                    tuple(r["unchanged_toast"]), r["origin"], r["gid"], r["commit_time"]))
    return sorted(out, key=lambda t: (t[0], t[1]))


# --- both ways in, on the shared workload ------------------------------------------------------


@pytest.fixture(scope="module")
def delivered(pg_module_db: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The workload through the emitter (small batches) and both sides of the source."""
    db = pg_module_db
    with db.connect(autocommit=True) as conn:
        create_schema(conn)
        slots = {name: _slot(db, name) for name in ("emitter", "source", "peek")}
        facts = run_workload(conn)
    end = _end(db)
    work = tmp_path_factory.mktemp("delivered")
    emitted = Collect()
    stream = ForeachBatchStream(spark, emitted, dsn=db.conninfo, slot=slots["emitter"],
                                publications=["pub"], checkpoint=str(work / "checkpoint"),
                                max_rows=1000, endpos=end)
    stream.run()

    spark.dataSource.register(PgoutputDataSource)
    before = _confirmed(db, slots["peek"])
    peeked = [r.asDict(recursive=True) for r in spark.read.format("pgoutput")
              .option("dsn", db.conninfo).option("slot", slots["peek"])
              .option("publication", "pub").load().collect()]
    peek_after = _confirmed(db, slots["peek"])

    streamed = Collect()
    query = (spark.readStream.format("pgoutput").option("dsn", db.conninfo)
             .option("slot", slots["source"]).option("publication", "pub")
             .option("maxChangesPerBatch", "2500").load()
             .writeStream.foreachBatch(streamed)
             .option("checkpointLocation", str(work / "spark-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return {"db": db, "facts": facts, "slots": slots, "emitted": emitted, "stream": stream,
            "peeked": peeked, "peek_positions": (before, peek_after), "streamed": streamed,
            "work": work, "end": LSN(end)}


def test_emitter_batches_hold_whole_committed_transactions(delivered: Any) -> None:
    emitted, facts = delivered["emitted"], delivered["facts"]
    ids = [bid for bid, _ in emitted.batches]
    assert ids == list(range(len(ids))) and len(ids) >= 2
    owner: dict[int, int] = {}
    for bid, rows in emitted.batches:
        for r in rows:
            assert owner.setdefault(r["commit_lsn"], bid) == bid, "a transaction was split"
        # a batch closes with the first transaction that takes it to max_rows (1000)
        last = max(r["commit_lsn"] for r in rows)
        assert sum(r["commit_lsn"] != last for r in rows) < 1000
    rows = emitted.rows
    xids = {r["xid"] for r in rows}
    assert facts.xids["stream_abort"] not in xids and facts.xids["2pc_rollback"] not in xids
    assert facts.xids["stream"] in xids and facts.xids["2pc_commit"] in xids
    by_xid: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_xid.setdefault(r["xid"], []).append(r)
    for txn_rows in by_xid.values():
        assert [r["seq"] for r in txn_rows] == list(range(len(txn_rows)))
        assert [r["lsn"] for r in txn_rows] == sorted(r["lsn"] for r in txn_rows)
    # prepared transactions keep their gid, the others have none
    assert {r["gid"] for r in by_xid[facts.xids["2pc_commit"]]} == {"gid-commit"}
    assert {r["gid"] for r in by_xid[facts.xids["2pc_stream"]]} == {"gid-stream"}
    assert {r["gid"] for r in by_xid[facts.xids["insert"]]} == {None}
    # the streamed transaction arrives whole, its rolled back savepoint left out
    bulk = [r for r in by_xid[facts.xids["stream"]] if r["table"] == "bulk"]
    assert len(bulk) == STREAM_ROWS + 1 and all(r["after"]["v"] != "gone" for r in bulk)
    assert {r["origin"] for r in by_xid[facts.xids["origin"]]} == {facts.origin}


def test_change_rows_carry_keys_old_rows_toast_and_typed_json(delivered: Any) -> None:
    rows, facts = delivered["emitted"].rows, delivered["facts"]
    update = [r for r in rows if r["xid"] == facts.xids["update"]]
    renamed, moved, deleted = update
    assert renamed["op"] == "UPDATE" and renamed["before"] is None
    assert renamed["unchanged_toast"] == ["big"] and "big" not in renamed["after"]
    assert renamed["key"] == {"id": "1"} and renamed["after"]["name"] == "uno"
    assert moved["before"] == {"id": "1"} and moved["key"] == {"id": "10"}
    assert json.loads(moved["before_json"]) == {"id": 1}
    assert deleted["op"] == "DELETE" and deleted["after"] is None
    assert deleted["key"] == {"id": "2"} and deleted["before"] == {"id": "2"}
    first = next(r for r in rows if r["xid"] == facts.xids["insert"])
    assert first["after"] == {"id": "1", "name": "one", "price": "1.50", "tags": "{a,b}",
                              "payload": "\\x00ff", "big": "x" * 5000}
    typed = json.loads(first["after_json"])
    assert typed["id"] == 1 and typed["tags"] == ["a", "b"] and typed["price"] == "1.50"
    assert [c["name"] for c in first["columns"]] == ["id", "name", "price", "tags", "payload",
                                                     "big"]
    assert first["columns"][2] == {"name": "price", "type": "numeric(10,2)", "type_oid": 1700,
                                   "key": False}
    full = [r for r in rows if r["xid"] == facts.xids["full"]]
    assert [r["op"] for r in full] == ["INSERT", "INSERT", "UPDATE", "DELETE"]
    # REPLICA IDENTITY FULL: the old row whole, and every column is the key
    assert full[2]["before"] == {"a": "1", "b": "a"} and full[2]["key"] == {"a": "1", "b": "b"}
    truncated = sorted(r["table"] for r in rows if r["op"] == "TRUNCATE")
    assert truncated == ["child", "parent"]


def test_source_stream_and_peek_give_the_emitters_rows(delivered: Any) -> None:
    expected = _comparable(delivered["emitted"].rows)
    assert _comparable(delivered["peeked"]) == expected
    streamed = delivered["streamed"]
    assert _comparable(streamed.rows) == expected
    assert len(streamed.batches) > 1
    # a batch read does not consume
    before, after = delivered["peek_positions"]
    assert before == after


def test_slots_are_acknowledged_after_delivery(delivered: Any) -> None:
    db, slots, stream = delivered["db"], delivered["slots"], delivered["stream"]
    checkpoint = Checkpoint(delivered["work"] / "checkpoint")
    assert checkpoint.pending is None and checkpoint.last_committed is not None
    assert checkpoint.last_committed.batch_id == stream.plugin.batches - 1
    history = checkpoint.history()
    assert [b.batch_id for b in history] == list(range(len(history)))
    for prev, cur in itertools.pairwise(history):
        assert cur.start == prev.end < cur.end
    assert _confirmed(db, slots["emitter"]) >= checkpoint.last_committed.end
    # Spark commits a batch to the source when it plans the next one: all but the last
    assert _confirmed(db, slots["source"]) > _confirmed(db, slots["peek"])


# --- replays, acknowledgement and prepared transactions -----------------------------------------


def test_a_failed_batch_is_delivered_again_with_the_same_id_and_rows(db: Any, spark: Any,
                                                                     tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR ALL TABLES")
    slot = _slot(db, "replay")
    for i in range(7):
        db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(%s::int, %s::int) g",
                   (i * 100 + 1, i * 100 + 100))
    end = _end(db)
    seen: list[tuple[int, list[Any]]] = []

    def failing(df: Any, batch_id: int) -> None:
        seen.append((batch_id, sorted(tuple(r) for r in df.select(*KEY, "after").collect())))
        if batch_id == 1:
            raise RuntimeError("fn failed")

    stream = ForeachBatchStream(spark, failing, dsn=db.conninfo, slot=slot,
                                publications=["p"], checkpoint=str(tmp_path), max_rows=250,
                                endpos=end)
    with pytest.raises(CallbackError, match="fn failed"):
        stream.run()
    assert [b for b, _ in seen] == [0, 1]
    assert _confirmed(db, slot) <= Checkpoint(tmp_path).pending.start  # type: ignore[union-attr]

    again: list[tuple[int, list[Any]]] = []
    ForeachBatchStream(spark, lambda df, i: again.append(
        (i, sorted(tuple(r) for r in df.select(*KEY, "after").collect()))),
        dsn=db.conninfo, slot=slot, publications=["p"], checkpoint=str(tmp_path),
        max_rows=250, endpos=end).run()
    assert again[0] == seen[1]
    assert [b for b, _ in again] == [1, 2]
    ids = [r[0:2] for _, rows in [seen[0], *again] for r in rows]
    assert len(ids) == len(set(ids)) == 700


def test_an_undecided_prepared_transaction_holds_the_slot_back(db: Any, spark: Any,
                                                               tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR ALL TABLES")
    slot = _slot(db, "prepared")
    conn = db.connect(autocommit=True)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (1, 'prepared')")
    conn.execute("PREPARE TRANSACTION 'held'")
    prepare_lsn = LSN(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    db.execute("INSERT INTO t VALUES (2, 'after')")
    end = _end(db)
    state = str(tmp_path / "state")
    got = Collect()

    def run(endpos: str) -> None:
        ForeachBatchStream(spark, got, dsn=db.conninfo, slot=slot, publications=["p"],
                           checkpoint=str(tmp_path / "checkpoint"), max_rows=1, endpos=endpos,
                           sinks=[TableStateWriter(state)]).run()

    run(end)
    assert [(r["after"]["id"], r["gid"]) for r in got.rows] == [("2", None)]
    assert _confirmed(db, slot) <= prepare_lsn  # the PREPARE must come again

    conn.execute("COMMIT PREPARED 'held'")
    db.execute("INSERT INTO t VALUES (3, 'last')")
    run(_end(db))
    assert [(r["after"]["id"], r["gid"]) for r in got.rows] == [
        ("2", None), ("1", "held"), ("3", None)]
    assert [b for b, _ in got.batches] == [0, 1, 2]
    assert sorted(r.id for r in read_state(spark, state, "public.t").collect()) == [1, 2, 3]


def test_a_batch_goes_out_after_max_delay(db: Any, spark: Any, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR ALL TABLES")
    slot = _slot(db, "delay")
    got = Collect()
    arrived = threading.Event()

    def fn(df: Any, batch_id: int) -> None:
        got(df, batch_id)
        arrived.set()

    port = free_port()
    stream = ForeachBatchStream(spark, fn, dsn=db.conninfo, slot=slot, publications=["p"],
                                checkpoint=str(tmp_path), max_rows=1_000_000, max_delay=0.2,
                                metrics_port=port, metrics_address="127.0.0.1")
    stream.start()
    try:
        db.execute("INSERT INTO t VALUES (1), (2), (3)")
        assert arrived.wait(120), "no batch arrived"
        # the Python API serves the stream's metrics too
        metrics = wait_for(lambda: (m := scrape(port)).get("pgdecode_transactions_total")
                           and m, timeout=30, what="the metrics")
        assert metrics["pgdecode_changes_total"] == 3
    finally:
        stream.stop()
        stream.join(120)
    assert [len(rows) for _, rows in got.batches] == [3]
    assert scrape(port) == {}  # no longer served once the stream ends


def test_stream_reader_reads_a_batch_again_after_a_restart(db: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR ALL TABLES")
    slot = _slot(db, "reader")
    conn = db.connect(autocommit=True)
    for i in range(5):
        db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(%s::int, %s::int) g",
                   (i * 10 + 1, i * 10 + 10))
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (100, 'prepared')")
    conn.execute("PREPARE TRANSACTION 'open'")
    db.execute("INSERT INTO t VALUES (101, 'after the prepare')")
    _end(db)
    opts = SourceOptions.parse({"dsn": db.conninfo, "slot": slot, "publication": "p"})

    def rows(parts: Any, reader: PgoutputStreamReader) -> list[tuple[Any, ...]]:
        out = []
        for part in parts:
            for batch in reader.read(part):
                out += list(zip(batch.column("commit_lsn").to_pylist(),
                                batch.column("seq").to_pylist(), strict=True))
        return out

    reader = PgoutputStreamReader(opts)
    start = reader.initialOffset()
    from pyspark.sql.streaming.datasource import ReadMaxRows

    end = reader.latestOffset(start, ReadMaxRows(25))
    first = rows(reader.partitions(start, end), reader)
    # whole transactions, as many as the 25 messages asked for reach (a message a row at
    # first): 2 of 10 rows, each with its BEGIN and COMMIT (and the table's description)
    assert len(first) == 20
    fresh = PgoutputStreamReader(opts)  # as after a restart: nothing cached
    assert rows(fresh.partitions(start, end), fresh) == first
    last = reader.latestOffset(end, ReadMaxRows(1000))
    assert len(rows(reader.partitions(end, last), reader)) == 31
    assert LSN(last["ack"]) < LSN(last["lsn"])  # held back to the undecided PREPARE
    reader.commit(last)
    assert _confirmed(db, slot) == LSN(last["ack"])
    assert reader.latestOffset(last, ReadMaxRows(1000)) == last
    conn.execute("COMMIT PREPARED 'open'")
    _end(db)
    final = reader.latestOffset(last, ReadMaxRows(1000))
    committed = reader.partitions(last, final)
    assert len(rows(committed, reader)) == 1
    gids = [b.column("gid").to_pylist() for p in committed for b in reader.read(p)]
    assert gids == [["open"]]


def test_stream_reader_has_the_server_decode_each_transaction_once(db: Any) -> None:
    """The reader driven as Spark drives it (the next batch planned before the last one is
    committed), in batches of 250 rows over 40 transactions of 100: every row once, and
    the server decodes each transaction once (pg_stat_replication_slots): not again for
    the batch that follows it, nor for the part of a peek a batch did not take."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR ALL TABLES")
    slot = _slot(db, "once")
    for i in range(40):
        db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(%s::int, %s::int) g",
                   (i * 100 + 1, i * 100 + 100))
    _end(db)
    reader = PgoutputStreamReader(SourceOptions.parse(
        {"dsn": db.conninfo, "slot": slot, "publication": "p"}))
    start, seen, committed = reader.initialOffset(), [], None
    while (end := reader.latestOffset(start, ReadMaxRows(250))) != start:
        if committed is not None:
            reader.commit(committed)  # Spark commits the last batch after planning this one
        for part in reader.partitions(start, end):
            for batch in reader.read(part):
                seen += batch.column("after").to_pylist()
        start = committed = end
    assert sorted(int(dict(row)["id"]) for row in seen) == list(range(1, 4001))
    decoded = db.execute("SELECT total_txns FROM pg_stat_replication_slots "
                         "WHERE slot_name = %s", (slot,))[0][0]
    assert 40 <= decoded <= 42, decoded  # (53 when each peek asked for a quarter more)


def test_stream_reader_takes_a_row_limit_past_int4(db: Any) -> None:
    """A peek's message count is an int4: a larger maxChangesPerBatch asks for all."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR ALL TABLES")
    slot = _slot(db, "int4")
    db.execute("INSERT INTO t SELECT generate_series(1, 5)")
    _end(db)
    reader = PgoutputStreamReader(SourceOptions.parse(
        {"dsn": db.conninfo, "slot": slot, "publication": "p"}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(2**40))
    rows = [r for part in reader.partitions(start, end) for b in reader.read(part)
            for r in b.column("after").to_pylist()]
    assert sorted(int(dict(r)["id"]) for r in rows) == [1, 2, 3, 4, 5]


# --- types ----------------------------------------------------------------------------------------


def test_split_tables_gives_real_column_types(db: Any, spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import types as T

    setup_parity(db)
    slot = _slot(db, "types")
    run_parity_workload(db)
    end = _end(db)
    tables: dict[str, Any] = {}

    def fn(df: Any, batch_id: int) -> None:
        for name, typed in split_tables(df).items():
            tables[name] = (typed.schema, typed.collect())

    ForeachBatchStream(spark, fn, dsn=db.conninfo, slot=slot, publications=["parity_pub"],
                       checkpoint=str(tmp_path), max_rows=1_000_000, endpos=end).run()
    schema, rows = tables["public.alltypes"]
    types = {f.name: f.dataType for f in schema.fields}
    assert types["c_int2"] == T.ShortType() and types["c_int4"] == T.IntegerType()
    assert types["c_int8"] == T.LongType() and types["c_bool"] == T.BooleanType()
    assert types["c_numeric_p"] == T.DecimalType(10, 3)
    assert types["c_numeric"] == T.StringType()
    assert types["c_float4"] == T.FloatType() and types["c_float8"] == T.DoubleType()
    assert types["c_bytea"] == T.BinaryType() and types["c_date"] == T.DateType()
    assert types["c_timestamp"] == T.TimestampNTZType()
    assert types["c_timestamptz"] == T.TimestampType()
    assert types["c_int_arr"] == T.ArrayType(T.IntegerType())
    assert types["c_text_arr"] == T.ArrayType(T.StringType())
    assert types["c_uuid"] == T.StringType() and types["c_jsonb"] == T.StringType()
    first = next(r for r in rows if r["_op"] == "INSERT" and r["id"] == 1)
    assert first["c_int4"] == 42 and first["c_int8"] == 9223372036854775807
    assert first["c_bool"] is True and str(first["c_numeric_p"]) == "-1.500"
    assert bytes(first["c_bytea"]) == b"\x00\xff\x10"
    assert first["c_int_arr"] == [1, 2, None, 4]
    assert first["c_text_arr"] == ["a b", "c,d", None, 'e"f']
    assert first["c_numeric"] == "123456789012345678901234567890.123456789"
    assert str(first["c_date"]) == "2024-02-29"
    assert str(first["c_timestamp"]) == "2024-01-02 03:04:05.678000"
    edge = next(r for r in rows if r["_op"] == "INSERT" and r["id"] == 2)
    assert edge["c_date"] is None  # 'infinity'
    assert first["c_int_2d"] is None  # two dimensions do not fit array<int>
    assert edge["c_int_2d"] == [7, 8]
    assert all(v is None for k, v in next(r for r in rows if r["_op"] == "INSERT"
                                          and r["id"] == 3).asDict().items()
               if k.startswith("c_"))
    deleted = next(r for r in rows if r["_op"] == "DELETE")
    assert deleted["id"] == 3 and deleted["c_int4"] is None
    quoted = tables['My Schema.Weird "Table"'][0]
    assert [f.name for f in quoted.fields][-4:] == ["Mixed Case", 'quote"d', "select",
                                                   "spaced name"]


def test_change_schema_and_lsn_text(spark: Any) -> None:
    schema = change_schema()
    assert schema.fieldNames() == ["lsn", "commit_lsn", "seq", "xid", "commit_time", "op",
                                   "schema", "table", "key", "before", "after", "before_json",
                                   "after_json", "unchanged_toast", "columns", "origin", "gid"]
    row = spark.createDataFrame([(0x16B374D848,)], "lsn bigint").select(
        lsn_text("lsn").alias("t")).first()
    assert row.t == "16/B374D848"


# --- the emitter's options and the command line --------------------------------------------------


def test_emitter_options_are_checked(tmp_path: Path) -> None:
    from emitters.spark import SparkEmitter
    from plugin_framework import Pipeline
    from plugin_framework.framework import MemoryOutput

    def start(options: dict[str, str | None], output: Any = None) -> Any:
        emitter = SparkEmitter(spark=object())
        pipeline = Pipeline()
        pipeline.add(emitter, options=options,
                     output=output if output is not None else emitter.make_output())
        pipeline.startup()
        return emitter

    with pytest.raises(CallbackError, match='option "bogus"'):
        start({"bogus": "1"})
    with pytest.raises(CallbackError, match="checkpoint directory is required"):
        start({"foreach-batch": "json:dumps"})
    with pytest.raises(CallbackError, match="cannot be loaded"):
        start({"foreach-batch": "no.such.module:fn", "checkpoint": str(tmp_path)})
    with pytest.raises(CallbackError, match="needs its own output"):
        start({"foreach-batch": "json:dumps", "checkpoint": str(tmp_path)}, MemoryOutput())
    with pytest.raises(CallbackError, match='"max-rows"'):
        start({"max-rows": "0", "checkpoint": str(tmp_path)})
    with pytest.raises(CallbackError, match="go with merge-into"):
        start({"merge-staging": str(tmp_path / "m"), "checkpoint": str(tmp_path)})
    with pytest.raises(CallbackError, match="must name each table"):
        start({"merge-into": "lake.app.t", "checkpoint": str(tmp_path)})
    emitter = start({"foreach-batch": "json:dumps", "checkpoint": str(tmp_path),
                     "max-rows": "5", "max-delay": "1.5", "state-path": str(tmp_path / "s")})
    assert (emitter.max_rows, emitter.max_delay, len(emitter.sinks)) == (5, 1.5, 1)


def test_source_options_are_checked() -> None:
    from plugin_framework.spark.datasource.options import SourceOptionError

    base = {"dsn": "", "slot": "s", "publication": "p"}
    with pytest.raises(SourceOptionError, match="never or initial, not 'always'"):
        SourceOptions.parse({**base, "snapshot": "always"})
    with pytest.raises(SourceOptionError, match=r'needs \.option\("slot"'):
        SourceOptions.parse({"publication": "p"})
    opts = SourceOptions.parse({**base, "snapshot": "Initial", "snapshotChunkRows": "500",
                                "snapshotTables": "public.a, b,"})
    assert (opts.snapshot, opts.snapshot_chunk_rows, opts.snapshot_tables) == \
        ("initial", 500, ("public.a", "b"))


def test_command_line_spark_emitter(db: Any, tmp_path: Path) -> None:
    """``pgdecode stream --emitter spark``: needs the entry point and the CLI giving the
    emitter its own output (see docs/spark.md)."""
    from importlib.metadata import entry_points

    if not any(ep.name == "spark" for ep in entry_points(group="pgdecode.emitters")):
        pytest.skip("the spark emitter's entry point is not installed")
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR ALL TABLES")
    slot = _slot(db, "cli")
    db.execute("INSERT INTO t SELECT generate_series(1, 10)")
    end = _end(db)
    fn = tmp_path / "cli_fn.py"
    out = tmp_path / "out"
    fn.write_text("def fn(df, batch_id):\n"
                  f"    with open({str(out)!r}, 'a') as f:\n"
                  "        f.write(f'{batch_id} {df.count()}\\n')\n")
    env = {"PYTHONPATH": str(tmp_path), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "plugin_framework.cli", "stream", "-d", db.conninfo, "-S", slot,
         "--publication", "p", "--emitter", "spark", "-o", f"checkpoint={tmp_path / 'ck'}",
         "-o", "foreach-batch=cli_fn:fn", "-o", "master=local[1]", "-o",
         "spark-conf=spark.ui.enabled=false", "-E", end, "--status-interval", "1", "-q"],
        env=env, capture_output=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert out.read_text() == "0 10\n"


def test_stream_reader_moves_an_idle_slot_on(db: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int); "
               "CREATE PUBLICATION p FOR TABLE t")
    slot = _slot(db, "idle")
    db.execute("INSERT INTO other SELECT generate_series(1, 1000)")  # not published
    _end(db)
    reader = PgoutputStreamReader(SourceOptions.parse(
        {"dsn": db.conninfo, "slot": slot, "publication": "p", "idleAdvanceBytes": "1"}))
    start = reader.initialOffset()
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    end = reader.latestOffset(start, ReadAllAvailable())
    assert LSN(end["lsn"]) > LSN(start["lsn"]) and end["ack"] == end["lsn"]
    assert reader.partitions(start, end) == []  # an empty batch ...
    reader.commit(end)
    assert _confirmed(db, slot) == LSN(end["lsn"])  # ... that moves the slot on


def test_changelog_writer_replaces_an_interrupted_attempt(spark: Any, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from plugin_framework.spark import ChangeLogWriter

    when = datetime(2024, 5, 1, 12, tzinfo=UTC)
    rows: list[tuple[Any, ...]] = [
        (100 + i, 500, i, 7, when, "INSERT", "public", "t", {"id": str(i)}, None,
         {"id": str(i)}, None, f'{{"id":{i}}}', [], [], None, None) for i in range(3)]
    df = spark.createDataFrame(rows, change_schema())
    log = tmp_path / "log"
    partition = log / "schema=public" / "table=t" / "date=2024-05-01"
    partition.mkdir(parents=True)
    (partition / "part-b000000000004-stale.parquet").write_bytes(b"left by a crash")
    writer = ChangeLogWriter(str(log))
    writer(df, 4)
    writer(df, 4)  # delivered again: recorded, so skipped
    assert not (partition / "part-b000000000004-stale.parquet").exists()
    back = spark.read.parquet(str(log)).collect()
    assert sorted((r.seq, r.batch_id, r.table, str(r.date)) for r in back) == [
        (i, 4, "t", "2024-05-01") for i in range(3)]


def test_dates_and_timestamps_before_year_1_keep_their_value(db: Any, spark: Any,
                                                             tmp_path: Path) -> None:
    """A BC date or timestamp (PostgreSQL's "0044-03-15 BC") is the same instant in Spark,
    scalar or in an array: day and microsecond counts from 1970 compared with the server's."""
    from pyspark.sql import functions as F

    with db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE bc (id int PRIMARY KEY, d date, ts timestamp, "
                     "tz timestamptz, ds date[]); CREATE PUBLICATION bc_pub FOR TABLE bc")
    slot = _slot(db, "bc")
    with db.connect(autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("""INSERT INTO bc VALUES
            (1, '0044-03-15 BC', '0044-03-15 12:34:56.789 BC', '0044-03-15 12:00:00+00 BC',
             ARRAY['0001-12-31 BC', '0001-01-01', '4713-11-24 BC']::date[]),
            (2, '0001-01-01 BC', '0001-12-31 23:59:59.999999 BC', '0001-01-01 00:00:00+00',
             NULL),
            (3, '4713-11-24 BC', '2000-02-29 00:00:01', '1999-12-31 23:59:59.5+00', '{}')""")
    end = _end(db)
    got: dict[int, tuple[Any, ...]] = {}

    def fn(df: Any, batch_id: int) -> None:
        epoch = F.lit("1970-01-01").cast("date")
        for r in split_tables(df)["public.bc"].select(
                "id", F.datediff("d", epoch), F.unix_micros(F.col("ts").cast("timestamp")),
                F.unix_micros("tz"), F.transform("ds", lambda x: F.datediff(x, epoch))).collect():
            got[r[0]] = tuple(r[1:])

    ForeachBatchStream(spark, fn, dsn=db.conninfo, slot=slot, publications=["bc_pub"],
                       checkpoint=str(tmp_path), endpos=end).run()
    expected = {r[0]: tuple(r[1:]) for r in db.execute(
        "SELECT id, d - date '1970-01-01', (extract(epoch FROM ts) * 1000000)::bigint, "
        "(extract(epoch FROM tz) * 1000000)::bigint, "
        "ARRAY(SELECT x - date '1970-01-01' FROM unnest(ds) x) FROM bc")}
    expected[2] = (*expected[2][:3], None)  # a NULL array
    assert got == {k: (*v[:3], None if v[3] is None else list(v[3])) for k, v in expected.items()}


@pytest.mark.parametrize("setting", [None, "10MB"], ids=["unset", "set"])
def test_batch_frames_stay_arrow_and_leave_the_session_conf_as_it_was(
        spark: Any, tmp_path: Path, setting: str | None) -> None:
    """A batch's DataFrame is not converted to rows in the driver when it is made (Spark
    would, under spark.sql.execution.arrow.localRelationThreshold: a LocalRelation): it
    stays Arrow until a job reads it, with the same rows. The session's own setting of that
    threshold is what it was before the batch."""
    import pyarrow as pa

    from plugin_framework.spark import ForeachBatchPlugin

    key = "spark.sql.execution.arrow.localRelationThreshold"
    if setting is not None:
        spark.conf.set(key, setting)
    seen: list[tuple[str, list[Any]]] = []

    def fn(df: Any, batch_id: int) -> None:
        plan = df._jdf.queryExecution().analyzed().getClass().getSimpleName()
        seen.append((plan, sorted(r.after["id"] for r in df.collect())))

    plugin = ForeachBatchPlugin(fn, spark=spark, checkpoint=str(tmp_path / "checkpoint"),
                                max_rows=3)
    try:
        feed_inserts(plugin, [range(3)])
        assert seen == [("LogicalRDD", ["0", "1", "2"])]
        assert spark.conf.get(key, None) == setting
        # the session's own DataFrames from Arrow data are made as it says
        local = spark.createDataFrame(pa.table({"x": [1]}))
        kind = local._jdf.queryExecution().analyzed().getClass().getSimpleName()
        assert kind == "LocalRelation"
    finally:
        spark.conf.unset(key)


def test_a_batch_frame_is_made_in_the_jvm_only_when_something_reads_it(
        spark: Any, tmp_path: Path) -> None:
    """The sinks read the driver's Arrow table, so a batch's DataFrame that only they get
    never goes to the JVM; its schema is known without it. Read by ``fn``, then or after
    the batch, it holds the batch's rows, as a DataFrame made at once from them does."""
    from pyspark.sql import DataFrame

    from plugin_framework.spark import ForeachBatchPlugin
    from plugin_framework.spark.changes.rows import local_rows

    kept: list[Any] = []
    made_by_sinks: list[bool] = []

    def fn(df: Any, batch_id: int) -> None:
        made_by_sinks.append(df.made)
        assert isinstance(df, DataFrame)
        assert df.schema == change_schema() and df.columns == change_schema().names
        assert not df.made  # the schema needed no JVM
        if batch_id == 0:
            eager = spark.createDataFrame(local_rows(df), change_schema())
            assert sorted(df.collect()) == sorted(eager.collect())
            assert df.made
        kept.append(df)
        df.schema.add("mine", "string")  # a caller's change to its own frame's schema

    state = str(tmp_path / "state")
    plugin = ForeachBatchPlugin(fn, spark=spark, checkpoint=str(tmp_path / "checkpoint"),
                                max_rows=3, sinks=[TableStateWriter(state)])
    feed_inserts(plugin, [range(3), range(3, 6)])
    assert made_by_sinks == [False, False]
    assert sorted(r.id for r in read_state(spark, state, "public.t").collect()) == list(range(6))
    # read after its batch: the second frame is made now, from its own rows
    assert [kept[1].made, kept[0].made] == [False, True]
    ids = sorted(int(r.after["id"]) for r in kept[1].union(kept[0]).collect())
    assert ids == list(range(6))


def test_batches_read_by_fn_leave_spark_quiet_at_its_default_log_level(tmp_path: Path) -> None:
    """A batch's rows travel in the tasks of the jobs that read it: over 1 MB, Spark warns
    "contains a task of very large size" for each. The emitter drops that one message at
    Spark's default log level (WARN), in a process of its own (as a user runs it), and
    leaves the logger at that level; the logger's other messages stay."""
    script = tmp_path / "quiet.py"
    script.write_text(f"""
import sys
from pyspark.sql import SparkSession
from support.spark_fixtures import feed_inserts
from plugin_framework.spark import ForeachBatchPlugin

spark = SparkSession.builder.master("local[1]").getOrCreate()
counts = []
plugin = ForeachBatchPlugin(lambda df, i: counts.append(df.filter("op = 'INSERT'").count()),
                            spark=spark, checkpoint={str(tmp_path / "checkpoint")!r},
                            max_rows=20_000)
# 16,000 rows of about 150 bytes: one batch of over 2 MB
feed_inserts(plugin, [range(n, n + 4000) for n in range(0, 16_000, 4000)])
print("counts", counts, file=sys.stderr, flush=True)
tasks = spark._jvm.org.apache.logging.log4j.LogManager.getLogger(
    "org.apache.spark.scheduler.TaskSetManager")
tasks.warn("Stage 9 contains a task of very large size (2000 KiB)")
tasks.warn("another warning of the logger")
spark.stop()
""")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]),
           "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    quiet, _, chatty = done.stderr.partition("counts [16000]")
    assert chatty, done.stderr[-3000:]
    assert "very large size" not in done.stderr, quiet[-2000:]
    assert "INFO TaskSetManager" not in quiet, quiet[-2000:]  # WARN, as the logger had
    assert "another warning of the logger" in chatty, chatty[-2000:]  # the logger speaks


def test_a_lazy_frame_is_made_once_whichever_threads_read_it(spark: Any) -> None:
    """Two threads reading a batch's frame at once make it in the JVM once, and both read
    that one; a failure to make it says so (not pyspark's "no attribute _jdf")."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    from plugin_framework.spark.foreachbatch.lazyframe import LazyFrame

    table = pa.table({"x": list(range(5))})
    schema = spark.createDataFrame(table).schema
    made = []

    def make() -> Any:
        made.append(1)
        time.sleep(0.3)  # the other thread comes in meanwhile
        return spark.createDataFrame(table)

    df = LazyFrame(make, spark, schema)
    with ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(lambda _: df.filter("x > 1").count(), range(2)))
    assert counts == [3, 3] and len(made) == 1

    def broken() -> Any:
        return None  # None._jdf: an AttributeError inside the making

    with pytest.raises(RuntimeError, match="the batch's DataFrame was not made"):
        LazyFrame(broken, spark, schema).count()


@pytest.mark.parametrize("way", ["source", "emitter"])
def test_a_new_query_into_a_target_of_another_is_refused_not_skipped(
        db: Any, spark: Any, tmp_path: Path, way: str) -> None:
    """Batch ids are a query's own: a second query (a new checkpoint) numbers its batches
    from 0 again. Each sink, finding a batch id its target holds already from another
    query, fails naming both instead of skipping the batch (which would lose its rows);
    the same query's batches go on as before."""
    from plugin_framework.spark import (
        ChangeLogWriter,
        DeltaTableWriter,
        HistoryWriter,
        OtherQueryError,
    )
    from plugin_framework.spark.mirrors.deltatables import read_delta

    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t")
    slot = _slot(db, f"owner_{way}")
    sinks = {"state": TableStateWriter(str(tmp_path / "state")),
             "delta": DeltaTableWriter(str(tmp_path / "delta")),
             "history": HistoryWriter(str(tmp_path / "history")),
             "log": ChangeLogWriter(str(tmp_path / "log"))}
    errors: dict[str, list[str]] = {name: [] for name in sinks}

    def fn(df: Any, batch_id: int) -> None:
        for name, sink in sinks.items():
            try:
                sink(df, batch_id)
            except OtherQueryError as exc:
                errors[name].append(str(exc))

    def run(checkpoint: str) -> None:
        end = _end(db)
        if way == "emitter":
            ForeachBatchStream(spark, fn, dsn=db.conninfo, slot=slot, publications=["p"],
                               checkpoint=str(tmp_path / checkpoint), endpos=end).run()
            return
        spark.dataSource.register(PgoutputDataSource)
        (spark.readStream.format("pgoutput").option("dsn", db.conninfo).option("slot", slot)
         .option("publication", "p").load().writeStream.foreachBatch(fn)
         .option("checkpointLocation", str(tmp_path / checkpoint))
         .trigger(availableNow=True).start().awaitTermination(300))

    db.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 50) g")
    run("first")
    db.execute("INSERT INTO t SELECT g, 'b' FROM generate_series(51, 60) g")
    run("first")  # the same query again: its next batch ids
    assert errors == {name: [] for name in sinks}
    db.execute("INSERT INTO t SELECT g, 'c' FROM generate_series(61, 70) g")
    run("second")
    for name, messages in errors.items():
        assert messages and "numbers its batches from 0 again" in messages[0], (name, errors)
    held = sorted(r["id"] for r in read_delta(str(tmp_path / "delta"), "public.t")
                  .to_pyarrow_table().to_pylist())
    assert held == list(range(1, 61))  # the second query's rows are not in it


def test_the_first_batch_starts_every_table_whatever_its_row_limit(db: Any) -> None:
    """The TRUNCATE rows that start the snapshot's tables (start_tables) all go into the
    first batch, however few rows a batch may take, before the stream's changes."""
    from plugin_framework.spark.datasource.peek import decode_slot

    db.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY); "
               "CREATE PUBLICATION p FOR TABLE a, b")
    slot = _slot(db, "starts")
    db.execute("INSERT INTO a VALUES (1)")
    _end(db)
    opts = SourceOptions.parse({"dsn": db.conninfo, "slot": slot, "publication": "p"})
    start = LSN(db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                           "WHERE slot_name = %s", (slot,))[0][0])
    decoded = decode_slot(opts, start, limit=1, starts=["public.a", "public.b"])
    assert decoded.table is not None
    rows = sorted(zip(decoded.table.column("commit_lsn").to_pylist(),
                      decoded.table.column("seq").to_pylist(),
                      decoded.table.column("table").to_pylist(),
                      decoded.table.column("op").to_pylist(), strict=True))
    assert [(t, op) for _, _, t, op in rows] == [("a", "TRUNCATE"), ("b", "TRUNCATE"),
                                                 ("a", "INSERT")]
    assert not decoded.snapshot_taken


def test_a_replayed_batch_of_one_writer_is_not_taken_for_another_query_s(
        spark: Any, tmp_path: Path) -> None:
    """Two writers (app ids) of one Delta table, each its own query: a batch the first
    writes again after the second committed is its own, skipped; another query's batch id
    is refused. The change log tells its batches' queries apart batch by batch."""
    from datetime import UTC, datetime

    from plugin_framework.spark import ChangeLogWriter, DeltaTableWriter, OtherQueryError

    when = datetime(2024, 5, 1, 12, tzinfo=UTC)
    columns = [("id", "integer", 23, True)]
    rows: list[tuple[Any, ...]] = [
        (100 + i, 500, i, 7, when, "INSERT", "public", "t", {"id": str(i)}, None,
         {"id": str(i)}, None, f'{{"id":{i}}}', [], columns, None, None) for i in range(3)]
    df = spark.createDataFrame(rows, change_schema())
    context = spark.sparkContext
    first = DeltaTableWriter(str(tmp_path / "delta"), app_id="a")
    second = DeltaTableWriter(str(tmp_path / "delta"), app_id="b")
    log = ChangeLogWriter(str(tmp_path / "log"))
    try:
        context.setLocalProperty("sql.streaming.queryId", "query-a")
        first(df, 100)
        log(df, 0)
        context.setLocalProperty("sql.streaming.queryId", "query-b")
        second(df, 7)
        log(df, 5)
        context.setLocalProperty("sql.streaming.queryId", "query-a")
        first(df, 100)  # delivered again after a crash: skipped, not refused
        log(df, 0)
        context.setLocalProperty("sql.streaming.queryId", "query-c")
        with pytest.raises(OtherQueryError, match="query-a"):
            first(df, 3)
        with pytest.raises(OtherQueryError, match="query-b"):
            log(df, 5)
        context.setLocalProperty("sql.streaming.queryId", "query-b")
        with pytest.raises(OtherQueryError, match="query-a"):
            log(df, 0)  # (each batch its own query: not any query that wrote the log)
    finally:
        context.setLocalProperty("sql.streaming.queryId", None)
