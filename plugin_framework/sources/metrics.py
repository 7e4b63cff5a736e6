"""Prometheus metrics of a running stream (``pgdecode stream --metrics-port PORT``), served
by prometheus-client's HTTP server at ``/metrics`` (docs/operations.md lists them).

Nothing is counted on the way of a change beyond the pipeline's own counters: the
collector reads the source's progress and the pipeline's counters when it is scraped, and
the slot's row of pg_replication_slots that the source's SlotMonitor (monitor.py) polled
over an ordinary connection, at most every 10 seconds, so that a busy scraper does not load
the server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from plugin_framework.sources.monitor import NEAR_LIMIT

__all__ = ["StreamCollector", "serve_metrics"]

_WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


class StreamCollector:
    """A prometheus-client collector of one source (a WalsenderSource or SqlSource: its
    ``progress``, ``pipeline``, ``config`` and ``monitor``)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        source = self.source
        progress, pipeline = source.progress, source.pipeline
        slot = source.config.slot
        label = ["slot"]

        def counter(name: str, text: str, value: float) -> Any:
            metric = CounterMetricFamily(f"pgdecode_{name}", text, labels=label)
            metric.add_metric([slot], value)
            return metric

        def gauge(name: str, text: str, value: float) -> Any:
            metric = GaugeMetricFamily(f"pgdecode_{name}", text, labels=label)
            metric.add_metric([slot], value)
            return metric

        lag = progress.lag_bytes
        last = pipeline.last_commit_time
        lag_seconds = 0.0 if lag == 0 or last is None else max(0.0, time.time() - last.timestamp())
        budget = pipeline.budget
        yield counter("transactions", "transactions delivered (any outcome)",
                      pipeline.transactions)
        yield counter("changes", "row changes received", pipeline.changes)
        yield counter("received_bytes", "bytes of replication messages received",
                      progress.bytes)
        yield counter("reconnects", "reconnections after a lost connection",
                      progress.reconnects)
        yield gauge("connected", "1 while connected to the server", int(progress.connected))
        yield gauge("received_lsn", "the WAL position received, in bytes",
                    int(progress.received))
        yield gauge("acknowledged_lsn", "the WAL position acknowledged to the server, in bytes",
                    int(progress.acked))
        yield gauge("lag_bytes", "the server's WAL end minus the position acknowledged", lag)
        yield gauge("lag_seconds", "seconds since the commit of the last transaction "
                    "delivered, while the acknowledged position is behind (else 0)", lag_seconds)
        yield gauge("spill_bytes", "bytes of transactions spilled to disk now", budget.on_disk)
        yield counter("spilled_bytes", "bytes of transactions spilled to disk",
                      budget.spilled_bytes)
        yield gauge("prepared_transactions", "prepared transactions held, awaiting their "
                    "outcome", pipeline.prepared_held)
        tables = CounterMetricFamily(
            "pgdecode_table_changes", "row changes of committed transactions delivered, and "
            "TRUNCATEs, by table and op (insert, update, delete, truncate, snapshot)",
            labels=["slot", "schema", "table", "op"])
        for (schema, table, op), n in sorted(pipeline.delivered.copy().items()):
            tables.add_metric([slot, schema, table, op], n)
        yield tables
        snapshot = progress.snapshot
        if snapshot is not None:
            yield gauge("snapshot_tables", "tables the initial snapshot copies", snapshot.tables)
            yield gauge("snapshot_tables_done", "tables the initial snapshot has copied",
                        snapshot.tables_done)
            yield counter("snapshot_rows", "rows the initial snapshot has copied", snapshot.rows)
        yield from self._slot_metrics(GaugeMetricFamily, CounterMetricFamily)

    def _slot_metrics(self, gauge: Any, counter: Any) -> Iterator[Any]:
        monitor = self.source.monitor
        row = monitor.poll()
        slot = self.source.config.slot
        errors = counter("pgdecode_slot_poll_errors", "failed reads of pg_replication_slots",
                         labels=["slot"])
        errors.add_metric([slot], monitor.poll_errors)
        yield errors
        if monitor.heartbeat is not None:
            beats = counter("pgdecode_heartbeats", "heartbeat messages written (--heartbeat)",
                            labels=["slot"])
            beats.add_metric([slot], monitor.heartbeats)
            yield beats
        if row is None:
            return
        for name, value, text in (
                ("slot_retained_bytes", row["retained_bytes"], "WAL the server keeps for the "
                 "slot (its WAL position minus restart_lsn)"),
                ("slot_lag_bytes", row["lag_bytes"], "the server's WAL position minus the "
                 "slot's confirmed_flush_lsn"),
                ("slot_safe_wal_size_bytes", row["safe_wal_size"], "WAL that can be written "
                 "before the slot is in danger of invalidation (max_slot_wal_keep_size)"),
                ("slot_wal_keep_limit_bytes", monitor.limit, "max_slot_wal_keep_size"),
                ("slot_near_limit", int(monitor.warning is not None), "1 while less than "
                 f"{NEAR_LIMIT:.0%} of max_slot_wal_keep_size is left, or the slot's WAL is "
                 "past it (wal_status unreserved)")):
            if value is not None:
                metric = gauge(f"pgdecode_{name}", text, labels=["slot"])
                metric.add_metric([slot], value)
                yield metric
        status = gauge("pgdecode_slot_wal_status", "1 for the slot's wal_status",
                       labels=["slot", "status"])
        for value in _WAL_STATUSES:
            status.add_metric([slot, value], int(row["wal_status"] == value))
        yield status


def serve_metrics(source: Any, port: int, address: str = "") -> Any:
    """Serve ``source``'s metrics at http://ADDRESS:PORT/metrics (a daemon thread);
    returns the server (``shutdown()`` stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamCollector(source))
    server, _ = start_http_server(port, addr=address, registry=registry)
    return server
