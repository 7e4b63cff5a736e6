"""The mirrors (``TableStateWriter``, ``DeltaTableWriter``, ``HistoryWriter``) against
the server's tables,
on each version: a seeded random workload of typed values (numerics, arrays with NULLs,
jsonb, dates and timestamps BC and infinite), key-change chains (within a batch and across
batches), updates that leave TOAST values unchanged, deletes and reinserts of a key,
rolled-back savepoints, two-phase commits and rollbacks, large transactions the server
streams (logical_decoding_work_mem is 64kB), TRUNCATE, a REPLICA IDENTITY FULL table, then
columns renamed, added, retyped and dropped, delivered in batches of 1, 7 and 10,000 changes
(those of 7 each twice, as after a crash) from a two-phase slot; after each, every sink
equals ``SELECT *`` value by value, every row carries the commit LSN of the change that
wrote it, and the history gives the tables as they were after each transaction. Batches of
10,000 also check split_tables' old keys and change_feed (commit versions and times, and a
replay by key giving the table)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.spark_fixtures import (  # noqa: F401
    _norm,
    delta_rows,
    epoch_numbers,
    spark_session,
    state_rows,
    table_columns,
    table_rows,
)

from plugin_framework.spark import (
    DeltaTableWriter,
    ForeachBatchStream,
    HistoryWriter,
    TableStateWriter,
    change_feed,
    read_delta,
    split_tables,
)
from plugin_framework.spark.mirrors.deltatables import delta_arrow
from plugin_framework.spark.mirrors.statefiles import StateFiles

pytestmark = pytest.mark.slow

TABLES = ("public.m_pk", "public.m_full")
SCHEMA = """
CREATE TABLE m_pk (id int PRIMARY KEY, v int, big text, note text, amount numeric(12,2),
    tags int[], doc jsonb, at timestamptz, day date);
