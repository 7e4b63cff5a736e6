"""ALTER TABLE under running mirrors, on each server version: a table copied by an initial
snapshot, then changed by a writer while the table gets a column with a default, a column
renamed, a column dropped and another of its type added (which pgoutput's description
cannot tell from a rename), and a numeric column retyped to integer (the server rounds,
Spark would truncate). The mirrors ask for the table again after each such change, and
once the stream has ended at -E, the Parquet state, the Delta state and the history's
current versions equal ``SELECT *`` value by value, the history's chains are whole, and
the checkpoint says as of which LSN the targets equal the source."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.mirror_workload import assert_chains
from support.spark_fixtures import (  # noqa: F401  (the fixture "spark")
    delta_rows,
    spark_session,
    state_rows,
    table_columns,
    table_rows,
)
from support.streamkit import current_lsn, wait_for

from plugin_framework.sources.snapshots.initial import SnapshotUnfinished
from plugin_framework.sources.snapshots.requests import request_snapshot
from plugin_framework.spark import (
    Checkpoint,
    DeltaTableWriter,
    ForeachBatchStream,
    HistoryWriter,
    TableStateWriter,
    read_delta,
)
from plugin_framework.spark.mirrors.deltatables import delta_arrow

pytestmark = pytest.mark.slow

ALTERS = (
    "ALTER TABLE a ADD COLUMN d int DEFAULT 42",
    "ALTER TABLE a RENAME COLUMN note TO remark",
    "ALTER TABLE a DROP COLUMN x",
    "ALTER TABLE a ADD COLUMN x2 text",
    "ALTER TABLE a ALTER COLUMN amount TYPE int",
)


class Writer(threading.Thread):
    """Inserts, updates (some leaving the TOASTed value out) and deletes of table a, one
    small transaction at a time, by columns no ALTER touches."""

    def __init__(self, conninfo: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.random = conninfo, random.Random(seed)
        self.done = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        r = self.random
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.done.is_set():
                    k = r.randint(1, 400)
                    choice = r.randrange(4)
                    if choice == 0:
                        conn.execute("INSERT INTO a (id, v) VALUES (%s, %s) "
                                     "ON CONFLICT DO NOTHING", (k, k))
                    elif choice == 1:
                        conn.execute("DELETE FROM a WHERE id = %s", (k,))
                    else:  # the TOASTed column left out
                        conn.execute("UPDATE a SET v = v + 1 WHERE id = %s", (k,))
                    self.ops += 1
                    time.sleep(0.005)
        except BaseException as exc:
            self.error = exc

    def more(self, n: int) -> None:
        start = self.ops
        wait_for(lambda: self.ops >= start + n or self.error is not None, timeout=120,
                 what=f"{n} more changes")
        assert self.error is None, self.error


def _sinks(work: Path) -> list[Any]:
    return [TableStateWriter(str(work / "state")), DeltaTableWriter(str(work / "delta")),
            HistoryWriter(str(work / "history"))]


def test_alter_table_under_running_mirrors_leaves_them_equal_to_the_table(
        db: Any, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db.execute("""
        CREATE TABLE a (id int PRIMARY KEY, v int, note text, amount numeric(10,2), x text,
                        big text);
        ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL;
        INSERT INTO a SELECT g, g, 'n' || g, g + 0.5, 'x' || g,
            CASE WHEN g % 7 = 0 THEN (SELECT string_agg(md5(g::text || i), '')
                                      FROM generate_series(1, 100) i) END
          FROM generate_series(1, 300) g;
        CREATE PUBLICATION p FOR TABLE a""")
    checkpoint = str(tmp_path / "checkpoint")

    def stream(**extra: Any) -> ForeachBatchStream:
        return ForeachBatchStream(spark, sinks=_sinks(tmp_path), dsn=db.conninfo,
                                  slot=f"{db.dbname}_alter", publications=["p"],
                                  checkpoint=checkpoint, max_rows=200, max_delay=0.5,
                                  **extra)

    writer = Writer(db.conninfo, seed=db.major_version)
    running = stream(create_slot=True, snapshot="initial").start()
    caplog.set_level("INFO", logger="plugin_framework.spark.sinks")
    try:
        wait_for(lambda: Checkpoint(checkpoint).snapshot_state == "done"
                 or running.error is not None, timeout=300, what="the copy done")
        writer.start()
        writer.more(50)
        for statement in ALTERS:
            db.execute(statement)
            writer.more(50)  # the stream sees the table's new description with these
        writer.done.set()
        writer.join(30)
        assert writer.error is None, writer.error
        end = current_lsn(db.conninfo)
    finally:
        writer.done.set()
        running.stop()
        with contextlib.suppress(SnapshotUnfinished):  # stopped while a read was under way
            running.join(300)
    # -E: the stream ends once every read it was asked for is in the targets
    stream(endpos=end).run()

    table = "public.a"
    columns = table_columns(db, table)
    assert columns == ["id", "v", "remark", "amount", "big", "d", "x2"]
    expected = table_rows(db, table)
    assert any(v == 42 for row in expected for v in row[5:6]), "no default in the table"
    for name, got in (("parquet", state_rows(None, str(tmp_path / "state"), table, columns)),
                      ("delta", delta_rows(str(tmp_path / "delta"), table, columns)),
                      ("history", delta_rows(str(tmp_path / "history"), table, columns,
                                             history=True))):
        missing, extra = expected - Counter(got), Counter(got) - expected
        assert not missing and not extra, (
            f"{name}: {len(missing)} rows missing (e.g. {sorted(missing)[:2]}), "
            f"{len(extra)} not in the table (e.g. {sorted(extra)[:2]})")
    versions = delta_arrow(read_delta(str(tmp_path / "history"), table)).to_pylist()
    assert_chains(versions, "id")
    reread = [r.getMessage() for r in caplog.records if "is read again" in r.getMessage()]
    assert len(reread) >= len(ALTERS) - 1, reread  # (a drop alone carries over exactly)
    done = Checkpoint(checkpoint)
    assert done.consistent is not None and done.last_committed is not None
    assert done.consistent == done.last_committed.end


def test_rows_whose_toast_value_a_mirror_lacks_are_read_again_and_counted(
        db: Any, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A mirror started without a snapshot has none of the rows that existed: an update
    that leaves a row's TOASTed value out gives a row with a value the mirror cannot know.
    It is written NULL, counted, and the row under that key is read again from the source:
    at -E the mirrors hold it whole, the count says how many rows lacked it, and the
    warning does not advise a snapshot the mirror could not have used."""
    db.execute("""
        CREATE TABLE t (id int PRIMARY KEY, v int, big text);
        ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
        INSERT INTO t SELECT g, g, (SELECT string_agg(md5(g::text || i), '')
                                    FROM generate_series(1, 100) i)
          FROM generate_series(1, 20) g;
        CREATE PUBLICATION p FOR TABLE t""")
    slot = f"{db.dbname}_toast"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
               (slot,))
    db.execute("UPDATE t SET v = v + 1 WHERE id <= 5")  # big left out: not sent
    end = current_lsn(db.conninfo)
    caplog.set_level("WARNING", logger="plugin_framework.spark.sinks")
    stream = ForeachBatchStream(spark, sinks=_sinks(tmp_path), dsn=db.conninfo, slot=slot,
                                publications=["p"], checkpoint=str(tmp_path / "checkpoint"),
                                endpos=end)
    stream.run()
    expected = {row[0]: row for row in table_rows(db, "public.t") if row[0] <= 5}
    columns = ["id", "v", "big"]
    for name, got in (("parquet", state_rows(None, str(tmp_path / "state"), "public.t",
                                             columns)),
                      ("delta", delta_rows(str(tmp_path / "delta"), "public.t", columns)),
                      ("history", delta_rows(str(tmp_path / "history"), "public.t", columns,
                                             history=True))):
        assert {row[0]: row for row in got} == expected, name
    assert stream.plugin.unknown_toast == {"public.t": 15}  # five rows, three mirrors
    warnings = [r.getMessage() for r in caplog.records if "TOAST" in r.getMessage()]
    assert warnings and all("asked for again" in w and "snapshot" not in w
                            for w in warnings), warnings


