"""Prometheus metrics of the ``pgoutput`` data source's stream reader
(``.option("metricsPort", PORT)``), served from the process where Spark runs the reader's
driver-side methods, for as long as the query runs.

A batch counts once Spark reads it (``partitions``): its rows by table and op; the slot's
position once Spark commits it, which Spark does when it plans the batch after. The slot's
health comes from a SlotMonitor, as for ``pgdecode stream`` (docs/operations.md lists the
metrics).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from plugin_framework.protocol import LSN
from plugin_framework.sources.metrics import Families, serve_collector
from plugin_framework.sources.monitor import SlotMonitor
from plugin_framework.spark.datasource.options import SourceOptionError, SourceOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SourceMetrics"]


# The metrics served in this process, by port: one query's readers share them
_SERVED: dict[int, SourceMetrics] = {}
_LOCK = threading.Lock()


class SourceMetrics:
    """The counters of one stream reader, and their HTTP endpoint."""

    @classmethod
    def serve(cls, opts: SourceOptions) -> SourceMetrics:
        """The metrics at ``opts.metrics_port``, served from now on in this process."""
        port = opts.metrics_port
        assert port is not None
        with _LOCK:
            metrics = _SERVED.get(port)
            if metrics is None or metrics.slot != opts.slot:
                try:
                    metrics = _SERVED[port] = cls(opts, port, opts.metrics_address)
                except OSError as exc:
                    raise SourceOptionError(f"cannot serve metrics on port {port}: "
                                            f"{exc.strerror or exc}") from None
            return metrics

    def __init__(self, opts: SourceOptions, port: int, address: str = "") -> None:
        self.port = port
        self.slot = opts.slot
        self.monitor = SlotMonitor(opts.dsn, opts.slot)
        self.batches = 0
        self.changes = 0
        self.acked: LSN | None = None  # where this reader advanced the slot to
        self.delivered: dict[tuple[str, str, str], int] = {}
        self._counted = LSN(0)  # the end of the last batch counted
        self._server = serve_collector(self, port, address)
        self.monitor.start()

    def batch(self, end: str, table: pa.Table | None) -> None:
        """Spark reads the batch ending at ``end``: count its rows, once (a batch read
        again after a failure has the same end)."""
        if LSN(end) <= self._counted:
            return
        self._counted = LSN(end)
        self.batches += 1
        if table is None or not table.num_rows:
            return
        grouped = table.group_by(["schema", "table", "op"]).aggregate([("op", "count")])
        for schema, name, op, n in zip(*(grouped.column(c).to_pylist() for c in (
                "schema", "table", "op", "op_count")), strict=True):
            key = (schema, name, op.lower())
            self.delivered[key] = self.delivered.get(key, 0) + n
            self.changes += n

    def committed(self, end: dict[str, Any]) -> None:
        """Spark committed the batch ending at ``end`` (when it plans the next one): the
        slot was advanced to its ``ack``."""
        self.acked = LSN(end.get("ack", end["lsn"]))

    def collect(self) -> Iterator[Any]:
        make = Families(self.slot)
        yield make.counter("batches", "micro-batches read by Spark", self.batches)
        yield make.counter("changes", "rows of the batches read", self.changes)
        acked = self.acked
        if acked is None:  # nothing committed yet: where the slot was found
            row = self.monitor.poll()
            if row is not None and row["confirmed_flush_lsn"] is not None:
                acked = LSN(row["confirmed_flush_lsn"])
        if acked is not None:
            yield make.gauge("acknowledged_lsn", "the slot's confirmed position, in bytes",
                             int(acked))
        yield make.tables(self.delivered)
        yield from make.slot_health(self.monitor)

    def close(self) -> None:
        with _LOCK:
            if _SERVED.get(self.port) is self:
                del _SERVED[self.port]
        self._server.shutdown()
        self._server.server_close()
        self.monitor.stop()