ALTER TABLE m_pk ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE m_full (a int, b text, big text);
ALTER TABLE m_full ALTER COLUMN big SET STORAGE EXTERNAL;
ALTER TABLE m_full REPLICA IDENTITY FULL;
CREATE PUBLICATION mirror_pub FOR TABLE m_pk, m_full;
"""


def big(r: random.Random) -> str:
    return "".join(r.choice("abcdef0123456789") for _ in range(16)) * 400  # 6.4 kB, TOASTed


def typed(r: random.Random) -> tuple[Any, ...]:
    """Values of m_pk's typed columns (amount, tags, doc, at, day), NULLs, infinities and
    years BC among them (Spark holds an infinite date or timestamp as NULL: docs/spark.md)."""
    amount = r.choice([None, Decimal(r.randint(-10**11 + 1, 10**11 - 1)) / 100, Decimal("0.10")])
    tags = r.choice([None, [], [r.randint(-9, 9), None, 2**31 - 1],
                     [r.randint(0, 99) for _ in range(r.randint(1, 5))]])
    doc = r.choice([None, '{"a": [1, 2.50, "x\\u00e9"], "b": null}', f'{{"n": {r.random()}}}',
                    '"text"', "[]"])
    at = r.choice([None, "infinity", "-infinity", "0044-03-15 12:34:56.789+00 BC",
                   f"{r.randint(1, 9999):04d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} "
                   f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}."
                   f"{r.randint(0, 999999):06d}+{r.randint(0, 14):02d}"])
    day = r.choice([None, "infinity", "4713-11-24 BC", "0001-01-01 BC",
                    f"{r.randint(1, 9999):04d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"])
    return amount, tags, doc, at, day


class Made:
    """What a workload did, so that a test can tell it took the paths it means to."""

    def __init__(self) -> None:
        self.prepared = self.rolled_back = self.large = self.truncated = 0


def run_workload(conn: Any, seed: int, transactions: int,
                 record: Callable[[], None] = lambda: None, *, alter: bool = True) -> Made:
    """Random small transactions, each of a few statements, on keys 1-30 of m_pk; some
    prepared, then committed or rolled back (COMMIT/ROLLBACK PREPARED straight after, as the
    prepared transaction holds its rows' locks), some large, to be streamed; ``record()``
    after each on an autocommit ``conn``; ``alter``: then m_full's equal rows and both
    tables' ALTER TABLEs."""
    r = random.Random(seed)
    ex = conn.execute
    made = Made()
    first = big(r)
    for g in range(1, 21):
        ex(f"INSERT INTO m_pk VALUES (%s, %s, %s, %s, {TYPED})", (g, g, first, f"n{g}", *typed(r)))
    ex("INSERT INTO m_full SELECT g, 'b' || g, %s FROM generate_series(1, 5) g", (big(r),))
    for number in range(transactions):
        prepared, large = r.random() < 0.15, r.random() < 0.08
        ex("BEGIN")
        if large:  # each row's TOAST value rewritten, twice over a rolled-back savepoint:
            # some 400 kB of changes, more than logical_decoding_work_mem
            made.large += 1
            ex("UPDATE m_pk SET big = %s", (big(r),))
            ex("SAVEPOINT l")
            ex("UPDATE m_pk SET big = 'undone', v = -1")
            ex("ROLLBACK TO SAVEPOINT l")
            ex("UPDATE m_full SET big = %s WHERE a %% 2 = 0", (big(r),))
        run_statements(ex, r)
        if not prepared:
            ex("COMMIT")
        else:
            gid = f"mirror_{seed}_{number}"
            ex(f"PREPARE TRANSACTION '{gid}'")
            if r.random() < 0.3:
                ex(f"ROLLBACK PREPARED '{gid}'")
                made.rolled_back += 1
            else:
                ex(f"COMMIT PREPARED '{gid}'")
                made.prepared += 1
        if r.random() < 0.02:
            ex("TRUNCATE m_full")
            made.truncated += 1
        record()
    if not alter:
        return made
    # equal rows that stay: seven (a batch of 7 ends with them), then, in the next batch,
    # one of them updated and one deleted
    ex("INSERT INTO m_full SELECT 7, 'same', 's' FROM generate_series(1, 7)")
    one = "ctid = (SELECT ctid FROM m_full WHERE a = 7 AND b = 'same' LIMIT 1)"
    ex(f"UPDATE m_full SET b = 'changed' WHERE {one}")
    ex(f"DELETE FROM m_full WHERE {one}")
    # its description changes too: the states are rewritten, equal rows counted
    ex("ALTER TABLE m_full ADD COLUMN extra int")
    ex(f"UPDATE m_full SET extra = 1 WHERE {one}")
    # The table's description changes: each column keeps its data (or goes)
    for statement in (
            "ALTER TABLE m_pk RENAME COLUMN note TO remark",
            "UPDATE m_pk SET remark = remark || '!' WHERE id % 3 = 0",
            "ALTER TABLE m_pk ADD COLUMN extra int, ADD COLUMN gone text",
            "UPDATE m_pk SET extra = id, gone = 'g' WHERE id % 2 = 0",
            "ALTER TABLE m_pk ALTER COLUMN v TYPE bigint",
            "UPDATE m_pk SET v = v + 5000000000 WHERE id % 4 = 1",
            "ALTER TABLE m_pk DROP COLUMN gone",
            "UPDATE m_pk SET v = v + 1 WHERE id % 5 = 0",
            "INSERT INTO m_pk (id, v, big) VALUES (99, 1, 'x')"):
        ex(statement)
    return made


TYPED = "%s, %s::int[], %s::jsonb, %s::timestamptz, %s::date"  # typed()'s placeholders


def run_statements(ex: Callable[..., Any], r: random.Random) -> None:
    """One to four random statements of an open transaction."""
    for _ in range(r.randint(1, 4)):
        k, choice = r.randint(1, 30), r.randrange(10)
        if choice == 0:
            ex(f"INSERT INTO m_pk VALUES (%s, 0, %s, 'i', {TYPED}) ON CONFLICT DO NOTHING",
               (k, big(r), *typed(r)))
        elif choice == 1:  # TOAST unchanged
            ex("UPDATE m_pk SET v = v + 1, note = 'u' || v, "
               "(amount, tags, doc, at, day) = ROW(" + TYPED + ") WHERE id = %s",
               (*typed(r), k))
        elif choice == 2:  # a key change, TOAST unchanged; chains come by chance
            ex("UPDATE m_pk SET id = id + 100 WHERE id = %s "
               "AND NOT EXISTS (SELECT FROM m_pk WHERE id = %s)", (k, k + 100))
        elif choice == 3:
            ex("UPDATE m_pk SET id = id - 100, v = -v WHERE id = %s "
               "AND NOT EXISTS (SELECT FROM m_pk WHERE id = %s)", (k + 100, k))
        elif choice == 4:  # delete and insert the key again
            ex("DELETE FROM m_pk WHERE id = %s", (k,))
            ex(f"INSERT INTO m_pk VALUES (%s, 7, %s, 'again', {TYPED})", (k, big(r), *typed(r)))
        elif choice == 5:
            ex("DELETE FROM m_pk WHERE id = %s", (k,))
        elif choice == 6:  # a savepoint rolled back
            ex("SAVEPOINT s")
            ex("UPDATE m_pk SET big = 'gone' WHERE id = %s", (k,))
            ex("ROLLBACK TO SAVEPOINT s")
        elif choice == 7:  # FULL: TOAST unchanged, the old row has it
            ex("UPDATE m_full SET b = b || 'x' WHERE a = %s", (k % 6,))
        elif choice == 8:
            ex("UPDATE m_pk SET big = %s WHERE id = %s", (big(r), k))
        elif k % 4 == 0:
            ex("INSERT INTO m_full VALUES (%s, 'n', %s)", (k % 6, big(r)))
        elif k % 4 == 1:  # equal rows, which no key tells apart
            ex("INSERT INTO m_full VALUES (6, 'twin', %s), (6, 'twin', %s)", ("t",) * 2)
        else:  # one of equal rows (PostgreSQL's ctid picks it): updated, or deleted
            one = "ctid = (SELECT ctid FROM m_full WHERE a = 6 LIMIT 1)"
            ex(f"UPDATE m_full SET b = b || '+' WHERE {one}" if k % 4 == 2 else
               f"DELETE FROM m_full WHERE {one}")


def assert_mirrored(spark: Any, db: Any, path: str, *, delta: bool = False) -> None:
    for table in TABLES:
        columns = [r[0] for r in db.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum", (table,))]
        rows = delta_rows(path, table, columns) if delta else \
            state_rows(spark, path, table, columns)
        expected = table_rows(db, table)  # equal rows (m_full's) counted
        missing, extra = expected - Counter(rows), Counter(rows) - expected
        assert not missing and not extra, (
            f"{table}: {len(missing)} rows missing (e.g. {str(sorted(missing)[:1])[:300]}), "
            f"{len(extra)} unexpected (e.g. {str(sorted(extra)[:1])[:300]})")
        lsns = [r[0] for r in (delta_rows if delta else partial(state_rows, spark))(
            path, table, ["_commit_lsn"])]
        assert all(lsn is not None and lsn > 0 for lsn in lsns), f"{table}: no commit LSN"


def assert_took_both_ways(db: Any, slot: str) -> None:
    """The server streamed some of the workload's transactions to the slot (as in-progress
    transactions), and decoded its prepared ones at PREPARE (a two-phase slot)."""
    import time

    deadline = time.monotonic() + 30  # the walsender reports its counts as it goes
    while True:
        rows = db.execute("SELECT s.stream_txns, r.two_phase FROM pg_stat_replication_slots s "
                          "JOIN pg_replication_slots r USING (slot_name) WHERE slot_name = %s",
                          (slot,))
        if (rows and rows[0][0] > 0 and rows[0][1]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows and rows[0][0] > 0 and rows[0][1], (slot, rows)


def assert_chains(versions: list[dict[str, Any]], key: str) -> None:
    """Each key's versions form a chain: ordered by ``_valid_from_lsn``, each but the last
    ends no later than the next begins (no two valid at once), and only the last may be
    current."""
    by_key: dict[Any, list[dict[str, Any]]] = {}
    for v in versions:
        by_key.setdefault(v[key], []).append(v)
    for k, chain in by_key.items():
        chain.sort(key=lambda v: v["_valid_from_lsn"])
        for older, newer in itertools.pairwise(chain):
            assert not older["_is_current"], (k, older, newer)
            assert older["_valid_to_lsn"] <= newer["_valid_from_lsn"], (k, older, newer)


def assert_history(db: Any, path: str,
                   points: list[tuple[int, Counter[Any], Counter[Any]]]) -> None:
    """The history's current versions are the tables; as of the end of each recorded
    transaction, its versions are the tables as they were then."""
    versions = {t: epoch_numbers(delta_arrow(read_delta(path, t))).to_pylist()
                for t in TABLES}
    pk, full = ["id", "v", "big", "remark"], ["a", "b", "big"]

    def as_of(table: str, columns: list[str], lsn: int | None) -> list[tuple[Any, ...]]:
        return [tuple(_norm(v[c]) for c in columns) for v in versions[table]
                if (v["_is_current"] if lsn is None else v["_valid_from_lsn"] <= lsn and (
                    v["_valid_to_lsn"] is None or v["_valid_to_lsn"] > lsn))]

    for table in TABLES:
        for v in versions[table]:
            assert v["_op"] in ("INSERT", "UPDATE", "SNAPSHOT"), v["_op"]
            assert (v["_valid_to_lsn"] is None) == v["_is_current"] == (v["_valid_to"] is None)
            assert v["_valid_to_lsn"] is None or v["_valid_to_lsn"] > v["_valid_from_lsn"]
        current = as_of(table, table_columns(db, table), None)
        assert Counter(current) == table_rows(db, table), table
    assert_chains(versions["public.m_pk"], "id")
    assert len(points) > 50
    # equal rows came and went (so the history counted them)
    assert any(n > 1 for _, _, m_full in points for n in m_full.values())
    for lsn, m_pk, m_full in points:
        assert Counter(as_of("public.m_pk", pk, lsn)) == \
            Counter(r[:4] for r in m_pk.elements()), lsn
        assert Counter(as_of("public.m_full", full, lsn)) == m_full, lsn


def test_mirror_equals_the_tables_for_any_batch_size(db: Any, spark: Any,
                                                     tmp_path: Path) -> None:
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
    sizes = (1, 7, 10_000)
    for size in sizes:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (f"m{size}",))
    # the tables after each transaction, for the history's "as of" (m_pk's note is renamed
    # remark later: the history keeps the values under the new name)
    points: list[tuple[int, Counter[Any], Counter[Any]]] = []

    def record() -> None:
        lsn = db.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0]
        points.append((int(lsn), table_rows(db, "public.m_pk"), table_rows(db, "public.m_full")))

    with db.connect(autocommit=True) as conn:
        made = run_workload(conn, seed=16, transactions=60 if db.major_version < 18 else 70,
                            record=record)
    assert made.prepared and made.rolled_back and made.large and made.truncated, vars(made)
    # the hard values are in the tables the mirrors must equal
    hard = db.execute(
        "SELECT count(*) FILTER (WHERE NOT isfinite(at)), "
        "count(*) FILTER (WHERE at < '0001-01-01 00:00+00'), "
        "count(*) FILTER (WHERE day < '0001-01-01'), count(*) FILTER (WHERE NOT isfinite(day)), "
        "count(*) FILTER (WHERE array_position(tags, NULL) IS NOT NULL), "
        "count(*) FILTER (WHERE amount < 0), count(*) FILTER (WHERE doc -> 'a' IS NOT NULL) "
        "FROM m_pk")[0]
    assert all(hard), hard
    end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    db.execute("SELECT pg_switch_wal()")
    old_keys: list[tuple[Any, Any]] = []  # (the old row's id, split_tables' _old_id)
    feed: list[Any] = []  # change_feed rows of m_pk

    commits: dict[int, int] = {}  # commit LSN -> its commit time, in µs from 1970

    def split(df: Any, batch_id: int) -> None:
        raw = {(r["commit_lsn"], r["seq"]): r["before"] for r in df.filter(
            "`table` = 'm_pk' AND before IS NOT NULL").collect()}
        for r in df.selectExpr("commit_lsn", "unix_micros(commit_time)").distinct().collect():
            commits[r[0]] = r[1]
        for r in split_tables(df)["public.m_pk"].filter("_has_old").select(
                "_commit_lsn", "_seq", "_old_id").collect():
            old_keys.append((int(raw[r["_commit_lsn"], r["_seq"]]["id"]), r["_old_id"]))
        # (through Arrow: Python's dates have no year BC)
        feed.extend({**r, "batch": batch_id} for r in epoch_numbers(
            change_feed(df)["public.m_pk"].toArrow()).to_pylist())

    for size in sizes:
        delta, history = str(tmp_path / f"delta{size}"), str(tmp_path / f"history{size}")
        state = str(tmp_path / f"state{size}")
        # small files for the small batches: rows move between files, files split and empty
        writer = TableStateWriter(state, **({"file_rows": 5 + size} if size < 100 else {}))

        def fn(df: Any, batch_id: int, writer: Any = writer, size: int = size,
               delta: str = delta, history: str = history) -> None:
            writer(df, batch_id)
            if size == sizes[-1]:
                split(df, batch_id)
            for _ in range(2 if size == sizes[1] else 1):  # batches of 7 twice, as after a crash
                DeltaTableWriter(delta)(df, batch_id)
                HistoryWriter(history)(df, batch_id)

        ForeachBatchStream(spark, fn, dsn=db.conninfo, slot=f"m{size}",
                           publications=["mirror_pub"], checkpoint=str(tmp_path / f"ck{size}"),
                           max_rows=size, endpos=end).run()
        assert_mirrored(spark, db, state)
        if size < 100:
            files = StateFiles.at(state, "public.m_pk").recover()
            assert files is not None and len(files.files) > 1, files
            assert max(files.files.values()) <= 5 + size, files
        assert_took_both_ways(db, f"m{size}")
        assert_mirrored(spark, db, delta, delta=True)
        assert_history(db, history, points)
    # split_tables gives the old key of key changes and deletes (what a MERGE deletes)
    assert len(old_keys) > 10 and all(a == b for a, b in old_keys), old_keys[:5]
    # change_feed: a preimage before each postimage; replayed by key, it gives the table
    # (TOAST values a postimage lacks are carried from the row's previous image); the
    # columns renamed in the batch keep their values
    rows: dict[Any, dict[str, Any]] = {}
    kinds = [r["_change_type"] for r in feed]
    assert kinds.count("update_preimage") == kinds.count("update_postimage") > 0
    # each change's commit LSN and commit time, in commit order
    assert all(commits[r["_commit_version"]] == r["_commit_timestamp"] for r in feed)
    versions = [(r["batch"], r["_commit_version"]) for r in feed]
    assert versions == sorted(versions)
    # a key changed twice in one batch: a chain the mirrors followed to its end
    moved = [(r["batch"], pre["id"], r["id"]) for pre, r in itertools.pairwise(feed)
             if r["_change_type"] == "update_postimage" and pre["id"] != r["id"]]
    assert any(b1 == b2 and new == old for b1, _, new in moved for b2, old, _ in moved), moved
    columns = table_columns(db, "public.m_pk")
    for r in feed:
        kind = r["_change_type"]
        if kind in ("delete", "update_preimage"):
            previous = rows.pop(r["id"], None)
            continue
        assert kind in ("insert", "update_postimage"), kind
        row = {c: _norm(r[c]) for c in columns}
        for c in r["_unchanged_toast"] or ():
            row[c] = (previous or {}).get(c)
        rows[r["id"]] = row
        previous = None
    expected = {r[0]: dict(zip(columns, r, strict=True)) for r in table_rows(db, "public.m_pk")}
    assert rows == expected
