"""The benchmarks' shared workload: one seven-column table and its publication, and
transactions of 1000 mixed changes generated server-side.

Row g: ``id`` g, a text ``name``, ``amount numeric(12,2)``, ``created timestamptz``,
``active boolean``, ``tags text[]`` (NULL in every tenth row) and ``payload jsonb`` (NULL in
every seventh; quotes and non-ASCII text). Each transaction inserts TX_INSERTS new rows, then
updates the first TX_UPDATES and deletes the last TX_DELETES of the rows the transaction before
inserted (the first transaction only inserts): mostly inserts, some updates (no old tuple: the
key does not change) and deletes (key tuple).

The TOAST-heavy variant (``TOAST_SCHEMA`` after ``SCHEMA``, ``run_workload(..., toast=True)``)
adds a ``note text`` column stored out of line and uncompressed, 4-12 kB in every inserted row
(hex text, ``repeat(md5(g), 128 + g % 257)``); the updates leave it unchanged, so the server
sends them an unchanged-TOAST marker in its place.

The bulk-load shape (``run_bulk_workload``): transactions of BULK_INSERTS inserted rows, then
one UPDATE of a quarter of them and one DELETE of a tenth, each a transaction of its own:
the most common big workload, where the client, not the walsender, can be the bottleneck.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

TABLE = "bench_orders"
PUBLICATION = "bench_pub"
TX_INSERTS, TX_UPDATES, TX_DELETES = 800, 150, 50
BULK_INSERTS = 8000
PREFERRED_SYSTEM_MAJOR = 15

SCHEMA = f"""
CREATE TABLE {TABLE} (
    id bigint PRIMARY KEY,
    name text,
    amount numeric(12,2),
    created timestamptz,
    active boolean,
    tags text[],
    payload jsonb
);
CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE};
"""

_INSERT = """
INSERT INTO {table}
SELECT g,
       'customer ' || left(md5(g::text), 6 + (g %% 20)::int),
       (g %% 1000003) / 100.0,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1.5 seconds',
       g %% 3 <> 0,
       CASE WHEN g %% 10 = 0 THEN NULL
            ELSE ARRAY['tag' || g %% 7, 'a "quoted" tag', 'region-' || g %% 13] END,
       CASE WHEN g %% 7 = 0 THEN NULL
            ELSE jsonb_build_object('sku', 'SKU-' || g %% 997, 'qty', g %% 17,
                                    'note', 'line with ''quotes'' and ünïcode', 'ok', g %% 2 = 0)
       END{note}
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""
INSERT_ROWS = _INSERT.format(table=TABLE, note="")
TOAST_INSERT_ROWS = _INSERT.format(table=TABLE,
                                   note=",\n       repeat(md5(g::text), 128 + (g %% 257)::int)")
TOAST_SCHEMA = f"""
ALTER TABLE {TABLE} ADD COLUMN note text;
ALTER TABLE {TABLE} ALTER COLUMN note SET STORAGE EXTERNAL;
"""
UPDATE_ROWS = f"""
UPDATE {TABLE} SET amount = amount + 1.25, active = NOT active, name = name || ' (updated)'
WHERE id BETWEEN %(first)s AND %(last)s
"""
DELETE_ROWS = f"DELETE FROM {TABLE} WHERE id BETWEEN %(first)s AND %(last)s"


def run_workload(conn: psycopg.Connection[Any], changes: int, *, toast: bool = False) -> int:
    """Make exactly ``changes`` changes in transactions of up to 1000; returns ``changes``.
    ``toast``: the TOAST-heavy variant (the table must have had TOAST_SCHEMA)."""
    insert_rows = TOAST_INSERT_ROWS if toast else INSERT_ROWS
    done = block = 0
    while done < changes:
        first = block * TX_INSERTS + 1
        with conn.transaction():
            inserts = min(TX_INSERTS, changes - done)
            conn.execute(insert_rows, {"first": first, "last": first + inserts - 1})
            done += inserts
            previous = first - TX_INSERTS
            updates = min(TX_UPDATES, changes - done) if block else 0
            if updates:
                conn.execute(UPDATE_ROWS, {"first": previous, "last": previous + updates - 1})
                done += updates
            deletes = min(TX_DELETES, changes - done) if block else 0
            if deletes:
                last = previous + TX_INSERTS - 1
                conn.execute(DELETE_ROWS, {"first": last - deletes + 1, "last": last})
                done += deletes
        block += 1
    return done


def run_bulk_workload(conn: psycopg.Connection[Any], changes: int) -> int:
    """The bulk-load shape, about ``changes`` changes: inserts in transactions of
    BULK_INSERTS rows, then an UPDATE of every fourth row and a DELETE of every tenth (rows
    100 apart: no row both updated and deleted is counted twice). Returns the changes made."""
    rows = max(1, round(changes / (1 + 1 / 4 + 1 / 10)))
    for first in range(1, rows + 1, BULK_INSERTS):
        last = min(rows, first + BULK_INSERTS - 1)
        with conn.transaction():
            conn.execute(INSERT_ROWS, {"first": first, "last": last})
    with conn.transaction():
        updated = conn.execute(f"UPDATE {TABLE} SET amount = amount + 1.25, active = NOT active "
                               "WHERE id % 4 = 0").rowcount
    with conn.transaction():
        deleted = conn.execute(f"DELETE FROM {TABLE} WHERE id % 10 = 1").rowcount
    return rows + updated + deleted


def choose_bindir(requested: str | None) -> Path:
    """--bindir if given, else the system PostgreSQL 15, else the embedded server (18)."""
    from plugin_framework.cluster import (
        available_bindirs,
        embedded_bindir,
        server_major_version,
        system_bindirs,
    )

    if requested:
        return Path(requested)
    for bindir in system_bindirs():
        if server_major_version(bindir) == PREFERRED_SYSTEM_MAJOR:
            return bindir
    try:
        return embedded_bindir()
    except ImportError:
        bindirs = available_bindirs()
        if not bindirs:
            raise SystemExit("no PostgreSQL server binaries found; pass --bindir") from None
        return bindirs[0]
