"""How far an initial copy is, as the outputs record it: ``CopyLedger`` (each range's last
key delivered, the record an interrupted copy goes on from), and what the outputs record of
an initial copy (its state, its progress)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugin_framework.framework.outputs import RecordingSnapshots, capable
from plugin_framework.protocol import (
    Decoder,
)
from plugin_framework.sources.errors import SourceError
from plugin_framework.sources.snapshots.catalog import Range, key_text, ranges_text, row_key
from plugin_framework.sources.snapshots.copy import Chunk, Part


class CopyLedger:
    """How far an initial copy was delivered, as its progress record says: the tables done,
    and of each table begun, the last key delivered of each of its ranges (the record
    ``IncrementalSnapshot.resume`` goes on from, each range after its key)."""

    def __init__(self, slot: str, parts: Sequence[Part], decoder: Decoder) -> None:
        self.slot, self.decoder = slot, decoder
        self.tables = list(dict.fromkeys(p.table.qualified for p in parts))
        # of each table, its ranges not done: index -> (last key delivered, upto)
        self.left: dict[str, dict[int, Range]] = {name: {} for name in self.tables}
        for p in parts:
            self.left[p.table.qualified][p.index] = (p.after, p.upto)
        self.split = {p.table.qualified for p in parts if p.index > 0}
        self.done: list[str] = []
        self.started: set[str] = set()

    def saved(self) -> tuple[Any, ...]:
        """Its state now, for ``restore``."""
        return ({name: dict(left) for name, left in self.left.items()}, list(self.done),
                set(self.started))

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Back to a ``saved`` state: a chunk taken as delivered was not (its transaction
        was cut short)."""
        self.left, self.done, self.started = saved

    def delivered(self, chunk: Chunk) -> tuple[bool, bool]:
        """Take a chunk as delivered: (whether it is its table's first, whether its table is
        now done)."""
        name = chunk.table.qualified
        first = name not in self.started
        self.started.add(name)
        ranges = self.left[name]
        if chunk.last:
            del ranges[chunk.part]
        elif chunk.inserts and chunk.table.ordered:  # (else it has no key to go on after)
            ranges[chunk.part] = (row_key(self.decoder, chunk.table, chunk.inserts[-1]),
                                  ranges[chunk.part][1])
        if not ranges:
            self.done.append(name)
        return first, not ranges

    def record(self) -> dict[str, Any]:
        """The progress record: a table not split under "after" (its last key), a split one
        under "ranges" (its ranges not done, each [last key or the range's lower bound,
        upto], None for none); a table not begun under neither."""
        after: dict[str, list[str | None]] = {}
        ranges: dict[str, list[list[list[str | None] | None]]] = {}
        for name in self.tables:
            if name not in self.started or name in self.done:
                continue
            left = [self.left[name][n] for n in sorted(self.left[name])]
            if name in self.split:
                ranges[name] = ranges_text(left)
            elif left[0][0] is not None:
                after[name] = key_text(left[0][0])
        state: dict[str, Any] = {
            "slot": self.slot, "initial": True, "done": list(self.done),
            "queue": [name for name in self.tables if name not in self.done],
            "after": after}
        if ranges:
            state["ranges"] = ranges
        return state


def check_snapshot_outputs(pipeline: Any) -> None:
    """Refuse, before the slot is made, outputs that cannot record an unfinished copy
    (``begin_snapshot``): a run after an interrupted copy could not tell that it must copy
    again, and their rows would be missing without a word."""
    for m in pipeline.members:
        if not capable(m.ctx.output, RecordingSnapshots):
            raise SourceError(
                f'--snapshot: output plugin "{m.plugin.name}" cannot take the initial '
                "snapshot yet (its output cannot record a copy that did not finish). "
                "Nothing was created or streamed. Write the copy with another emitter to "
                "a file or stdout, or stream without --snapshot")


def any_output_in(pipeline: Any, state: str) -> bool:
    """Whether an output of ``pipeline`` records its initial copy as ``state`` ("copying":
    it did not finish; "done")."""
    return any(capable(m.ctx.output, RecordingSnapshots)
               and m.ctx.output.snapshot_state == state for m in pipeline.members)


def recorded_progress(pipeline: Any) -> dict[str, Any] | None:
    """How far an output's snapshot was (FILE.progress, a Spark checkpoint), if one records
    it."""
    for m in pipeline.members:
        state = m.ctx.output.resume_incremental \
            if capable(m.ctx.output, RecordingSnapshots) else None
        if state:
            return dict(state)
    return None
