"""The initial snapshot of a run with ``--snapshot``, as the walsender source drives it: taken
once with a new slot (``take``), gone on with after an interruption (``on_existing_slot``),
and said unfinished when a run stops before it is complete (``SnapshotUnfinished``).

The outputs record where the copy stands (``snapshot_state``, docs/snapshot.md):
"copying" while the copy of the slot's own snapshot is under way; "incremental" once a run
that found it cut short goes on with the tables left as an incremental snapshot inside the
stream (the snapshot went with the run that made it); "done" when every table is copied.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from plugin_framework.framework import Pipeline
from plugin_framework.framework.outputs import Batching, capable
from plugin_framework.protocol import LSN, Decoder
from plugin_framework.sources.errors import SourceError, explain
from plugin_framework.sources.session import PROGRESS_INTERVAL, Progress, SnapshotProgress
from plugin_framework.sources.snapshots.catalog import NO_KEY
from plugin_framework.sources.snapshots.copy import SnapshotCopy
from plugin_framework.sources.snapshots.ledger import CopyLedger, any_output_in, recorded_progress

log = logging.getLogger("pgdecode.source")


# The initial copy is made durable (and resumable from there) every second, or every so many
# chunks (50,000 rows) where a second copies more: a fast copy must not end unrecorded.
_CHECKPOINT_CHUNKS = 10


class SnapshotUnfinished(SourceError):
    """The run stopped (a stop request, SIGTERM) with a snapshot not complete: what the
    outputs hold of the tables is not all of them yet."""


class InitialCopy:
    """The initial snapshot of one run (``config.snapshot``: "initial" or "only")."""

    def __init__(self, conninfo: str, slot: str, snapshot: str | None, workers: int,
                 pipeline: Pipeline) -> None:
        self.conninfo, self.slot, self.snapshot = conninfo, slot, snapshot
        self.workers = workers
        self.pipeline = pipeline
        self.pending = snapshot is not None  # still to take (or to go on with)
        self.copy: SnapshotCopy | None = None  # of the slot made now
        self.lsn = LSN(0)  # that slot's consistent point
        # this run's copy, as far as delivered (a lost connection in the middle goes on from
        # there, as a restart goes on from its output's record), and whether it delivered
        # any row
        self.ledger: CopyLedger | None = None
        self.delivered = False
        self.exported = False  # this run made the slot with an exported snapshot
        self.record: dict[str, Any] | None = None  # what the copy goes on from
        self.resumed = False  # cut short: goes on as an incremental snapshot (``go_on``)

    def on_existing_slot(self, drop_slot: Callable[[], object]) -> bool:
        """The slot exists already, in a run that would copy: go on with a copy cut short
        (False: the slot stays), or drop a slot whose copy never got anywhere, to be made
        again (True). Refused where the copy can neither go on nor be taken back."""
        pipeline, slot = self.pipeline, self.slot
        in_run = self.exported  # this run's copy, cut short by a lost connection
        goes_on = in_run and self.delivered and self.ledger is not None \
            and self.snapshot == "initial"
        if in_run and self.delivered and not goes_on and not any_output_in(pipeline, "copying"):
            raise SourceError(
                f'the connection was lost during the initial snapshot with replication slot '
                f'"{slot}", which cannot go on from where it was (--snapshot only, or a '
                "table without a key) nor be taken back from the outputs it went to (stdout, "
                "a pipe). Drop the slot (`pgdecode slot drop`) and copy again, into a file "
                "(-f), which can be cut back")
        if in_run or any_output_in(pipeline, "copying"):
            recorded = recorded_progress(pipeline)
            if goes_on:
                assert self.ledger is not None
                recorded = self.ledger.record()
            if recorded is not None and recorded.get("initial") and self.snapshot == "only":
                # What is left goes on from the slot's stream, which "only" does not read:
                # said, rather than a copy that ends short
                raise SourceError(
                    f'the initial snapshot with replication slot "{slot}" did not finish, '
                    "and its snapshot went with the run that made it: the tables left are "
                    "copied as an incremental snapshot, which reads the slot's stream, so "
                    "--snapshot only cannot finish it. Run the same command with --snapshot "
                    "initial instead (and -E LSN to stop once it is done): it finishes the "
                    "copy, then delivers the changes made since. Nothing was written or "
                    "acknowledged")
            if recorded is not None and recorded.get("initial"):
                # Its snapshot went with the run that made it; the slot still streams from
                # the consistent point: the tables left are copied as an incremental
                # snapshot, each after the last key the outputs hold.
                log.warning('the initial snapshot with replication slot "%s" did not finish: '
                            "going on with the tables left as an incremental snapshot", slot)
                self.pending = False
                self.resumed = True
                self.record = recorded
                return False
            # Made by a run whose copy did not finish, and never streamed from: made again,
            # with a new snapshot, and the copy taken again.
            log.warning('the initial snapshot with replication slot "%s" did not finish: '
                        "dropping the slot and copying again with a new one", slot)
            drop_slot()
            return True
        if any_output_in(pipeline, "incremental"):
            log.info('the initial snapshot with replication slot "%s" goes on as an '
                     "incremental snapshot, from where the output has it", slot)
        elif any_output_in(pipeline, "done"):
            log.info('the initial snapshot with replication slot "%s" is in the output '
                     "already: streaming on", slot)
        else:
            log.warning('replication slot "%s" exists already: the initial snapshot is taken '
                        "only with a new slot, so it is not taken again", slot)
        self.pending = False
        return False

    def slot_made(self, snapshot_name: str, consistent_point: str) -> None:
        """The slot was made now, exporting ``snapshot_name``: imported at once (the export
        ends with the replication connection's next command)."""
        self.exported = True
        self.copy = SnapshotCopy(self.conninfo, snapshot_name, self.workers)
        self.lsn = LSN(consistent_point)

    def go_on(self) -> None:
        """Once streaming starts after a copy cut short: the outputs record that it goes on
        as an incremental snapshot (``record``), until ``finished``."""
        if self.resumed:
            self.resumed = False
            self.pipeline.continue_snapshot()
            self.pipeline.flush()

    def going_on(self) -> bool:
        """Whether an output has the copy going on as an incremental snapshot."""
        return any_output_in(self.pipeline, "incremental")

    def finished(self, lsn: LSN) -> None:
        """Every table of a copy that went on as an incremental snapshot is copied: the
        outputs record the copy done, with what they hold up to ``lsn``."""
        if self.going_on():
            self.pipeline.end_snapshot(lsn)
            self.pipeline.flush()
            log.info('the initial snapshot with replication slot "%s" is complete', self.slot)

    def close(self) -> None:
        if self.copy is not None:
            self.copy.close()
            self.copy = None

    def refuse_unresumable(self, tables: list[str], drop_slot: Callable[[], object]) -> None:
        """A copy not in key order is taken again whole after an interruption: refused for
        outputs that cannot take back what they delivered of it (Spark's batches). Said
        after ``begin_snapshot``, so that the next run makes the slot again."""
        for m in self.pipeline.members:
            if capable(m.ctx.output, Batching) and m.ctx.output.copy_must_resume:
                drop_slot()  # made by this run, for this copy: not kept
                raise SourceError(
                    f'--snapshot: output plugin "{m.plugin.name}" delivers the copy in '
                    "batches it cannot take back, so the copy must be able to go on after an "
                    f"interruption; {', '.join(tables)} cannot ({NO_KEY} to copy in order). "
                    "Give the table a primary key, or leave it out of the publication for the "
                    "copy. The slot made for it was dropped again")

    def take(self, proto: int, stop: Callable[[], bool], progress: Progress,
             publications: Sequence[str], drop_slot: Callable[[], object]) -> bool:
        """Copy the published tables through the pipeline, then mark the copy done at the
        slot's consistent point and make it durable. False if asked to stop first (the next
        run goes on with it, or copies again)."""
        copy = self.copy
        assert copy is not None
        pipeline, lsn = self.pipeline, self.lsn
        tables = copy.tables(publications)
        figures = progress.snapshot = SnapshotProgress(
            tables=len(tables), rows_estimate=sum(t.rows_estimate for t in tables))
        last_log = last_flush = time.monotonic()
        unflushed = 0  # chunks since the last flush
        # Copied in key order, a copy cut short goes on after the last key an output holds
        # of each range (as an incremental snapshot: docs/snapshot.md); else it starts again.
        resumable = all(t.ordered for t in tables)
        pipeline.begin_snapshot()
        if not resumable:
            self.refuse_unresumable([t.qualified for t in tables if not t.ordered], drop_slot)
        try:
            parts = copy.parts(tables)
            ledger = CopyLedger(self.slot, parts, Decoder(proto))
            if resumable:
                self.ledger = ledger
            for chunk in copy.chunks(parts, stop):
                table = chunk.table
                assert table.relation is not None
                saved = ledger.saved()
                first, finished = ledger.delivered(chunk)
                if resumable:
                    pipeline.note_snapshot_progress(ledger.record())
                try:
                    pipeline.snapshot_rows(table.relation, table.types, chunk.inserts, lsn,
                                           copy.read_time, first=first)
                except BaseException:
                    ledger.restore(saved)  # its transaction was cut short: not delivered
                    raise
                self.delivered = True
                if resumable:
                    pipeline.snapshot_checkpoint()
                figures.rows += len(chunk.inserts)
                figures.bytes += sum(map(len, chunk.inserts))
                progress.transactions = pipeline.transactions
                progress.changes = pipeline.changes
                if finished:
                    figures.tables_done += 1
                    figures.log(log, f"copied {table.qualified}")
                now = time.monotonic()
                unflushed += 1
                if resumable and (now - last_flush >= 1 or unflushed >= _CHECKPOINT_CHUNKS):
                    last_flush, unflushed = now, 0
                    pipeline.flush()
                if now - last_log >= PROGRESS_INTERVAL:
                    last_log = now
                    figures.log(log)
        except InterruptedError:
            log.info("stopped during the initial snapshot: the next run goes on with it")
            return False
        except psycopg.Error as exc:
            raise explain(exc, self.conninfo, self.slot) from None
        finally:
            self.close()
        if resumable:
            pipeline.note_snapshot_progress(None)
            pipeline.snapshot_checkpoint()
        pipeline.end_snapshot(lsn)
        pipeline.flush()
        self.pending = False
        figures.done = True
        figures.log(log, f"initial snapshot done, consistent with the slot at {lsn}")
        return True


def unfinished(tables: list[str]) -> SnapshotUnfinished:
    """The error of a run that stopped with ``tables`` not all copied yet."""
    return SnapshotUnfinished(
        f"stopped before the snapshot was complete: {', '.join(tables)} not (all) copied "
        "yet. What was delivered is in the outputs and acknowledged; run the same command "
        "again to go on with the copy from where it stopped")
