"""The mirrors' random workload and its checks, shared by test_spark_mirror.py,
test_spark_recovery.py, test_spark_mergeinto.py, test_spark_reread.py and
test_cli_mirror_kills.py: tables m_pk and m_full (REPLICA IDENTITY FULL) with TOASTed and
typed values, seeded random transactions on them (key-change chains, TOAST left unchanged,
two-phase commits and rollbacks, large streamed transactions, TRUNCATE, then ALTER TABLEs),
and the checks of a mirror's state and history against the server's tables."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import Any

from plugin_framework.spark import read_delta
from plugin_framework.spark.mirrors.deltatables import delta_arrow
from support.spark_fixtures import (
    _norm,
    delta_rows,
    epoch_numbers,
    state_rows,
    table_columns,
    table_rows,
)

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
