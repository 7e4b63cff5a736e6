"""What an incremental snapshot holds while it reads a table (``TableRead``) and one chunk of
it between its watermarks (``Window``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from plugin_framework.protocol import LSN
from plugin_framework.sources.snapshots.catalog import Key, Range, TableCopy
from plugin_framework.sources.snapshots.toasted import Move, Moves


@dataclass
class Window:
    """One chunk between its watermarks."""

    chunk_id: str
    table: str  # schema.table
    after: Key | None  # the chunk is the rows after this key (None: the table's first)
    inserts: list[bytes]
    keys: list[Key]
    open: bool = False  # the low watermark has come by in the stream
    changed: set[Key] = field(default_factory=set)
    # the table's changes in the window, in order
    moves: list[Move] = field(default_factory=list)
    dirty: bool = False  # a streamed or prepared transaction crossed it
    # read again for a batch planned again (Spark's source): every row, at the high watermark
    replay: bool = False
    low: LSN | None = None  # the watermarks' places in the WAL (None: not known)
    high: LSN | None = None
    moved: list[Key] | None = None  # the keys of moved rows read again (toasted.Moves)
    noted: int = 0  # how many moves were noted before its low watermark (toasted.Moves)

    def rewind(self) -> None:
        """The stream is read again from before the low watermark (a peek at a slot)."""
        self.open = self.replay
        self.changed = set()
        self.moves = []
        self.dirty = False


@dataclass
class TableRead:
    """A table an incremental snapshot reads: where it is, what is left of it."""

    copy: TableCopy  # read in the order of copy.key
    after: Key | None = None  # the last key delivered
    upto: Key | None = None  # the end of the range being read (None: the table's last key)
    # the ranges to read after that one (an initial copy's ranges: snapshot.CopyLedger)
    ranges: list[Range] = field(default_factory=list)
    rows: int = 0
    retries: int = 0
    moves: Moves = field(default_factory=Moves)  # rows to read again once its chunks are
    keys_only: bool = False  # only the rows under keys asked for (``moves``) are read
