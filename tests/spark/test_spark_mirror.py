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
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.mirror_workload import (
    SCHEMA,
    assert_history,
    assert_mirrored,
    assert_took_both_ways,
    run_workload,
)
from support.spark_fixtures import (  # noqa: F401
    _norm,
    epoch_numbers,
    spark_session,
    table_columns,
    table_rows,
)

from plugin_framework.spark import (
    DeltaTableWriter,
    ForeachBatchStream,
    HistoryWriter,
    TableStateWriter,
    change_feed,
    split_tables,
)
from plugin_framework.spark.mirrors.statefiles import StateFiles

pytestmark = pytest.mark.slow


@pytest.mark.soak
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
