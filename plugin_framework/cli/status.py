"""The status line of ``pgdecode stream``: positions, lag and rates, live on a terminal."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


class StatusLine:
    """A one-line live status on a terminal's stderr: positions, lag, rates, what each
    plugin says of itself (its ``status_note`` property, if it has one: the spark emitter's
    batches), and how far an incremental snapshot is; during the initial copy (before the
    stream), how far that is."""

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
            sys.stderr.write(f"\r{self.line()}\033[K")
            sys.stderr.flush()

    def line(self) -> str:
        """The status now, with the rates since the last call."""
        p = self.source.progress
        pipeline = self.source.pipeline
        state = "" if p.connected else " (reconnecting)"
        if p.snapshot is not None and not p.snapshot.done:  # the stream waits for the copy
            return str(p.snapshot.describe()) + state
        now = time.monotonic()
        then, txns, changes = self._last
        dt = max(now - then, 1e-6)
        rate_t = (pipeline.transactions - txns) / dt
        rate_c = (pipeline.changes - changes) / dt
        self._last = (now, pipeline.transactions, pipeline.changes)
        lag_s = max(0.0, time.time() - p.server_time) if p.server_time else 0.0
        notes = "".join(f"  {note}" for m in pipeline.members
                        if (note := getattr(m.plugin.plugin, "status_note", None)))
        incremental = getattr(self.source, "incremental_progress", None)
        if incremental is not None:
            notes += f"  {incremental.describe()}"
        return (f"received {p.received}  acked {p.acked}  lag {p.lag_bytes} B / {lag_s:.1f} s  "
                f"{rate_t:.0f} txn/s  {rate_c:.0f} changes/s{notes}{state}")
