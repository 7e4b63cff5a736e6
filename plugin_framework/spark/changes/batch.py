"""What a batch of the foreachBatch way in carries besides its rows, for the sinks that keep
a table's state (the mirrors): held for the time ``fn`` and the sinks run (``delivering``),
and read by them with ``batch_context`` (None under Spark's own foreachBatch, or a call by
hand: then the mirrors' documented policies apply, without re-reads).

- ``request_snapshot(table, keys)``: rows read again from the source into a later batch
  (every row of a table, or those under ``keys``), where the stream cannot give a mirror a
  value exactly (an ALTER TABLE, an unchanged TOAST value the mirror never had). The source
  takes it at once and keeps it durable (sources/snapshots/requests.py).
- ``consistent_lsn``: once the batch is in a target, that target equals the source as of
  this LSN (the end of the batch's last transaction); None while a snapshot is under way
  or was never taken (a mirror started without one cannot know it holds every row).
- ``note_unknown_toast(table, rows)``: rows a mirror wrote with an unchanged TOAST value
  it did not have (NULL until read again): counted by the stream for its status line and
  metrics (``pgdecode_unknown_toast_total``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

__all__ = ["BatchContext", "KeyText", "batch_context", "delivering"]

KeyText = Sequence[str | None]  # a key's values as the stream's text has them


@dataclass
class BatchContext:
    request_snapshot: Callable[[str, Sequence[KeyText] | None], None] | None
    consistent_lsn: int | None
    note_unknown_toast: Callable[[str, int], None]
    # tables a mirror wrote with values it knows are not the server's in this batch (read
    # again, or left to the documented policy): not consistent as of the batch
    inexact: set[str] = field(default_factory=set)

    def consistent_for(self, table: str) -> int | None:
        """``consistent_lsn`` for one table's target (None where it is inexact)."""
        return None if table in self.inexact else self.consistent_lsn


_current: ContextVar[BatchContext | None] = ContextVar("pgdecode_batch", default=None)


def batch_context() -> BatchContext | None:
    """The context of the batch being delivered (None: not a foreachBatch stream's)."""
    return _current.get()


@contextmanager
def delivering(context: BatchContext) -> Iterator[None]:
    """``context`` is the batch's while the block runs (``fn`` and the sinks)."""
    token = _current.set(context)
    try:
        yield
    finally:
        _current.reset(token)
