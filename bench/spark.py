"""Spark emitter benchmark: rows/s through the ``spark`` emitter (micro-batches built through
Arrow into Spark DataFrames) against the ``json`` emitter (JSON lines to a file), on the same
captured stream, in the same run.

    python bench/spark.py [--changes N] [--batch-rows 10000,50000] [--runs 3] [--toast]
                                        [--bindir DIR] [--out FILE] [--load FILE] [--parquet]
                                        [--mirror] [--into N,...] [--source]
                                        [--toast-changes N]

Starts a throwaway PostgreSQL cluster, runs a mixed workload (transactions of 1000 changes: 800
inserts, 150 updates, 50 deletes) on a seven-column table (bigint, text, numeric, timestamptz,
boolean, text[], jsonb; with --toast, also a note text of 4-12 kB stored out of line, which the
updates leave unchanged: #16's TOAST-heavy workload), captures the pgoutput messages (with
their LSNs) through pg_logical_slot_peek_binary_changes, then times, best of --runs, a Pipeline
fed with every message, from the first message to the end of shutdown (everything delivered):

- json: the json emitter writing to a temporary file (FileOutput, fsynced at the end);
- spark noop / to-jvm / count: the spark emitter with max-rows = each --batch-rows (and its
  default max-bytes, 64 MB: the TOAST-heavy workload's batches are smaller), calling ``fn``
  with each batch's DataFrame, which goes from Arrow into the JVM only when something needs
  it: ``fn`` does nothing (the batch never goes to the JVM), reads ``df.isStreaming`` (the
  batch goes to the JVM; no job), or runs ``df.count()`` (a Spark job per batch);
- spark parquet (with --parquet): ``fn`` = ChangeLogWriter, the change log appended to
  Parquet;
- mirror parquet / delta / history (with --mirror): ``fn`` = TableStateWriter (each batch
  rewrites the files holding its keys), DeltaTableWriter (each batch merged into a Delta
  table), HistoryWriter (each batch's versions merged into a Delta history), from an empty
  target;
- mirror parquet into N (with --into N,...): the same TableStateWriter run, into the state of
  a table that had N rows before the workload (ids -1 to -N, inserted in transactions of
  100,000 before the workload and mirrored through the spark emitter, untimed), with the
  sink's seconds per batch: #16 asks 20,000 changes/s into 1,000,000 rows and at most 1.5
  times the seconds per batch into 10 times as many.

- source count (with --source): the Structured Streaming source instead of the emitter,
  ``readStream.format("pgoutput")`` with maxChangesPerBatch = each --batch-rows,
  ``trigger(availableNow=True)``, foreachBatch running ``df.count()``, on a copy of a slot
  that holds the workload (the cluster stays up for it), with the transactions the server
  decoded per workload transaction (``pg_stat_replication_slots.total_txns``): #16 asks
  that it decode each change once.

- with --toast-changes N: the TOAST-heavy workload of N changes captured too, and json and
  the spark emitter's noop / to-jvm / count paths timed on it (rows named "toast ...", each
  against that workload's json), so that one run reports every figure #16 asks for:

    python bench/spark.py --changes 100000 --batch-rows 10000 --runs 2 --mirror \
        --into 1000000,10000000 --source --toast-changes 50000

Spark runs as ``local[2]``; one warm-up batch goes first. It prints numbers and never judges
them: no thresholds, exit status 0.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import (  # bench/ is not a package
    INSERT_ROWS,
    PUBLICATION,
    SCHEMA,
    TOAST_SCHEMA,
    choose_bindir,
    run_workload,
)

from plugin_framework import LSN, FileOutput, Pipeline

SLOT = "bench_spark"
SOURCE_SLOT = "bench_source"  # the workload, for --source (copied for each run)

Frame = tuple[LSN, bytes]


# --- capture ---------------------------------------------------------------------------------


SEED_TX = 100_000  # rows per transaction of the seed (--into)

Seeder = Callable[[list[Frame], int], None]  # takes the seed's frames, one transaction at a time


def capture(bindir: Path, changes: int, *, seed: int = 0, seeder: Seeder | None = None,
            source: Callable[[str], None] | None = None, toast: bool = False
            ) -> tuple[list[Frame], int]:
    """The workload's pgoutput messages (protocol 4, or 3 before PostgreSQL 16); with
    ``seed``, the table gets rows -1 to -seed first, whose messages go to ``seeder``, a
    transaction at a time, as they are decoded. ``source(conninfo)`` runs once they are
    captured, with slot SOURCE_SLOT holding the workload. ``toast``: the TOAST-heavy
    variant."""
    from plugin_framework.cluster import LocalCluster

    cluster = LocalCluster(bindir, settings={"logical_decoding_work_mem": "256MB"})
    try:
        cluster.start()
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            version = conn.info.server_version
            proto = 4 if version >= 160000 else 3
            conn.execute(SCHEMA)
            if toast:
                conn.execute(TOAST_SCHEMA)
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [SLOT])
            get = ("SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, "
                   "%s, 'proto_version', %s, 'publication_names', %s)")
            conn.execute("SET synchronous_commit = on")
            if seed:
                print(f"server {version} ({bindir}); seeding {seed:,} rows ...", flush=True)
                started = time.perf_counter()
                for start in range(0, seed, SEED_TX):
                    conn.execute(INSERT_ROWS, {"first": -min(seed, start + SEED_TX),
                                               "last": -(start + 1)})
                    # one transaction (each call decodes afresh: its Relation message comes too)
                    rows = conn.execute(get, [SLOT, 1, str(proto), PUBLICATION]).fetchall()
                    assert seeder is not None
                    seeder([(LSN(lsn), bytes(data)) for lsn, data in rows], proto)
                print(f"  seeded in {time.perf_counter() - started:.1f} s", flush=True)
            if source is not None:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, "
                             "true)", [SOURCE_SLOT])
            print(f"server {version} ({bindir}); running {changes:,} changes ...", flush=True)
            started = time.perf_counter()
            run_workload(conn, changes, toast=toast)
            print(f"  workload {time.perf_counter() - started:.1f} s", flush=True)
            rows = conn.execute(get, [SLOT, None, str(proto), PUBLICATION]).fetchall()
        if source is not None:
            source(cluster.conninfo())
        return [(LSN(lsn), bytes(data)) for lsn, data in rows], proto
    finally:
        cluster.cleanup()


_HEAD = struct.Struct(">BQI")  # protocol version (first frame only), lsn, length


def save_frames(path: Path, frames: Sequence[Frame], proto: int) -> None:
    with path.open("wb") as out:
        out.write(bytes([proto]))
        for lsn, data in frames:
            out.write(struct.pack(">QI", lsn, len(data)))
            out.write(data)


def load_frames(path: Path) -> tuple[list[Frame], int]:
    raw = path.read_bytes()
    proto, pos, frames = raw[0], 1, []
    while pos < len(raw):
        lsn, size = struct.unpack_from(">QI", raw, pos)
        pos += 12
        frames.append((LSN(lsn), raw[pos:pos + size]))
        pos += size
    return frames, proto


# --- the runs -----------------------------------------------------------------------------------


def feed(pipeline: Pipeline, frames: Sequence[Frame], proto: int) -> float:
    gc.collect()
    started = time.perf_counter()
    pipeline.set_proto_version(proto)
    pipeline.startup()
    for lsn, data in frames:
        pipeline.feed(data, lsn)
    pipeline.shutdown()
    return time.perf_counter() - started


def run_json(frames: Sequence[Frame], proto: int, work: Path) -> float:
    from emitters.json import JsonEmitter

    target = work / "changes.jsonl"
    target.unlink(missing_ok=True)
    target.with_name(target.name + ".progress").unlink(missing_ok=True)
    pipeline = Pipeline()
    pipeline.add(JsonEmitter(), output=FileOutput(str(target)))
    return feed(pipeline, frames, proto)


def run_spark(frames: Sequence[Frame], proto: int, work: Path, spark: Any, batch_rows: int,
              fn: Callable[[Any, int], Any], checkpoint: Path | None = None) -> tuple[float, int]:
    """``checkpoint``: go on from this one (default: a new one)."""
    from plugin_framework.spark import DEFAULT_MAX_BYTES, ForeachBatchPlugin

    if checkpoint is None:
        checkpoint = work / "checkpoint"
        shutil.rmtree(checkpoint, ignore_errors=True)
    plugin = ForeachBatchPlugin(fn, spark=spark, checkpoint=str(checkpoint),
                                max_rows=batch_rows, max_bytes=DEFAULT_MAX_BYTES, max_delay=1e9)
    pipeline = Pipeline()
    pipeline.add(plugin, output=plugin.make_output())
    return feed(pipeline, frames, proto), plugin.batches


class Seeds:
    """The TableStateWriter mirrors of the seed, one per --into size: each takes the seed's
    transactions until it has its rows (its own checkpoint, batches of a transaction)."""

    def __init__(self, work: Path, spark: Any, sizes: Sequence[int]) -> None:
        from plugin_framework.spark import ForeachBatchPlugin, TableStateWriter

        self.work, self.rows = work, 0
        self.pipelines: dict[int, Pipeline] = {}
        for size in sizes:
            plugin = ForeachBatchPlugin(TableStateWriter(str(self.state(size))), spark=spark,
                                        checkpoint=str(self.checkpoint(size)),
                                        max_rows=SEED_TX, max_bytes=1 << 40, max_delay=1e9)
            pipeline = Pipeline()
            pipeline.add(plugin, output=plugin.make_output())
            self.pipelines[size] = pipeline

    def state(self, size: int) -> Path:
        return self.work / f"seeded{size}" / "state"

    def checkpoint(self, size: int) -> Path:
        return self.work / f"seeded{size}" / "checkpoint"

    def __call__(self, frames: list[Frame], proto: int) -> None:
        for size, pipeline in self.pipelines.items():
            if self.rows == 0:
                pipeline.set_proto_version(proto)
                pipeline.startup()
            if self.rows < size:
                for lsn, data in frames:
                    pipeline.feed(data, lsn)
        self.rows += SEED_TX

    def close(self) -> None:
        for pipeline in self.pipelines.values():
            pipeline.shutdown()


def run_into(frames: Sequence[Frame], proto: int, work: Path, spark: Any, batch_rows: int,
             seeds: Seeds, size: int) -> tuple[float, int, float]:
    """The workload into a copy of the seeded state of ``size`` rows: (seconds, batches,
    the sink's seconds per batch)."""
    from plugin_framework.spark import TableStateWriter

    run = work / "into"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(seeds.state(size).parent, run)
    writer = TableStateWriter(str(run / "state"))
    spent: list[float] = []

    def fn(df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        writer(df, batch_id)
        spent.append(time.perf_counter() - started)

    seconds, batches = run_spark(frames, proto, work, spark, batch_rows, fn,
                                 checkpoint=run / "checkpoint")
    return seconds, batches, sum(spent) / max(1, len(spent))


class SourceRuns:
    """--source: the Structured Streaming source on copies of SOURCE_SLOT, timed while the
    capture's cluster is up (``__call__``), reported with the others."""

    def __init__(self, work: Path, spark: Any, sizes: Sequence[int], runs: int) -> None:
        self.work, self.spark, self.sizes, self.runs = work, spark, sizes, runs
        self.results: list[tuple[int, float, int, int]] = []  # size, seconds, batches, txns

    def __call__(self, conninfo: str) -> None:
        from plugin_framework.spark import PgoutputDataSource

        self.spark.dataSource.register(PgoutputDataSource)
        for size in self.sizes:
            runs = [self.run(conninfo, size) for _ in range(self.runs)]
            self.results.append((size, *min(runs)))

    def run(self, conninfo: str, size: int) -> tuple[float, int, int]:
        """(seconds, batches, transactions the server decoded)."""
        slot = f"{SOURCE_SLOT}_run"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s", [slot])
            conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", [SOURCE_SLOT, slot])
        checkpoint = self.work / "source-checkpoint"
        shutil.rmtree(checkpoint, ignore_errors=True)
        batches: list[int] = []
        gc.collect()
        started = time.perf_counter()
        query = (self.spark.readStream.format("pgoutput").option("dsn", conninfo)
                 .option("slot", slot).option("publication", PUBLICATION)
                 .option("maxChangesPerBatch", str(size)).load()
                 .writeStream.foreachBatch(lambda df, i: batches.append(df.count()))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        seconds = time.perf_counter() - started
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT total_txns FROM pg_stat_replication_slots "
                               "WHERE slot_name = %s", [slot]).fetchone()
        return seconds, len([n for n in batches if n]), int(row[0]) if row else -1


class Timer:
    """Best-of timings, each against the json emitter's on the same workload (the last
    ``paths`` call's)."""

    def __init__(self, runs: int, results: list[tuple[str, float, int, int, float]]) -> None:
        self.runs = runs
        self.results = results
        self.changes = 0
        self.json_seconds = 0.0

    def best(self, name: str, run: Callable[[], tuple[float, int]]) -> float:
        times, batches = [], 0
        for _ in range(self.runs):
            seconds, batches = run()
            times.append(seconds)
        self.results.append((name, min(times), batches, self.changes,
                             self.json_seconds or min(times)))
        print(f"  {name:<30} {min(times):7.2f} s  {self.changes / min(times):>10,.0f} rows/s",
              flush=True)
        return min(times)

    def paths(self, label: str, frames: Sequence[Frame], proto: int, changes: int, work: Path,
              spark: Any, sizes: Sequence[int]) -> None:
        """json, then the spark emitter's noop, to-jvm and count paths, on one workload."""
        self.changes, self.json_seconds = changes, 0.0
        self.json_seconds = self.best(f"{label}json", lambda: (run_json(frames, proto, work), 0))
        for size in sizes:
            self.best(f"{label}spark noop  {size:>7,}", lambda s=size: run_spark(  # type: ignore[misc]
                frames, proto, work, spark, s, lambda df, i: None))
            self.best(f"{label}spark to-jvm {size:>6,}", lambda s=size: run_spark(  # type: ignore[misc]
                frames, proto, work, spark, s, lambda df, i: df.isStreaming))
            self.best(f"{label}spark count {size:>7,}", lambda s=size: run_spark(  # type: ignore[misc]
                frames, proto, work, spark, s, lambda df, i: df.count()))


def session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("pgdecode-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200_000,
                        help="changes in the workload (default 200000)")
    parser.add_argument("--batch-rows", default="10000,50000",
                        help="spark max-rows values to time (default 10000,50000)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each (best of)")
    parser.add_argument("--toast", action="store_true",
                        help="the TOAST-heavy workload: a 4-12 kB note in every inserted row, "
                             "unchanged by the updates")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: the first found)")
    parser.add_argument("--out", type=Path, help="also save the capture to this file")
    parser.add_argument("--load", type=Path, help="use a capture saved with --out")
    parser.add_argument("--parquet", action="store_true",
                        help="also time fn = ChangeLogWriter (Parquet)")
    parser.add_argument("--mirror", action="store_true",
                        help="also time the mirrors: TableStateWriter, DeltaTableWriter, "
                             "HistoryWriter")
    parser.add_argument("--into", default="",
                        help="also time TableStateWriter into tables of these many rows "
                             "before the workload (e.g. 1000000,10000000)")
    parser.add_argument("--toast-changes", type=int, default=0, metavar="N",
                        help="also capture the TOAST-heavy workload of N changes and time json "
                             "and the spark emitter's paths on it, in the same run")
    parser.add_argument("--source", action="store_true",
                        help="also time the Structured Streaming source (df.count() per "
                             "batch), with the transactions the server decoded")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.batch_rows.split(",") if x.strip()]
    into = [int(x) for x in args.into.split(",") if x.strip()]
    if (into or args.source or args.toast_changes) and args.load:
        parser.error("--into, --source and --toast-changes need a server: not with --load")

    print(f"Python {platform.python_version()} ({sys.executable}), {platform.machine()}, "
          f"{os.cpu_count()} CPUs")
    work = Path(tempfile.mkdtemp(prefix="pgdecode-bench-spark"))
    try:
        started = time.perf_counter()
        spark = session()
        print(f"spark {spark.version} session in {time.perf_counter() - started:.1f} s")
        seeds = Seeds(work, spark, into) if into else None
        sources = SourceRuns(work, spark, sizes, args.runs) if args.source else None
        if args.load:
            frames, proto = load_frames(args.load)
            print(f"loaded {args.load}")
        else:
            frames, proto = capture(choose_bindir(args.bindir), args.changes,
                                    seed=max(into, default=0), seeder=seeds, source=sources,
                                    toast=args.toast)
            if seeds is not None:
                seeds.close()
            if args.out:
                save_frames(args.out, frames, proto)
        kinds = Counter(chr(data[0]) for _, data in frames)
        changes = kinds["I"] + kinds["U"] + kinds["D"]
        print(f"messages: {len(frames):,} (protocol {proto}), changes: {changes:,}")
        warm = frames[:min(len(frames), 3000)]
        run_spark(warm, proto, work, spark, 1000, lambda df, i: df.count())
        run_json(warm, proto, work)

        results: list[tuple[str, float, int, int, float]] = []
        timer = Timer(args.runs, results)
        label = "toast " if args.toast else ""
        print(f"timing (best of {args.runs}):")
        timer.paths(label, frames, proto, changes, work, spark, sizes)
        for size in sizes:
            if args.parquet:
                from plugin_framework.spark import ChangeLogWriter

                def parquet(s: int = size) -> tuple[float, int]:
                    shutil.rmtree(work / "log", ignore_errors=True)
                    return run_spark(frames, proto, work, spark, s,
                                     ChangeLogWriter(str(work / "log")))
                timer.best(f"{label}spark parquet {size:>5,}", parquet)
            if args.mirror:
                from plugin_framework.spark import (
                    DeltaTableWriter,
                    HistoryWriter,
                    TableStateWriter,
                )

                for name, sink in (("parquet", TableStateWriter), ("delta", DeltaTableWriter),
                                   ("history", HistoryWriter)):
                    def mirror(s: int = size, sink: Any = sink) -> tuple[float, int]:
                        shutil.rmtree(work / "mirror", ignore_errors=True)
                        return run_spark(frames, proto, work, spark, s,
                                         sink(str(work / "mirror")))
                    timer.best(f"{label}mirror {name:<7} {size:>7,}", mirror)
            for rows in into:
                per_batch: list[float] = []

                def seeded(s: int = size, rows: int = rows,
                           per_batch: list[float] = per_batch) -> tuple[float, int]:
                    assert seeds is not None
                    seconds, batches, sink = run_into(frames, proto, work, spark, s, seeds, rows)
                    per_batch.append(sink)
                    return seconds, batches
                timer.best(f"into {rows:>10,} {size:>7,}", seeded)
                print(f"    the sink: {min(per_batch):.3f} s per batch (best run)", flush=True)
        if sources is not None:
            for size, seconds, batches, decoded in sources.results:
                results.append((f"source count {size:>6,}", seconds, batches, changes,
                                timer.json_seconds))
                print(f"  source count {size:>6,}: {decoded / kinds['C']:.2f} transactions "
                      f"decoded per transaction ({decoded:,} for {kinds['C']:,})")
        if args.toast_changes:  # the TOAST-heavy workload too, in the same run
            toast, toast_proto = capture(choose_bindir(args.bindir), args.toast_changes,
                                         toast=True)
            kinds = Counter(chr(data[0]) for _, data in toast)
            timer.paths("toast ", toast, toast_proto, kinds["I"] + kinds["U"] + kinds["D"],
                        work, spark, sizes)
        print()
        print(f"{'path':<30} {'seconds':>8} {'rows/s':>10} {'batches':>8} {'vs json':>8}")
        for name, seconds, batches, count, json_seconds in results:
            print(f"{name:<30} {seconds:8.2f} {count / seconds:>10,.0f} "
                  f"{batches if batches else '-':>8} {json_seconds / seconds:>7.0%}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
