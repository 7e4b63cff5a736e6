"""Prometheus metrics of a running stream (``pgdecode stream --metrics-port PORT``), served
by prometheus-client's HTTP server at ``/metrics`` (docs/operations.md lists them).

Nothing is counted on the way of a change: the collector reads the source's progress and
the pipeline's counters when it is scraped, and polls the slot's row of
pg_replication_slots over an ordinary connection, at most every ``poll_interval``
seconds, so that a busy scraper does not load the server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from plugin_framework.sources.slots import slot_health

__all__ = ["StreamCollector", "serve_metrics"]

log = logging.getLogger("pgdecode.metrics")

_WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


class StreamCollector:
    """A prometheus-client collector of one source (a WalsenderSource or SqlSource: its
    ``progress``, ``pipeline`` and ``config``)."""

    def __init__(self, source: Any, poll_interval: float = 10.0) -> None:
        self.source = source
        self.poll_interval = poll_interval
        self._slot: dict[str, Any] | None = None
        self._polled = -float("inf")
        self._poll_errors = 0
        self._lock = threading.Lock()

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
        snapshot = progress.snapshot
        if snapshot is not None:
            yield gauge("snapshot_tables", "tables the initial snapshot copies", snapshot.tables)
            yield gauge("snapshot_tables_done", "tables the initial snapshot has copied",
                        snapshot.tables_done)
            yield counter("snapshot_rows", "rows the initial snapshot has copied", snapshot.rows)
        yield from self._slot_metrics(GaugeMetricFamily, CounterMetricFamily)

    def _slot_metrics(self, gauge: Any, counter: Any) -> Iterator[Any]:
        row = self._poll()
        slot = self.source.config.slot
        errors = counter("pgdecode_slot_poll_errors", "failed reads of pg_replication_slots",
                         labels=["slot"])
        errors.add_metric([slot], self._poll_errors)
        yield errors
        if row is None:
            return
        for name, key, text in (
                ("slot_retained_bytes", "retained_bytes", "WAL the server keeps for the slot "
                 "(its WAL position minus restart_lsn)"),
                ("slot_lag_bytes", "lag_bytes", "the server's WAL position minus the slot's "
                 "confirmed_flush_lsn"),
                ("slot_safe_wal_size_bytes", "safe_wal_size", "WAL that can be written before "
                 "the slot is in danger of invalidation (max_slot_wal_keep_size)")):
            if row[key] is not None:
                metric = gauge(f"pgdecode_{name}", text, labels=["slot"])
                metric.add_metric([slot], row[key])
                yield metric
        status = gauge("pgdecode_slot_wal_status", "1 for the slot's wal_status",
                       labels=["slot", "status"])
        for value in _WAL_STATUSES:
            status.add_metric([slot, value], int(row["wal_status"] == value))
        yield status

    def _poll(self) -> dict[str, Any] | None:
        """The slot's pg_replication_slots row, read again when older than
        ``poll_interval``; the last one read if the server cannot be asked."""
        with self._lock:
            if time.monotonic() - self._polled < self.poll_interval:
                return self._slot
            self._polled = time.monotonic()
            config = self.source.config
            try:
                with psycopg.connect(config.conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute("SET default_transaction_read_only = on")
                    rows = slot_health(conn, config.slot)
                self._slot = rows[0] if rows else None
            except psycopg.Error as exc:
                self._poll_errors += 1
                log.warning("metrics: cannot read pg_replication_slots: %s",
                            str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
            return self._slot


def serve_metrics(source: Any, port: int, address: str = "") -> Any:
    """Serve ``source``'s metrics at http://ADDRESS:PORT/metrics (a daemon thread);
    returns the server (``shutdown()`` stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamCollector(source))
    server, _ = start_http_server(port, addr=address, registry=registry)
    return server
