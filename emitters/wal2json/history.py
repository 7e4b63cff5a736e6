"""Which of today's pg_attribute rows a decoded column was when its change was made.

wal2json reads the catalog as it was at the change (the historic snapshot); pgdecode reads
today's. A Relation message names the columns as they were, in attnum order, without
attnums, so after ``RENAME COLUMN`` or ``DROP COLUMN`` a column's name no longer finds its
row. attnums never change and a dropped column keeps its row (named
``........pg.dropped.N........``), so most columns can still be placed exactly:

1. a column whose name (and type) a live row still has is that row, provided the matches
   keep attnum order;
2. the columns between two placed ones (or after the last) are the unclaimed rows between
   them when there are exactly as many of those rows as columns: each column's own row is
   among them, so the pairing in attnum order is the only one.

Anything else (more candidate rows than columns: a column list, a column dropped before the
change; or no rows at all: the table was dropped) is left unplaced, and the emitter warns
instead of printing today's values as if they were the historic ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AttributeRow:
    """The part of a pg_attribute row that placing a column needs."""

    attnum: int
    name: str
    type_oid: int
    dropped: bool
    generated: bool


def place_columns(columns: Sequence[tuple[str, int]],
                  rows: Sequence[AttributeRow]) -> list[AttributeRow | None]:
    """For each decoded column (name, type OID), its row today, or None where that is not
    certain."""
    rows = sorted(rows, key=lambda r: r.attnum)
    # Generated columns are sent only where the publication asks (publish_generated_columns,
    # PostgreSQL 18): then one of them is among the columns by name.
    names = {name for name, _ in columns}
    generated = any(r.generated and not r.dropped and r.name in names for r in rows)
    candidates = [i for i, r in enumerate(rows) if r.dropped or generated or not r.generated]
    if len(candidates) == len(columns):  # no room for doubt: each column's row is here
        return [rows[i] for i in candidates]
    by_name = {r.name: i for i, r in enumerate(rows) if not r.dropped}
    placed: list[int | None] = []
    last = -1
    for name, type_oid in columns:
        i = by_name.get(name)
        if i is not None and i > last and rows[i].type_oid == type_oid:
            placed.append(i)
            last = i
        else:
            placed.append(None)
    claimed = {i for i in placed if i is not None}
    out: list[AttributeRow | None] = [None if i is None else rows[i] for i in placed]
    # the runs of unplaced columns, each between two placed ones (or the ends)
    j = 0
    while j < len(placed):
        if placed[j] is not None:
            j += 1
            continue
        end = j
        while end < len(placed) and placed[end] is None:
            end += 1
        low = placed[j - 1] if j > 0 else -1
        high = placed[end] if end < len(placed) else len(rows)
        assert low is not None and high is not None
        free = [rows[i] for i in candidates if low < i < high and i not in claimed]
        if len(free) < end - j:
            # a name match was wrong (a name given to another column since): trust none
            return [None] * len(columns)
        if len(free) == end - j:
            out[j:end] = _pair(columns[j:end], free)
        j = end
    return out


def _pair(columns: Sequence[tuple[str, int]],
          rows: Sequence[AttributeRow]) -> list[AttributeRow | None]:
    """Columns and as many rows, in order, between two columns placed by name; a live row of
    another type is left unplaced (a type changed since, or a wrong name match)."""
    return [row if row.dropped or row.type_oid == type_oid else None
            for (_name, type_oid), row in zip(columns, rows, strict=True)]
