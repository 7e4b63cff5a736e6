"""Snapshots for the ``pgoutput`` Structured Streaming source: ``.option("snapshot",
"initial")`` copies the published tables into the stream, chunk by chunk, with the watermark
method of sources/snapshots/incremental.py (no exported snapshot: the source reads the slot through
the SQL interface, and Spark may plan a batch in another driver than the one that read it).

The state of the snapshot lives in the offsets. Each offset carries, under ``"snapshot"``,
how far the snapshot is once the batch ending there is processed (incremental.py's record),
and, under ``"chunk"``, which chunk that batch delivered. The reader reads the slot again
from its confirmed position for every batch it plans (a peek), so for each batch:

1. the snapshot is set up again from the start offset's record (``prepare``), and the chunk
   read for that same record by an earlier plan is taken again, else the next one is read
   (its low watermark, its rows, its high watermark: incremental.py's ``step``);
2. the peek runs the stream through ``IncrementalSnapshot.intercept``: the chunk's rows whose
   keys the stream did not change between the watermarks are delivered at the high
   watermark, as a snapshot transaction (``op`` SNAPSHOT) of the batch;
3. the end offset records the new progress if the batch took the chunk; if the batch ended
   first, the chunk waits for the next one, and the slot is not advanced past its low
   watermark so that the next peek sees the whole window again.

A batch that Spark plans again after a failure (its offsets logged, its rows not committed)
reads its chunk again (``replay``): the rows of the same key range as they are now, every
one delivered at the same high watermark. They may be newer than that point of the stream;
the changes after it, which the following batches deliver, bring each row to its value
then, so a consumer that upserts by key ends with the table (docs/snapshot.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from plugin_framework import LSN, Pipeline
from plugin_framework.sources.errors import SourceError
from plugin_framework.sources.session import highest_proto_version
from plugin_framework.sources.snapshots.catalog import (
    NO_KEY,
    Key,
    key_text,
    published_tables,
    qualified_name,
)
from plugin_framework.sources.snapshots.incremental import MAX_RETRIES, IncrementalSnapshot
from plugin_framework.sources.snapshots.window import Window
from plugin_framework.spark.datasource.options import SourceOptions

log = logging.getLogger("pgdecode.spark.source")

FLUSH_WAIT = 10.0  # seconds to wait for a chunk's high watermark to be flushed


def _key(text: list[str | None] | None) -> Key | None:
    return None if text is None else tuple(None if v is None else v.encode() for v in text)


def initial_progress(conn: psycopg.Connection[Any], opts: SourceOptions) -> dict[str, Any]:
    """The record of a snapshot of the published tables (or of ``snapshotTables``) that has
    not begun; refused for a table it could not copy in key order."""
    tables = {t.qualified: t for t in published_tables(conn, opts.publications)}
    names = [qualified_name(n) for n in opts.snapshot_tables] or sorted(tables)
    for name in names:
        table = tables.get(name)
        if table is None:
            raise SourceError(
                f'snapshotTables: {name} is not in the publications {", ".join(opts.publications)}')
        if not table.ordered:
            raise SourceError(
                f"the snapshot of {name} cannot be taken by the pgoutput source: it has "
                f"{NO_KEY} in the published columns, so it cannot be copied in key order and "
                "go on after an interruption. "
                'Add a primary key, or leave it out with .option("snapshotTables", ...)')
    return {"slot": opts.slot, "queue": names, "done": [], "after": {}, "starts": names}


def start_tables(conn: psycopg.Connection[Any], opts: SourceOptions, pipeline: Pipeline,
                 names: Sequence[str], lsn: LSN) -> None:
    """The copy of each of ``names`` begins at ``lsn``, the start of the first batch (and of
    the same batch planned again): a snapshot transaction with no rows and
    ``snapshot_starts`` (a TRUNCATE row), so that a mirror holds exactly the copy and the
    stream from there, an empty table too. Not at a chunk's low watermark, as the stream
    source does it (snapshots/incremental.py): that can be in an earlier batch than the chunk."""
    if not names:
        return
    tables = {t.qualified: t for t in published_tables(conn, opts.publications)}
    for name in names:
        table = tables.get(name)
        if table is None or table.relation is None:
            log.warning("the snapshot's table %s is no longer published: not started", name)
            continue
        pipeline.snapshot_rows(table.relation, table.types, [], lsn, datetime.now(UTC),
                               first=True)


def wal_flushed(conn: psycopg.Connection[Any]) -> LSN:
    """How far the server's WAL is flushed: as far as a peek at the slot reads."""
    row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    return LSN(row[0])


