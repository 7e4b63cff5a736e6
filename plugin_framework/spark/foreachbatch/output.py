"""The Output of a ``ForeachBatchPlugin``: durable up to what ``fn`` has finished (the slot
is acknowledged no further), and the snapshots' side of it, kept in the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugin_framework import LSN
from plugin_framework.framework import OutputError, OutputRecord
from plugin_framework.framework.outputs import Batching, RecordingSnapshots

if TYPE_CHECKING:
    from plugin_framework.spark.foreachbatch.batching import MicroBatcher

__all__ = ["MicroBatchOutput"]


class MicroBatchOutput(Batching, RecordingSnapshots):
    """The Output of a ForeachBatchPlugin: durable up to what ``fn`` has finished.

    It takes snapshots (docs/snapshot.md) as FileOutput does, through the checkpoint: whether
    an initial copy is under way, and how far the snapshot is whose rows the batches hold."""

    # A copy that could not go on after an interruption would be taken again whole, and
    # batches already delivered cannot be taken back: such a copy is refused.
    copy_must_resume = True

    def __init__(self, plugin: MicroBatcher) -> None:
        self.plugin = plugin
        self.durable_lsn = LSN(0)
        self._ctx: Any = None

    def attach(self, ctx: Any) -> None:
        """The context of the pipeline member this output serves (its options say where the
        checkpoint is, which the source asks about before startup)."""
        self._ctx = ctx

    # --- snapshots ------------------------------------------------------------------------

    @property
    def snapshot_state(self) -> str | None:
        """Where the initial copy stands (framework.statecheck.SNAPSHOT_STATES)."""
        return self.plugin._checkpoint_of(self._ctx).snapshot_state

    @property
    def resume_incremental(self) -> dict[str, Any] | None:
        """How far the snapshot is whose rows the delivered batches hold."""
        return self.plugin._checkpoint_of(self._ctx).snapshot_progress

    def begin_snapshot(self) -> None:
        self.plugin._checkpoint_of(self._ctx).set_snapshot_state("copying")

    def note_incremental(self, state: dict[str, Any] | None) -> None:
        """Said before the snapshot rows it goes with; each batch records the progress of
        the last snapshot rows in it (so no ``snapshot_checkpoint`` is needed)."""
        self.plugin._note_progress(state)

    def snapshot_checkpoint(self) -> None:
        """Nothing to do: each batch records the progress of its snapshot rows itself."""

    def continue_snapshot(self) -> None:
        """The copy, cut short, goes on as an incremental snapshot: recorded so."""
        checkpoint = self.plugin._checkpoint_of(self._ctx)
        if checkpoint.snapshot_state is not None:
            checkpoint.set_snapshot_state("incremental")

    def end_snapshot(self) -> None:
        """The copy is complete: its last rows are delivered now (their batch is the first
        the targets may be consistent as of), then it is recorded done."""
        self.plugin.drain(completes_copy=True)
        checkpoint = self.plugin._checkpoint_of(self._ctx)
        if checkpoint.snapshot_state is not None:
            checkpoint.set_snapshot_state("done")

    # --- the Output protocol --------------------------------------------------------------

    def write(self, record: OutputRecord) -> None:
        raise OutputError("the spark emitter delivers DataFrames; it has nothing to write")

    def mark(self, lsn: LSN) -> None:
        self.plugin._on_mark(lsn)

    def flush(self) -> LSN:
        self.durable_lsn = self.plugin._on_flush()
        return self.durable_lsn

    def drain(self) -> None:
        """Deliver the batch being filled now (a source calls this before its last status
        update, so that the acknowledgement covers it)."""
        self.plugin.drain()

    def close(self) -> None:
        self.plugin._on_close()
