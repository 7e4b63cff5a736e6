"""Emitter benchmark: changes/s of each built-in emitter beside the bare decode rate.

    python bench/emit.py [--changes N] [--bindir DIR] [--load FILE] [--runs N]

Captures the pgoutput messages (protocol 1) of bench/decode.py's workload (100k changes by
default) with their LSNs, as XLogData would carry them, then times on the same messages, best
of --runs (3), gc disabled while timing:

- decode: ``Decoder(1).decode`` for every message (nothing else);
- framework: a ``Pipeline`` with an OutputPlugin whose begin/change/commit do nothing (the
  reorder buffer's own cost: decoding, Relation/Row/Change objects, callback dispatch);
- text, wal2json, json: a ``Pipeline`` with that emitter (default options) writing into an
  output that discards every record.

Each pipeline run is fresh: new Pipeline, startup, feed every message, shutdown. It prints
numbers and never judges them; exit status 0. ``--load`` reuses a capture saved by
``bench/decode.py --out`` (its LSNs are then synthetic, increasing).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import SLOT, load_frames  # bench/ is not a package
from workload import PUBLICATION, SCHEMA, choose_bindir, run_workload

from plugin_framework import LSN, OutputPlugin, OutputRecord, Pipeline
from plugin_framework.framework.registry import load_emitter
from plugin_framework.protocol import Decoder

PROTO = 1
EMITTERS = ("text", "wal2json", "json")  # spark is left out: it needs a Spark session
PEEK = """
SELECT (lsn - '0/0')::bigint, data FROM pg_logical_slot_peek_binary_changes(
    %s, NULL, NULL, 'proto_version', %s, 'publication_names', %s)
"""

Messages = Sequence[tuple[LSN, bytes]]


def capture(bindir: Path, changes: int) -> list[tuple[LSN, bytes]]:
    """bench/decode.py's workload on a throwaway cluster; the messages with their LSNs."""
    from plugin_framework.cluster import LocalCluster

    cluster = LocalCluster(bindir, settings={"logical_decoding_work_mem": "256MB"})
    try:
        cluster.start()
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            conn.execute(SCHEMA)
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [SLOT])
            print(f"server {version} ({bindir}); running {changes:,} changes ...", flush=True)
            started = time.perf_counter()
            conn.execute("SET synchronous_commit = on")  # peek decodes only flushed WAL
            run_workload(conn, changes)
            print(f"  workload {time.perf_counter() - started:.1f} s", flush=True)
            rows = conn.execute(PEEK, [SLOT, str(PROTO), PUBLICATION], binary=True).fetchall()
        return [(LSN(lsn), bytes(data)) for lsn, data in rows]
    finally:
        cluster.cleanup()


class NullOutput:
    """An Output that discards every record (and is durable at once)."""

    def __init__(self) -> None:
        self.durable_lsn = LSN(0)
        self._marked = LSN(0)

    def write(self, record: OutputRecord) -> None:
        pass

    def mark(self, lsn: LSN) -> None:
        self._marked = max(self._marked, lsn)

    def flush(self) -> LSN:
        self.durable_lsn = self._marked
        return self.durable_lsn

    def close(self) -> None:
        pass


class EmptyPlugin(OutputPlugin):
    """Does nothing: what is left is the framework's cost."""

    name = "empty"

    def begin(self, ctx: Any, txn: Any) -> None:
        pass

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        pass

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        pass


def run_decode(messages: Messages) -> None:
    decode = Decoder(PROTO).decode
    for _lsn, data in messages:
        decode(data)


def pipeline_runner(make_plugin: Callable[[], object]) -> Callable[[Messages], None]:
    def run(messages: Messages) -> None:
        pipeline = Pipeline(proto_version=PROTO)
        pipeline.add(make_plugin(), output=NullOutput())
        pipeline.startup()
        feed = pipeline.feed
        for lsn, data in messages:
            feed(data, lsn)
        pipeline.shutdown()
    return run


def best_of(runner: Callable[[Messages], None], messages: Messages, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            runner(messages)
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=100_000,
                        help="changes in the workload (default 100000)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: system 15, "
                        "else the embedded server)")
    parser.add_argument("--load", type=Path, help="a capture saved by bench/decode.py --out, "
                        "instead of running a server")
    parser.add_argument("--runs", type=int, default=3, help="timed runs each (best of)")
    args = parser.parse_args(argv)

    print(f"Python {platform.python_version()} ({sys.executable}), {platform.machine()}")
    if args.load:
        messages = [(LSN((i + 1) * 64), data) for i, data in enumerate(load_frames(args.load))]
        print(f"loaded {args.load}")
    else:
        messages = capture(choose_bindir(args.bindir), args.changes)
    kinds = Counter(chr(data[0]) for _lsn, data in messages)
    changes = kinds["I"] + kinds["U"] + kinds["D"]
    print(f"messages {len(messages):,}, changes {changes:,} ("
          + ", ".join(f"{k} {n:,}" for k, n in sorted(kinds.items())) + ")")

    runners: dict[str, Callable[[Messages], None]] = {
        "decode": run_decode,
        "framework": pipeline_runner(EmptyPlugin),
    }
    for name in EMITTERS:
        runners[name] = pipeline_runner(lambda name=name: load_emitter(name))

    load_before = os.getloadavg()[0]
    timings: dict[str, float] = {}
    for name, runner in runners.items():
        try:
            timings[name] = best_of(runner, messages, args.runs)
        except Exception as exc:  # report and go on: a benchmark, not a test
            print(f"{name}: failed: {type(exc).__name__}: {exc}")
    load_after = os.getloadavg()[0]
    print(f"best of {args.runs}, gc disabled while timing; {os.cpu_count()} CPUs, "
          f"load average {load_before:.1f} before, {load_after:.1f} after")
    print()
    reference = timings.get("decode")
    print(f"{'name':<10} {'seconds':>8} {'changes/s':>11} {'vs decode':>10}")
    for name, seconds in timings.items():
        ratio = f"{reference / seconds:>9.2f}x" if reference else "-"
        print(f"{name:<10} {seconds:>8.3f} {changes / seconds:>11,.0f} {ratio:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
