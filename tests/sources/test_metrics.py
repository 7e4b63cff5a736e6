"""``pgdecode stream --metrics-port``, scraped over HTTP as Prometheus would, on each server
version: while the server streams a large transaction that is still open, the transaction
spills to disk and the spill metric shows it; after the commit the stream catches up, the
lag falls to 0, the spill file is gone, and the counters and the slot's metrics say what
happened, and the changes delivered by table and op leave out a transaction and a
subtransaction rolled back."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from support.spark_fixtures import spark_session  # noqa: F401  (the fixture "spark")
from support.streamkit import free_port, scrape, start_cli, stop_process, wait_for

ROWS = 20_000


def test_metrics_show_spill_lag_and_the_slot(db: Any, tmp_path: Path) -> None:
    slot = f"{db.dbname}_metrics"
    db.execute("CREATE TABLE m (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE gone (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION metrics_pub FOR TABLE m, gone")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    port = free_port()
    # the walsender streams transactions past 64 kB; pgdecode keeps 1 MB in memory
    conninfo = f"{db.conninfo} options='-c logical_decoding_work_mem=64kB'"
    log = tmp_path / "stream.log"
    proc = start_cli(["stream", "-d", conninfo, "-S", slot, "--publication", "metrics_pub",
                      "--emitter", "json", "-f", str(tmp_path / "out.jsonl"),
                      "--memory-limit", "1", "--status-interval", "0.5",
                      "--metrics-port", str(port), "--metrics-address", "127.0.0.1"],
                     stderr_path=log)
    try:
        first = wait_for(lambda: scrape(port).get("pgdecode_connected") == 1 and scrape(port),
                         timeout=60, what="the metrics endpoint")
        assert first["pgdecode_changes_total"] == 0
        assert first["pgdecode_slot_wal_status{status=reserved}"] == 1
        with db.connect() as conn:
            conn.execute("INSERT INTO m SELECT g, repeat('v', 200) FROM generate_series(1, %s) g",
                         (ROWS,))
            spilled = wait_for(lambda: scrape(port).get("pgdecode_spill_bytes", 0) > 1 << 20
                               and scrape(port), timeout=60, interval=0.2,
                               what="the open transaction to spill")
            assert spilled["pgdecode_changes_total"] > 0  # of the open transaction
            assert not any(k.startswith("pgdecode_table_changes_total") for k in spilled)
            conn.commit()
            # a streamed transaction rolled back: received, never delivered
            conn.execute("INSERT INTO m SELECT g, repeat('r', 200) FROM generate_series(%s, %s) g",
                         (ROWS + 1, 2 * ROWS))
            conn.rollback()
            # a streamed subtransaction rolled back: neither
            conn.execute("SAVEPOINT s")
            conn.execute("INSERT INTO m SELECT g, repeat('s', 200) FROM generate_series(%s, %s) g",
                         (2 * ROWS + 1, 2 * ROWS + 5000))
            conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("UPDATE m SET v = 'u' WHERE id <= 10")
            conn.execute("DELETE FROM m WHERE id > %s", (ROWS - 5,))
            conn.execute("TRUNCATE gone")
            conn.commit()
        end = int(db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])

        def caught_up() -> dict[str, float] | None:
            m = scrape(port)
            done = m.get("pgdecode_acknowledged_lsn", 0) >= end and m["pgdecode_lag_bytes"] == 0
            return m if done else None

        final = wait_for(caught_up, timeout=60, interval=0.2, what="the stream to catch up")
        assert final["pgdecode_lag_seconds"] == 0
        assert final["pgdecode_spill_bytes"] == 0
        assert final["pgdecode_spilled_bytes_total"] >= spilled["pgdecode_spill_bytes"]
        # the rolled back transaction's changes streamed before its ROLLBACK are received too
        # (PostgreSQL 17 and later do not stream a transaction they know was rolled back)
        assert ROWS + 15 <= final["pgdecode_changes_total"] <= 2 * ROWS + 5015
        delivered = {k: v for k, v in final.items() if k.startswith("pgdecode_table_changes")}
        assert delivered == {
            f"pgdecode_table_changes_total{{op={op},schema=public,table=m}}": n
            for op, n in (("insert", ROWS), ("update", 10), ("delete", 5))} | {
            "pgdecode_table_changes_total{op=truncate,schema=public,table=gone}": 1}
        assert final["pgdecode_transactions_total"] >= 1
        assert final["pgdecode_received_bytes_total"] > ROWS * 200
        assert final["pgdecode_prepared_transactions"] == 0
        assert final["pgdecode_reconnects_total"] == 0
        assert "pgdecode_slot_retained_bytes" in final
    finally:
        assert stop_process(proc, signal.SIGTERM) == 0, log.read_text()[-2000:]
    assert (tmp_path / "out.jsonl").read_text().count('{"op":"insert"') == ROWS


def test_the_spark_data_source_serves_metrics_while_its_query_runs(
        db: Any, spark: Any, tmp_path: Path) -> None:
    from plugin_framework.spark import PgoutputDataSource

    slot = f"{db.dbname}_source_metrics"
    db.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION source_pub FOR TABLE s")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,))
    spark.dataSource.register(PgoutputDataSource)
    port = free_port()
    rows: list[int] = []
    query = (spark.readStream.format("pgoutput").option("dsn", db.conninfo)
             .option("slot", slot).option("publication", "source_pub")
             .option("metricsPort", str(port)).option("metricsAddress", "127.0.0.1").load()
             .writeStream.foreachBatch(lambda df, _: rows.append(df.count()))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="1 second").start())
    try:
        db.execute("INSERT INTO s SELECT g, 'v' FROM generate_series(1, 50) g")
        db.execute("UPDATE s SET v = 'w' WHERE id <= 5")
        db.execute("DELETE FROM s WHERE id = 50")
        final = wait_for(lambda: sum(rows) == 56 and scrape(port), timeout=120, interval=0.5,
                         what="the three transactions' batches")
        assert final["pgdecode_changes_total"] == 56
        assert {k: v for k, v in final.items() if k.startswith("pgdecode_table_changes")} == {
            f"pgdecode_table_changes_total{{op={op},schema=public,table=s}}": n
            for op, n in (("insert", 50), ("update", 5), ("delete", 1))}
        assert final["pgdecode_batches_total"] >= 1
        confirmed = int(db.execute("SELECT confirmed_flush_lsn - '0/0' FROM "
                                   "pg_replication_slots WHERE slot_name = %s", (slot,))[0][0])
        assert final["pgdecode_acknowledged_lsn"] == confirmed
        assert final["pgdecode_slot_wal_status{status=reserved}"] == 1
    finally:
        query.stop()
    assert scrape(port) == {}  # served by the query's reader, and gone with it