def flushed_to(conn: psycopg.Connection[Any], end: LSN) -> bool:
    """Whether the server's WAL is flushed up to ``end``, the end of a record (what
    pg_logical_emit_message returns): a peek then decodes that record. On an idle server the
    flush position stays at the last record's end, not past it."""
    return wal_flushed(conn) >= end


def starts_of(progress: dict[str, Any] | None) -> list[str]:
    """The tables whose copy a batch starting at a snapshot record ``progress`` begins
    (start_tables; only the first batch's record has them)."""
    return list((progress or {}).get("starts") or [])


def has_work(progress: dict[str, Any] | None) -> bool:
    """Whether a snapshot record has a table under way or queued."""
    return progress is not None and bool(progress.get("table") or progress.get("queue"))


Make = Callable[[], IncrementalSnapshot]  # the snapshot side of one peek at the slot


class SourceSnapshot:
    """The snapshot side of one stream reader (see the module's text). ``plan`` and
    ``replay`` give a maker of the snapshot for each peek of a batch's plan (a peek may be
    made again, larger): each starts from the same record and chunk."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._proto: int | None = None
        self._window: Window | None = None  # the chunk read for the progress last planned
        self._dirty = 0  # reads in a row of one chunk that the stream's order did not allow

    def _snapshot(self) -> IncrementalSnapshot:
        if self._proto is None:
            with psycopg.connect(self.opts.dsn) as conn:
                self._proto = (self.opts.proto_version
                               or highest_proto_version(conn.info.server_version))
        # the pipeline is the peek's: the source sets it before the stream is fed
        return IncrementalSnapshot(self.opts.dsn, self.opts.slot, self.opts.publications,
                                   Pipeline(proto_version=self._proto), self._proto,
                                   chunk_rows=self.opts.snapshot_chunk_rows, requests=False,
                                   track_moves=False)

    def plan(self, progress: dict[str, Any] | None) -> Make | None:
        """The snapshot as ``progress`` left it, with its next chunk read (None: nothing is
        left to take)."""
        if progress is None or not has_work(progress):
            self._window = None
            return None

        def make() -> IncrementalSnapshot:
            snap = self._snapshot()
            try:
                snap.resume(progress)
                snap.starts = []  # started by the first batch instead (start_tables)
                if not snap.adopt(self._window):
                    snap.step()  # the next chunk: its watermarks and rows
            finally:
                snap.disconnect()
            self._window = snap.window
            return snap

        made = [make()]
        if self.high is not None:
            self._wait_flushed(self.high)
        return lambda: made.pop() if made else make()

    def _wait_flushed(self, lsn: LSN) -> None:
        """The peek reads flushed WAL only: wait (a little) for the high watermark's."""
        deadline = time.monotonic() + FLUSH_WAIT
        with psycopg.connect(self.opts.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline and not flushed_to(conn, lsn):
                time.sleep(0.05)

    @property
    def high(self) -> LSN | None:
        """The high watermark of the chunk waiting to be delivered (None: none)."""
        return None if self._window is None else self._window.high

    @property
    def low(self) -> LSN | None:
        """The low watermark of the chunk waiting: the slot must not pass it."""
        return None if self._window is None else self._window.low

    def settle(self, snap: IncrementalSnapshot | None, taken: bool) -> dict[str, Any] | None:
        """After the peek: the offset entries of a batch that ``taken`` the chunk (the
        progress, and which chunk it was), else None: the chunk waits for the next batch, or
        is read again if its window was not clean."""
        window = self._window
        if snap is None or window is None:
            return None
        if taken:
            self._window, self._dirty = None, 0
            return {"snapshot": snap.progress(), "chunk": {
                "id": window.chunk_id, "table": window.table,
                "after": None if window.after is None else key_text(window.after),
                "last": key_text(window.keys[-1]) if window.keys else None}}
        if snap.window is None:  # its high watermark came, but the window was not clean
            self._window = None
            self._dirty += 1
            if self._dirty > MAX_RETRIES:
                raise SourceError(
                    f"snapshot of {window.table}: {MAX_RETRIES} reads of one chunk in a row "
                    "overlapped streamed or prepared transactions changing it; go on when "
                    "such transactions are rarer")
        return None

    def replay(self, chunk: dict[str, Any]) -> Make:
        """The snapshot side of a batch planned again: its chunk, read again."""
        template = self._snapshot()
        try:
            template.replay(chunk["table"], _key(chunk.get("after")), _key(chunk.get("last")),
                            chunk["id"])
        except SourceError as exc:
            raise SourceError(f"a batch planned again cannot read its chunk again: {exc}") \
                from None
        finally:
            template.disconnect()

        def make() -> IncrementalSnapshot:
            snap = self._snapshot()
            snap.current, snap.window = template.current, template.window
            return snap

        return make
