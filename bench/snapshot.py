"""Initial snapshot benchmark: `pgdecode stream --snapshot only --emitter json` against
psql's `\\copy ... TO file` of the same table, in the same run.

    python bench/snapshot.py [--rows N] [--workers N[,N...]] [--bindir DIR] [--runs N]

Starts a throwaway PostgreSQL cluster (the system's PostgreSQL 15 if installed, else the
embedded 18), fills the benchmarks' seven-column table (bench/workload.py) with --rows rows
(default 1,000,000), then times, --runs times (default 3) each, interleaved:

- copy: `psql -c "\\copy bench_orders TO FILE"` (the server's COPY text, written by psql);
- pgdecode: `pgdecode stream --create-slot --snapshot only --emitter json -f FILE` with a
  new slot each time (slot creation, the copy and the JSON lines, process start included),
  once for each --snapshot-workers count of --workers (default 2; e.g. 1,2 to see what
  the second worker's key ranges give, in the same run).

It prints rows/s of each (best run, and the median run) and the ratio pgdecode/copy; no
thresholds, exit 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import INSERT_ROWS, SCHEMA, TABLE, choose_bindir  # bench/ is not a package

from plugin_framework.cluster import LocalCluster


def fill(conninfo: str, rows: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(SCHEMA)
        step = 100_000
        for first in range(1, rows + 1, step):
            conn.execute(INSERT_ROWS, {"first": first, "last": min(rows, first + step - 1)})
        conn.execute(f"VACUUM ANALYZE {TABLE}")


def time_copy(psql: Path, conninfo: str, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run([str(psql), "-X", "-q", "-d", conninfo, "-c", f"\\copy {TABLE} TO '{out}'"],
                   check=True)
    return time.perf_counter() - started


def time_pgdecode(conninfo: str, out: Path, slot: str, workers: int) -> float:
    for suffix in ("", ".progress"):
        Path(f"{out}{suffix}").unlink(missing_ok=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "plugin_framework.cli", "stream", "-d", conninfo,
                    "-S", slot, "--publication", "bench_pub", "--create-slot", "--snapshot",
                    "only", "--snapshot-workers", str(workers), "--emitter", "json", "-f",
                    str(out), "-q"], check=True)
    elapsed = time.perf_counter() - started
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workers", default="2",
                        help="--snapshot-workers counts, comma-separated (default 2)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bindir")
    args = parser.parse_args()
    bindir = choose_bindir(args.bindir)
    cluster = LocalCluster(bindir)
    try:
        cluster.start()
        conninfo = cluster.conninfo()
        fill(conninfo, args.rows)
        counts = [int(n) for n in args.workers.split(",")]
        copies: list[float] = []
        ours: dict[int, list[float]] = {n: [] for n in counts}
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(args.runs):
                copies.append(time_copy(bindir / "psql", conninfo, Path(tmp) / "copy.txt"))
                for n in counts:
                    out = Path(tmp) / "out.jsonl"
                    ours[n].append(time_pgdecode(conninfo, out, f"bench{run}_{n}", n))
                    lines = out.read_bytes().count(b"\n")
                    assert lines == args.rows, (lines, args.rows)
        copy_rate = args.rows / min(copies)
        copy_median = args.rows / statistics.median(copies)
        print(f"PostgreSQL {cluster.major_version}, {args.rows:,} rows, {os.cpu_count()} cores, "
              f"{args.runs} runs each: best (median)")
        rows = [("psql \\copy TO file", f"{copy_rate:,.0f} rows/s", f"{copy_median:,.0f}")]
        for n, times in ours.items():
            rate, median = args.rows / min(times), args.rows / statistics.median(times)
            rows += [(f"pgdecode --snapshot only (json), {n} worker{'s' if n > 1 else ''}",
                      f"{rate:,.0f} rows/s", f"{median:,.0f}"),
                     ("  ratio to copy", f"{rate / copy_rate:.2f}",
                      f"{median / copy_median:.2f}")]
        for name, best, median_text in rows:
            print(f"{name:<44} {best:>16} ({median_text})")
    finally:
        cluster.cleanup()


if __name__ == "__main__":
    main()
