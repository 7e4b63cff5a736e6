"""Rows an incremental snapshot gives again because the stream left a value out of them.

An UPDATE that does not change a TOASTed (out-of-line) value does not send it: the consumer
is to keep the one it has. During an incremental snapshot it may have none, for a row whose
chunk is not copied yet. Two cases (incremental.py delivers what these give):

- The update comes inside the window of the row's own chunk: the chunk leaves the row to the
  stream, and ``made_whole`` gives it again at the high watermark, as the window's changes
  made it, with the values they left out taken from the chunk's read.
- The update moves the row to another key (a key change): a later chunk reads the row only
  if the new key is in a part of the table not copied yet. ``Moves`` keeps the new keys of
  such rows until a read gives them; those left when the table's chunks are done are read
  again, as a chunk of their own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from plugin_framework.protocol import Decoder, Insert, TupleData, Update, encode
from plugin_framework.sources.snapshots.catalog import Key

UNCHANGED = ord("u")  # a TupleData column kind: an unchanged TOAST value, not sent


# a change of the table in a window: (old key, new key, new row); an insert has no old key,
# a delete no new key or row
Move = tuple[Key | None, Key | None, TupleData | None]


def made_whole(moves: Sequence[Move], chunk: dict[Key, bytes], relid: int, ncols: int,
               decoder: Decoder) -> list[tuple[Key, bytes]]:
    """Rows of the chunk (``chunk``: its Insert messages by key) that the window's changes
    (``moves``, in order) left to the stream, and whose last change left a TOASTed value
    out. Each is given again, as that change made it, with the values left out taken back
    along its changes to the row as the chunk read it: a value no change set is the
    chunk's, else the last one set. Only for rows under a key of the chunk (no later chunk
    reads them; a row moved elsewhere is ``Moves``'). Returns (key, Insert message)s."""
    if not any(new is not None and UNCHANGED in new.kinds for _, _, new in moves):
        return []
    rows: dict[Key, TupleData] = {}  # each changed row under its key now, as made whole
    touched: set[Key] = set()  # keys a change had: the chunk's row there is gone
    left_out: set[Key] = set()  # rows whose last change left a value out
    for old, new_key, new in moves:
        before = rows.pop(old, None) if old is not None else None
        if before is None and old is not None and old in chunk and old not in touched:
            read = decoder.decode(chunk[old])
            assert isinstance(read, Insert)
            before = read.new
        touched.update(k for k in (old, new_key) if k is not None)
        if new_key is None or new is None:  # deleted
            continue
        if len(new) != ncols:  # the table's columns changed in the window: as it is
            return []
        if UNCHANGED in new.kinds:
            left_out.add(new_key)
        else:
            left_out.discard(new_key)
        if UNCHANGED in new.kinds and before is not None:
            kinds, values = bytearray(new.kinds), list(new.values)
            for i, kind in enumerate(new.kinds):
                if kind == UNCHANGED:
                    kinds[i], values[i] = before.kinds[i], before.values[i]
            new = TupleData(bytes(kinds), tuple(values))
        rows[new_key] = new
    return [(key, encode(Insert(relid, row))) for key, row in rows.items()
            if key in left_out and key in chunk and UNCHANGED not in row.kinds]


class Moves:
    """The new keys of the table's rows that an UPDATE moved to another key leaving a
    TOASTed value out, until a read of the table gives the row whole (a chunk, or a read
    again of these keys, which drops those it finds no row under). Notes only add: a change
    that would take a key off may be in a transaction that is rolled back (streamed or
    prepared ones come before their outcome), and a key too many costs only a read. Each key
    has the number of the note that added it, so that a read knows which keys it answers
    for: those noted before its low watermark."""

    def __init__(self, keys: Iterable[Key] = ()) -> None:
        self.keys: dict[Key, int] = {}
        self.noted = 0
        self.read_all = False  # the table's chunks are read: every row was copied once
        for key in keys:
            self._add(key)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def add(self, keys: Iterable[Key]) -> None:
        """Keys to read again whatever the stream says of them (asked for: a request's)."""
        for key in keys:
            self._add(key)

    def _add(self, key: Key) -> None:
        self.noted += 1
        self.keys[key] = self.noted

    def note(self, message: Update, positions: Sequence[int]) -> bool:
        """An UPDATE of the table, in stream order (``positions``: of the key's columns);
        whether it added a key. Once the chunks are read, only a row the consumer may lack
        (moved from a key still to read again) is: the others it has, copied."""
        if UNCHANGED not in message.new.kinds:
            return False
        before = message.key if message.key is not None else message.old
        if before is None:
            return False  # the key did not change
        new = tuple(message.new.values[i] for i in positions)
        old = tuple(before.values[i] for i in positions)
        if old == new or (self.read_all and old not in self.keys):
            return False
        self._add(new)
        return True

    def delivered(self, keys: Iterable[Key], noted: int) -> None:
        """Rows given whole (``keys`` read, by a read after note number ``noted``)."""
        for key in keys:
            if self.keys.get(key, noted + 1) <= noted:
                del self.keys[key]

    def first(self, n: int) -> list[Key]:
        return list(itertools.islice(self.keys, n))
