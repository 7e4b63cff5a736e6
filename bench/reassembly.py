"""Peak memory while a huge streamed transaction is reassembled for a plugin without stream
callbacks (issue: a 1 GB transaction in under 300 MB of RSS).

The server streams the transaction while it is in progress (logical_decoding_work_mem =
64kB); pgdecode spools it (48 MB in memory by default, the rest on disk) and replays it at
Stream Commit. Printed side by side: this process's RSS before streaming (the reference
measured in the same run), its peak, and the transaction's size as pgoutput sent it.

    python bench/reassembly.py [--size-mb 1024] [--bindir DIR] [--memory-limit-mb 48]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from plugin_framework import OutputPlugin, Pipeline
from plugin_framework.cluster import LocalCluster, embedded_bindir
from plugin_framework.framework import DEFAULT_MEMORY_LIMIT, Output, OutputRecord
from plugin_framework.protocol import LSN
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.walsender import WalsenderSource

ROW_BYTES = 200


class Counter(OutputPlugin):
    """Ordinary callbacks only: streamed transactions must be reassembled for it."""

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        self.changes = 0
        self.value_bytes = 0

    def begin(self, ctx: Any, txn: Any) -> None:
        pass

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self.changes += 1
        self.value_bytes += len(change.new.raw(1) or b"")

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        pass


class NullOutput:
    durable_lsn = LSN(0)

    def write(self, record: OutputRecord) -> None:
        pass

    def mark(self, lsn: LSN) -> None:
        self.durable_lsn = lsn

    def flush(self) -> LSN:
        return self.durable_lsn

    def close(self) -> None:
        pass


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--bindir", type=Path, default=None)
    parser.add_argument("--memory-limit-mb", type=int,
                        default=DEFAULT_MEMORY_LIMIT // (1024 * 1024))
    args = parser.parse_args()
    rows = args.size_mb * 1024 * 1024 // ROW_BYTES
    with tempfile.TemporaryDirectory(prefix="pgdecode-bench-") as tmp, \
            LocalCluster(args.bindir or embedded_bindir(), Path(tmp) / "pg",
                         settings={"max_wal_size": "'4GB'", "checkpoint_timeout": "'30min'"}) \
            as cluster:
        conninfo = cluster.conninfo()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE big (id bigint, payload text)")
            conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
            conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
            # The cluster commits asynchronously: without this, the end taken below can fall
            # before the commit record, and the stream then rightly stops short of it.
            conn.execute("SET synchronous_commit = on")
            t0 = time.monotonic()
            conn.execute("INSERT INTO big SELECT g, repeat(md5(g::text), %s) "
                         "FROM generate_series(1, %s) g", (ROW_BYTES // 32, rows))
            end = LSN(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))  # type: ignore[index]
            print(f"one transaction of {rows:,} rows written in {time.monotonic() - t0:.1f} s")
        pipeline = Pipeline(memory_limit=args.memory_limit_mb * 1024 * 1024,
                            spool_dir=tmp)
        plugin = Counter()
        output: Output = NullOutput()
        pipeline.add(plugin, output=output)
        before = rss_mb()
        source = WalsenderSource(
            SourceConfig(conninfo, "s", ["p"], endpos=end, status_interval=5.0), pipeline)
        t0 = time.monotonic()
        source.run()
        elapsed = time.monotonic() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sent = pipeline.budget.spooled_bytes / 1024 / 1024
        spilled = pipeline.budget.spilled_bytes / 1024 / 1024
        print(f"reassembled and delivered {plugin.changes:,} changes "
              f"({plugin.value_bytes / 1024 / 1024:,.0f} MB of values) in {elapsed:.1f} s")
        print(f"{'':24}{'MB':>10}")
        print(f"{'transaction (spooled)':24}{sent:>10,.0f}")
        print(f"{'  spilled to disk':24}{spilled:>10,.0f}  (with 17-byte entry headers)")
        print(f"{'RSS before streaming':24}{before:>10,.0f}")
        print(f"{'peak RSS':24}{peak:>10,.0f}")
        print(f"{'peak - before':24}{peak - before:>10,.0f}")
        print(f"memory limit {args.memory_limit_mb} MB; peak RSS is {peak / max(sent, 1):.2%} "
              "of the transaction's size")
        pipeline.shutdown()


if __name__ == "__main__":
    main()
