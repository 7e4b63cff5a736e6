"""The status line of ``pgdecode stream``: positions, lag and rates, live on a terminal."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


class StatusLine:
    """A one-line live status on a terminal's stderr: positions, lag, rates."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._last = (time.monotonic(), 0, 0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            p = self.source.progress
            pipeline = self.source.pipeline
            now = time.monotonic()
            then, txns, changes = self._last
            dt = max(now - then, 1e-6)
            rate_t = (pipeline.transactions - txns) / dt
            rate_c = (pipeline.changes - changes) / dt
            self._last = (now, pipeline.transactions, pipeline.changes)
            lag_bytes = p.lag_bytes
            lag_s = max(0.0, time.time() - p.server_time) if p.server_time else 0.0
            state = "" if p.connected else " (reconnecting)"
            if p.snapshot is not None and not p.snapshot.done:
                sys.stderr.write(f"\r{p.snapshot.describe()}{state}\033[K")
                sys.stderr.flush()
                continue
            sys.stderr.write(
                f"\rreceived {p.received}  acked {p.acked}  lag {lag_bytes} B / {lag_s:.1f} s  "
                f"{rate_t:.0f} txn/s  {rate_c:.0f} changes/s{state}\033[K"
            )
            sys.stderr.flush()
