"""The reorder buffer's state of one transaction being received: ordinary, prepared or
streamed.

``Transaction`` (model.py) is the ReorderBufferTXN that plugins see; ``TxnState`` is the rest
of what ReorderBufferTXN holds for the reorder buffer itself: who receives the transaction
live and who later, its spilled changes (``Spool``, as ReorderBufferSerializeTXN spills), the
relations it redescribes, its aborted subtransactions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugin_framework.framework.context import FastChange
from plugin_framework.framework.model import Relation, Transaction
from plugin_framework.framework.reorder.members import Member
from plugin_framework.framework.spool import Spool
from plugin_framework.protocol import LSN

# One live member of a transaction on the fast path: the member, its view of the
# transaction, and its formatter for a relation (None: its change callback).
FastWriter = tuple[Member, Transaction, FastChange | None]
# In a fast-path cache (``TxnState.fast``): a relation not looked at yet.
UNPLANNED: Any = object()
# A raw change filter's verdicts on a raw row change (ReorderBufferState.raw_change_filter):
# the change_filter would drop it, would pass it unaltered, or must be asked.
RAW_DROP, RAW_PASS, RAW_UNSURE = 0, 1, 2


@dataclass(eq=False)
class Block:
    """A stream block held back from the members that may decline the transaction at
    PREPARE (``TxnState.deferred``): until the next message tells whether it is the
    remainder the server streams at PREPARE (then a declining member gets it at COMMIT
    PREPARED, and never at ROLLBACK PREPARED) or a block it streamed for its memory limit
    (then every streaming member has it now, as in PostgreSQL)."""

    spool: Spool
    relations: dict[int, Relation]  # the definitions in force when the block started
    start_lsn: LSN
    stop_lsn: LSN = field(default_factory=LSN)
    subxids: set[int] = field(default_factory=set)  # subtransactions with changes in it

    def close(self) -> None:
        self.spool.close()


class PipelineError(Exception):
    """The stream cannot be delivered with the promised semantics."""


@dataclass(eq=False)
class TxnState:
    """A transaction being received (members are named by their index in the pipeline)."""

    base: Transaction
    views: dict[int, Transaction] = field(default_factory=dict)  # member index -> its view
    live: list[int] = field(default_factory=list)  # members receiving callbacks as it goes
    held: list[int] = field(default_factory=list)  # members waiting for a replay from spool
    streamed_held: list[int] = field(default_factory=list)  # got stream blocks, await outcome
    skipped: list[int] = field(default_factory=list)  # filtered by origin
    # two-phase members whose output already holds this PREPARE (the server re-sent it
    # after a restart): they skip it, and get only its COMMIT/ROLLBACK PREPARED
    outcome_only: list[int] = field(default_factory=list)
    spool: Spool | None = None
    started: bool = False
    relations: dict[int, Relation] = field(default_factory=dict)  # in-stream descriptions
    # for a transaction replayed from its spool after self.relations moved on: the definitions
    # in force when it began of the relations it redescribes (None: it described them first)
    replay_relations: dict[int, Relation | None] = field(default_factory=dict)
    # each takes back from one live member's output what it wrote of this transaction
    # (ordinary and prepared transactions, whose lines are the tail of that output)
    rollbacks: list[Callable[[], None]] = field(default_factory=list)
    aborted_subxids: set[int] = field(default_factory=set)
    in_block: list[int] = field(default_factory=list)  # members in the current stream block
    # Streaming members that get no block before the next message (see Block): those
    # without two-phase callbacks or with a filter_prepare, which may not take the
    # transaction at PREPARE. They are in ``live`` too.
    deferred: list[int] = field(default_factory=list)
    block: Block | None = None  # the block being received or awaiting its verdict
    blocks: int = 0  # Stream Starts received (the first block is never the remainder)
    # it changed the catalog, as far as pgoutput tells (a TRUNCATE, a relation described
    # again): its commit record then carries invalidations, which ReorderBufferCommit queues
    # as a last change at the commit's LSN
    catalog_changes: bool = False
    remainder: Block | None = None  # the block streamed at PREPARE, for streamed_held
    # subtransactions with changes in blocks the deferred members had: each gets its own
    # stream_abort at ROLLBACK PREPARED, as ReorderBufferAbort does for a streamed subtxn
    streamed_subxids: set[int] = field(default_factory=set)
    prepare_lsn: LSN | None = None
    block_lsn: LSN = field(default_factory=LSN)  # where the current stream block started
    # held members (held, streamed_held) whose output holds it durably: their entry (hold.py)
    entries: dict[int, Path] = field(default_factory=dict)
    restored: bool = False  # taken from the outputs' entries when the pipeline started
    # For an ordinary or prepared transaction with live members that have a fast_change
    # callback: per relation id, each live member with its view and its formatter, or None
    # when no live member has a formatter for that relation.
    fast: dict[int, list[FastWriter] | None] | None = None
    # The same under a change_filter: used for a change the filter passes unaltered (the raw
    # message then says exactly what the change callback would get), after the filter.
    filtered_fast: dict[int, list[FastWriter] | None] | None = None
    # Under a change_filter with a raw_change_filter: per relation id in ``fast``, the raw
    # filter's verdict function (``fast`` then holds writers only for relations that have
    # one; the others' changes are decoded and filtered).
    raw_filters: dict[int, Callable[[bytes], int]] | None = None
    # row changes received, and TRUNCATEd relations, by (xid, relation id, pgoutput tag): the
    # pipeline's ``delivered`` counts once the transaction commits. The xid is a streamed
    # change's (sub)transaction, whose counts go with its abort; 0 for the others.
    counts: dict[tuple[int, int, int], int] = field(default_factory=dict)
