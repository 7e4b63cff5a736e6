"""The Python API of the foreachBatch way in: a slot streamed into ``fn(batch_df, batch_id)``
inside an existing SparkSession.

    stream = ForeachBatchStream(spark, my_function, dsn="host=... dbname=app", slot="lake",
                                publications=["lake_pub"], checkpoint="/data/ckpt/lake")
    stream.run()            # blocks; or stream.start() ... stream.stop(); stream.join()
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from plugin_framework import LSN
from plugin_framework.app import PlannedEmitter, build_pipeline, run_source
from plugin_framework.sources.metrics import serve_metrics
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.walsender import WalsenderSource
from plugin_framework.spark.foreachbatch.batching import BatchFunction
from plugin_framework.spark.foreachbatch.plugin import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DELAY,
    DEFAULT_MAX_ROWS,
    ForeachBatchPlugin,
)

__all__ = ["ForeachBatchStream"]


class ForeachBatchStream:
    """Streams a slot through ``fn(batch_df, batch_id)`` (and ``sinks``) in micro-batches.

    ``checkpoint`` is a local directory recording batch ids and LSN ranges: keep it with the
    slot. The slot is created (two-phase) if ``create_slot``; prepared transactions are
    delivered at COMMIT PREPARED with their gid (PostgreSQL 15 and later).
    ``status_interval`` defaults to ``min(10, max_delay)`` seconds, so that a batch waiting
    on ``max_delay`` goes out on time even when no new change arrives.

    ``snapshot="initial"`` (with ``create_slot``) first delivers a consistent copy of the
    published tables' rows (``op`` SNAPSHOT), then the stream from where the copy ends;
    ``"only"`` stops after the copy; ``snapshot_tables`` takes incremental snapshots of
    tables while streaming. Both resume after a crash (docs/snapshot.md).

    ``metrics_port``: serve Prometheus metrics at http://METRICS_ADDRESS:PORT/metrics while
    it runs (docs/operations.md).
    """

    def __init__(self, spark: Any, fn: BatchFunction | None = None, *, dsn: str, slot: str,
                 publications: Sequence[str], checkpoint: str,
                 max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_delay: float = DEFAULT_MAX_DELAY, sinks: Sequence[BatchFunction] = (),
                 create_slot: bool = False, endpos: LSN | str | None = None,
                 streaming: str = "on", status_interval: float | None = None,
                 proto_version: int | None = None, memory_limit: int | None = None,
                 reconnect: bool = True, snapshot: str | None = None,
                 snapshot_workers: int = 2, snapshot_tables: Sequence[str] = (),
                 metrics_port: int | None = None, metrics_address: str = "") -> None:
        if snapshot not in (None, "initial", "only"):
            raise ValueError(f'snapshot must be "initial" or "only", not {snapshot!r}')
        if snapshot is not None and not create_slot:
            raise ValueError("snapshot needs create_slot=True: the copy is taken at the new "
                             "slot's consistent point, so that the stream continues exactly "
                             "where it ends")
        self.plugin = ForeachBatchPlugin(fn, spark=spark, checkpoint=checkpoint,
                                         max_rows=max_rows, max_bytes=max_bytes,
                                         max_delay=max_delay, sinks=sinks)
        if status_interval is None:
            status_interval = max(0.2, min(10.0, max_delay))
        self.config = SourceConfig(
            conninfo=dsn, slot=slot, publications=list(publications),
            proto_version=proto_version, streaming=streaming,
            endpos=None if endpos is None else LSN(endpos), status_interval=status_interval,
            create_slot=create_slot, slot_two_phase=True, reconnect=reconnect,
            snapshot=snapshot, snapshot_workers=snapshot_workers,
            snapshot_tables=tuple(snapshot_tables))
        self.memory_limit = memory_limit
        self.metrics = (metrics_port, metrics_address)
        self.source: WalsenderSource | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._stop_requested = threading.Event()

    def run(self) -> None:
        """Stream until ``stop()``, ``endpos`` or an error."""
        assembly = build_pipeline([PlannedEmitter(self.plugin)], slot_name=self.config.slot,
                                  catalog_conninfo=self.config.conninfo,
                                  memory_limit=self.memory_limit)
        self.source = WalsenderSource(self.config, assembly.pipeline)
        if self._stop_requested.is_set():
            self.source.request_stop()
        port, address = self.metrics
        server = None if port is None else serve_metrics(self.source, port, address)
        try:
            # Inside the caller's SparkSession: its signals are its own.
            run_source(self.source, assembly, handle_signals=False)
        finally:
            if server is not None:
                server.shutdown()

    def start(self) -> ForeachBatchStream:
        """Run in a background thread; ``error`` holds what stopped it, if anything."""
        def target() -> None:
            try:
                self.run()
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=target, name="pgdecode-spark", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Finish the transaction being received, deliver what is collected, return."""
        self._stop_requested.set()
        if self.source is not None:
            self.source.request_stop()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
