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

from plugin_framework.framework import OutputPlugin
from plugin_framework.sources.monitor import NEAR_LIMIT, SlotMonitor

__all__ = ["Families", "StreamCollector", "serve_collector", "serve_metrics"]

_WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


class Families:
    """Makers of one slot's metric families (every metric has the label ``slot``)."""

    def __init__(self, slot: str) -> None:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.slot = slot
        self._counter, self._gauge = CounterMetricFamily, GaugeMetricFamily

    def counter(self, name: str, text: str, value: float) -> Any:
        metric = self._counter(f"pgdecode_{name}", text, labels=["slot"])
        metric.add_metric([self.slot], value)
        return metric

    def gauge(self, name: str, text: str, value: float) -> Any:
        metric = self._gauge(f"pgdecode_{name}", text, labels=["slot"])
        metric.add_metric([self.slot], value)
        return metric

    def tables(self, delivered: dict[tuple[str, str, str], int]) -> Any:
        """pgdecode_table_changes_total from (schema, table, op) -> changes."""
        metric = self._counter(
            "pgdecode_table_changes", "row changes of committed transactions delivered, and "
            "TRUNCATEs, by table and op (insert, update, delete, truncate, snapshot)",
            labels=["slot", "schema", "table", "op"])
        for (schema, table, op), n in sorted(delivered.copy().items()):
            metric.add_metric([self.slot, schema, table, op], n)
        return metric

    def plugins(self, pipeline: Any) -> Iterator[Any]:
        """The figures the pipeline's plugins give of themselves (``stream_metrics``)."""
        families: dict[str, Any] = {}
        for m in pipeline.members:
            plugin = m.plugin.plugin
            if not isinstance(plugin, OutputPlugin):
                continue
            for sample in plugin.stream_metrics():
                family = families.get(sample.name)
                if family is None:
                    make = self._counter if sample.kind == "counter" else self._gauge
                    family = families[sample.name] = make(
                        f"pgdecode_{sample.name}", sample.help,
                        labels=["slot", *(k for k, _ in sample.labels)])
                family.add_metric([self.slot, *(v for _, v in sample.labels)], sample.value)
        yield from families.values()

    def slot_health(self, monitor: SlotMonitor) -> Iterator[Any]:
        """What the SlotMonitor last read of the slot's row of pg_replication_slots."""
        row = monitor.poll()
        yield self.counter("slot_poll_errors", "failed reads of pg_replication_slots",
                           monitor.poll_errors)
        if monitor.heartbeat is not None:
            yield self.counter("heartbeats", "heartbeat messages written (--heartbeat)",
                               monitor.heartbeats)
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
                yield self.gauge(name, text, value)
        status = self._gauge("pgdecode_slot_wal_status", "1 for the slot's wal_status",
                             labels=["slot", "status"])
        for value in _WAL_STATUSES:
            status.add_metric([self.slot, value], int(row["wal_status"] == value))
        yield status


class StreamCollector:
    """A prometheus-client collector of one source (a WalsenderSource or SqlSource: its
    ``progress``, ``pipeline``, ``config`` and ``monitor``)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        source = self.source
        progress, pipeline = source.progress, source.pipeline
        make = Families(source.config.slot)
        counter, gauge = make.counter, make.gauge
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
        yield make.tables(pipeline.delivered)
        yield from make.plugins(pipeline)
        snapshot = progress.snapshot
        if snapshot is not None:
            yield gauge("snapshot_tables", "tables the initial snapshot copies", snapshot.tables)
            yield gauge("snapshot_tables_done", "tables the initial snapshot has copied",
                        snapshot.tables_done)
            yield counter("snapshot_rows", "rows the initial snapshot has copied", snapshot.rows)
        yield from make.slot_health(source.monitor)


def serve_metrics(source: Any, port: int, address: str = "") -> Any:
    """Serve ``source``'s metrics at http://ADDRESS:PORT/metrics (a daemon thread);
    returns the server (``shutdown()`` stops it)."""
    return serve_collector(StreamCollector(source), port, address)


def serve_collector(collector: Any, port: int, address: str = "") -> Any:
    """Serve a collector's metrics at http://ADDRESS:PORT/metrics (a daemon thread)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _ = start_http_server(port, addr=address, registry=registry)
    return server