def test_a_table_left_out_of_reads_is_not_called_equal_until_it_is_read_again(
        db: Any, spark: Any, tmp_path: Path) -> None:
    """``no_reread``: after an ADD COLUMN ... DEFAULT the mirror keeps the documented policy
    (older rows NULL in the new column), so it never says it equals the source, in later
    batches or after a restart, however long the stream runs; a snapshot of the table asked
    for (``pgdecode snapshot --table``) then makes it equal, and the checkpoint says so."""
    db.execute("""
        CREATE TABLE a (id int PRIMARY KEY, v int);
        INSERT INTO a SELECT g, g FROM generate_series(1, 200) g;
        CREATE TABLE other (id int PRIMARY KEY);
        CREATE PUBLICATION p FOR TABLE a, other""")
    checkpoint = str(tmp_path / "checkpoint")

    def run(**extra: Any) -> None:
        sinks = [TableStateWriter(str(tmp_path / "state"), no_reread=["public.a"]),
                 DeltaTableWriter(str(tmp_path / "delta"), no_reread=["public.a"])]
        ForeachBatchStream(spark, sinks=sinks, dsn=db.conninfo, slot=f"{db.dbname}_opt",
                           publications=["p"], checkpoint=checkpoint,
                           endpos=current_lsn(db.conninfo), **extra).run()

    run(create_slot=True, snapshot="initial")
    assert Checkpoint(checkpoint).consistent is not None  # the copy alone: equal
    db.execute("ALTER TABLE a ADD COLUMN d int DEFAULT 42")
    db.execute("UPDATE a SET v = -v WHERE id <= 10")
    run()
    db.execute("INSERT INTO other VALUES (1)")  # a later batch, not touching a
    run()
    later = Checkpoint(checkpoint)
    assert later.consistent is None and later.inexact == {"public.a"}
    mirrored = Counter(delta_rows(str(tmp_path / "delta"), "public.a", ["id", "v", "d"]))
    assert mirrored != table_rows(db, "public.a")  # the policy: not the defaults

    with psycopg.connect(db.conninfo, autocommit=True) as conn:  # pgdecode snapshot --table
        request_snapshot(conn, f"{db.dbname}_opt", "public.a")
    run()
    done = Checkpoint(checkpoint)
    for got in (state_rows(None, str(tmp_path / "state"), "public.a", ["id", "v", "d"]),
                delta_rows(str(tmp_path / "delta"), "public.a", ["id", "v", "d"])):
        assert Counter(got) == table_rows(db, "public.a")
    assert done.inexact == frozenset() and done.last_committed is not None
    assert done.consistent == done.last_committed.end
