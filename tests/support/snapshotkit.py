"""What the initial and incremental snapshot tests share (test_snapshot.py,
test_spark_snapshot.py, test_cli_mirror.py): the published tables and a writer that changes
them throughout, a command killed with SIGKILL again and again during the copy, whether a
copy is under way or done, and the checks of what a consumer that upserts the lines holds."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from plugin_framework import LSN
from support.jsonmirror import server_tables
from support.streamkit import query, slot_row, start_cli, wait_for

TABLES = [("public", "big"), ("public", "part")]
ROWS = 200_000


# A value stored out of line (TOAST): 9,600 characters no compression shortens, so that the
# copy reads it from the TOAST table and the stream's updates that leave it alone omit it
TOASTED = "(SELECT string_agg(md5({seed}::text || i), '') FROM generate_series(1, 300) i)"


def make_tables(conninfo: str, rows: int = ROWS) -> None:
    query(conninfo, f"""
        CREATE TABLE big (id int PRIMARY KEY, n numeric, a int[], t text, note text);
        ALTER TABLE big ALTER COLUMN t SET STORAGE EXTERNAL;  -- out of line, uncompressed
        INSERT INTO big SELECT g, g * 1.5, ARRAY[g, NULL, -g],
            CASE WHEN g % 997 = 0 THEN {TOASTED.format(seed="g")} ELSE 'r' || g END,
            CASE WHEN g % 3 = 0 THEN NULL ELSE 'x' || g END
          FROM generate_series(1, {rows}) g;
        CREATE TABLE part (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
        CREATE TABLE part_lo PARTITION OF part FOR VALUES FROM (MINVALUE) TO (500000);
        CREATE TABLE part_hi PARTITION OF part FOR VALUES FROM (500000) TO (MAXVALUE);
        INSERT INTO part SELECT g * 7, 'p' || g FROM generate_series(1, {rows // 10}) g;
        CREATE TABLE unpublished (id int PRIMARY KEY);
        INSERT INTO unpublished SELECT generate_series(1, 100);
        CREATE PUBLICATION pub FOR TABLE big, part WITH (publish_via_partition_root = true);
    """)


class Writer(threading.Thread):
    """Changes the published tables, one small transaction at a time, until stopped."""

    def __init__(self, conninfo: str, seed: int, pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.conninfo = conninfo
        self.random = random.Random(seed)
        self.pause = pause  # seconds between transactions
        self.done = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        r = self.random
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.done.is_set():
                    k = r.randint(1, ROWS)
                    choice = r.randrange(7)
                    if choice == 0:
                        conn.execute("INSERT INTO big VALUES (%s, 0.1, '{}', %s, NULL) "
                                     "ON CONFLICT DO NOTHING",
                                     (10_000_000 + self.ops, r.randbytes(r.choice((1, 4500)))
                                      .hex()))
                    elif choice == 1:  # half of them of a row with a TOASTed value
                        if r.random() < 0.5:
                            k = 997 * r.randint(1, ROWS // 997)
                        conn.execute("UPDATE big SET n = n + 1, note = 'u' WHERE id = %s", (k,))
                    elif choice == 2:  # a key change
                        conn.execute("UPDATE big SET id = id + 20000000 WHERE id = %s", (k,))
                    elif choice == 3:
                        conn.execute("DELETE FROM big WHERE id = %s", (k,))
                    elif choice == 4:  # into the other partition
                        conn.execute("UPDATE part SET id = id + 700000 WHERE id = %s", (k * 7,))
                    elif choice == 5:
                        conn.execute("DELETE FROM part WHERE id = %s", (7 * (k // 10),))
                    else:
                        with conn.transaction():
                            conn.execute("INSERT INTO part VALUES (%s, 'new') "
                                         "ON CONFLICT DO NOTHING", (-self.ops,))
                            conn.execute("UPDATE unpublished SET id = id WHERE id = 1")
                    self.ops += 1
                    if self.pause:
                        time.sleep(self.pause)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        if self.error is not None:
            raise self.error


def kill_during(command: list[str], env: dict[str, str], stderr: Path, *, kills: int,
                attempts: int, until: Callable[[int], Callable[[], bool]],
                under_way: Callable[[], bool], group: bool = False) -> None:
    """Start the command and kill -9 it once ``until(attempt)()`` is true (or it exits),
    again and again, until ``kills`` of the kills found the snapshot ``under_way``.
    ``group``: the command and its children (Spark's JVM) are killed together."""
    found = 0
    for attempt in range(attempts):
        proc = start_cli(command, env=env, stderr_path=stderr, new_session=group)
        try:
            reached = until(attempt)

            def stopped(proc: Any = proc, reached: Callable[[], bool] = reached) -> bool:
                return proc.poll() is not None or reached()

            wait_for(stopped, timeout=600, interval=0.01, what="some of the copy written")
            found += under_way()
        finally:
            if group and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        if found >= kills:
            return
    raise AssertionError(f"{found} of {attempts} kills found the snapshot under way, not "
                         f"{kills}")


def assert_copied_once(lines: list[dict[str, Any]], asked_again: bool = False) -> None:
    """No row copied twice, and no change of the stream delivered twice (each has its own
    LSN; a restart must not write again what the file holds). ``asked_again``: a mirror
    asks for a row again once an update left its TOAST value out while it did not hold the
    row, so a row may be copied again after such an update (never otherwise)."""
    copied: set[tuple[str, Any]] = set()
    left_out: set[tuple[str, Any]] = set()
    twice = []
    for ln in lines:
        if ln["op"] == "update" and ln["unchanged_toast"]:
            left_out.add((ln["table"], ln["new"]["id"]))
        elif ln["op"] == "snapshot":
            key = (ln["table"], ln["new"]["id"])
            if key in copied and not (asked_again and key in left_out):
                twice.append(key)
            copied.add(key)
            left_out.discard(key)
    assert copied, "no snapshot rows"
    assert not twice, f"{len(twice)} rows copied twice, e.g. {twice[:3]}"
    changes = Counter((ln["lsn"], ln["op"], ln["table"]) for ln in lines
                      if ln["op"] in ("insert", "update", "delete"))
    twice = [k for k, n in changes.items() if n > 1]
    assert not twice, f"{len(twice)} changes delivered twice, e.g. {twice[:3]}"


def check_upserted(db: Any, lines: list[dict[str, Any]],
                   tables: Sequence[tuple[str, str]] = (("public", "later"),),
                   asked_again: bool = False) -> None:
    """No row copied twice (see assert_copied_once), and upserting the lines by id (as a
    consumer of a snapshot that went on after an interruption, or of an incremental one,
    must) gives the tables."""
    assert_copied_once(lines, asked_again)
    expected = server_tables(db, list(tables), {})
    for schema, table in tables:
        got = apply_upserts(lines, table)
        want = {r["id"]: r for r in expected[schema, table]}
        assert got == want, f"{table}: {row_differences(got, want, lines, table)}"


def row_differences(got: dict[Any, dict[str, Any]], want: dict[Any, dict[str, Any]],
                    lines: list[dict[str, Any]], table: str) -> str:
    """What differs between the rows the lines give and the table's, briefly: the keys on
    one side only, and a few differing rows with every line of the file about them (the
    whole diff of two large tables says nothing a reader can use)."""
    only_got = sorted(got.keys() - want.keys())
    only_want = sorted(want.keys() - got.keys())
    differ = sorted(k for k in got.keys() & want.keys() if got[k] != want[k])
    report = [f"{len(only_got)} rows not in the table {only_got[:10]}",
              f"{len(only_want)} rows missing {only_want[:10]}",
              f"{len(differ)} rows differing"]
    def brief(row: dict[str, Any] | None) -> Any:
        return row and {k: v[:20] + "..." if isinstance(v, str) and len(v) > 24 else v
                        for k, v in row.items()}

    for key in (differ[:3] + only_got[:2] + only_want[:2]):
        report.append(f"row {key}: lines give {brief(got.get(key))}, "
                      f"the table has {brief(want.get(key))}")
        for ln in lines:
            if ln.get("table") == table and key in (
                    (ln.get("new") or {}).get("id"), (ln.get("old") or {}).get("id")):
                report.append(f"  {ln['op']} lsn={ln.get('lsn')} old={brief(ln.get('old'))} "
                              f"new={brief(ln.get('new'))} "
                              f"unchanged={ln.get('unchanged_toast')}")
    return "\n".join(report)


def copy_status(state: str | None, left: dict[str, Any] | None) -> tuple[bool, bool]:
    """(under way, finished): the initial copy (``state``, "copying" or "done"), and the
    tables left of it (``left``, the recorded progress) that a run after an interruption
    copies incrementally."""
    going_on = copy_left(left)
    return state == "copying" or going_on, state == "done" and not going_on


def copy_left(left: dict[str, Any] | None) -> bool:
    """Whether recorded progress (``left``) holds tables still to copy: those queued, or
    the one an incremental run was in (its "table"; the initial copy queues it too)."""
    return bool((left or {}).get("queue")) or "table" in (left or {})


def wait_acknowledged_slot(conninfo: str, slot: str, lsn: LSN) -> None:
    wait_for(lambda: LSN((slot_row(conninfo, slot) or {}).get("confirmed_flush_lsn") or 0)
             >= lsn, timeout=120, what=f"slot {slot} acknowledged")


def change_later(conninfo: str, stop: threading.Event, seed: int, rows: int) -> None:
    """Insert, update, change the key of and delete rows of table "later" until ``stop``.
    Inserted keys are 100,000 and up; a key changes to its negative: below every key, where
    the chunks have been, so that a row not copied yet moves into the part copied (leaving
    its TOASTed value out: toasted.Moves). Apart, so that no statement fails on a duplicate
    key (the writer would stop early). At most about 2,000 statements a second: an
    incremental snapshot moves one chunk per trip of its watermarks through the stream, so
    a writer that outruns the stream (as an unpaced one did on a loaded machine, the stream
    minutes behind) stalls the snapshot; the test is of what it copies, not of that race."""
    r = random.Random(seed)
    statements = ["INSERT INTO later VALUES (%s, 'new', 0) ON CONFLICT DO NOTHING",
                  "UPDATE later SET v = 'u', n = n + 1 WHERE id = %s",
                  "UPDATE later SET id = -id WHERE id = %s",
                  "DELETE FROM later WHERE id = %s"]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        n = 0
        while not stop.is_set():
            choice = r.randrange(4)
            conn.execute(statements[choice],
                         (100_000 + n if choice == 0 else r.randint(1, rows),))
            n += 1
            if n % 20 == 0:
                time.sleep(0.01)


MISSING = "<an unchanged TOAST value the consumer does not have>"


def apply_upserts(lines: list[dict[str, Any]], table: str,
                  key: str = "id") -> dict[Any, dict[str, Any]]:
    """What a consumer that upserts by key (column ``key``) does with one table's lines: an
    incremental snapshot's rows come after changes of rows it does not have yet (whose
    unchanged TOAST values it then lacks: MISSING, until a later line of the row carries
    them)."""
    rows: dict[Any, dict[str, Any]] = {}
    for ln in lines:
        if ln.get("table") != table:
            continue
        op = ln["op"]
        if op == "truncate":
            rows.clear()
        if op in ("update", "delete"):
            before = ln["old"] if ln["old"] is not None else ln["new"]
            previous = rows.pop(before[key], {})
        if op in ("insert", "snapshot", "update"):
            row = dict(ln["new"])
            for column in ln.get("unchanged_toast", []):
                row[column] = previous.get(column, MISSING)
            rows[row[key]] = row
    return rows
