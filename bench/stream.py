"""End-to-end streaming benchmark: ``pgdecode stream`` into a file against ``pg_recvlogical``
writing the same slot contents' raw pgoutput into a file, in the same run.

    python bench/stream.py [--changes N] [--emitter NAME | --matrix] [--bindir DIR]
                           [--runs N] [--streaming off|on] [--shape mixed|bulk|both] [--keep]

With --matrix, one table per workload (ordinary transactions; the same streamed by the server,
logical_decoding_work_mem = 64kB), with a pgdecode row for each built-in format: json, text,
wal2json v1 and v2, and json under a client-side row filter.

Starts a throwaway PostgreSQL cluster (the embedded 18 unless --bindir), creates a table and a
publication, then one slot per reader and per run, *before* the workload, so that every
reader finds the same WAL waiting: ~300k changes (mostly inserts, some updates and deletes,
1000 per transaction; with --shape bulk, bench/workload.py's bulk-load shape). Then it
times, one after the other, each reader from its slot's start to the WAL end position
(``-E``):

- pgdecode: ``python -m plugin_framework.cli stream --emitter NAME -f FILE -E END -q``, the
  real command (process start, connection, decoding, the emitter, fsync at the end);
- pg_recvlogical: the server's own client from its bindir, ``--start -f FILE -E END`` with the
  same pgoutput options (protocol version, publication, messages, streaming); it decodes
  nothing and writes each XLogData payload (pgoutput's binary messages) followed by a newline;
- pgdecode's callback path: bench/floor_reader.py, the same source, pipeline and file output
  with a plugin that does nothing (replication loop, decoding, reorder buffer; no formatting):
  what no emitter can beat through the change callback (the json emitter's C fast path,
  its ``fast_change`` callback, goes around it);
- startup: ``python -m plugin_framework.cli --version``, the interpreter's and imports' share.

Both ask the server for the same stream, so the server's decoding cost is in both; the
ratio is what pgdecode's Python side costs on top of it. Beside the wall-clock times it prints
each reader's CPU time and the cluster's (the walsender decoding for it: the postmaster's
reaped children and its live ones, from /proc), per change: on a machine with few cores the
reader and the walsender share them, so these say how far a reader can keep pace at all.
Printed as a table; the numbers are never judged (exit status 0 whatever they are). With
--runs N, the best of N per reader.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import (  # bench/ is not a package
    PUBLICATION,
    SCHEMA,
    TABLE,
    run_bulk_workload,
    run_workload,
)


def default_emitter() -> str:
    from plugin_framework.framework.registry import installed_emitters

    names = {e.name for e in installed_emitters()}
    return "json" if "json" in names else "simple"


# pgdecode's readers in --matrix: (label, `pgdecode stream` arguments). The row filter lets
# nine rows in ten through (pgdecode evaluates it client-side, docs/row-filters.md).
MATRIX: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("json", ("--emitter", "json")),
    ("text", ("--emitter", "text")),
    ("wal2json v1", ("--emitter", "wal2json")),
    ("wal2json v2", ("--emitter", "wal2json", "-o", "format-version=2")),
    ("json, row filter", ("--emitter", "json", "--row-filter", f"public.{TABLE}:(id % 10 <> 0)")),
)
WORKLOADS = (("ordinary", "64MB"), ("streamed", "64kB"))  # logical_decoding_work_mem


class Timing(NamedTuple):
    seconds: float  # wall clock, start to exit
    client_cpu: float  # the reader's own CPU time (user + system)
    server_cpu: float  # the cluster's, mostly the walsender decoding for this reader


def server_cpu_seconds(datadir: Path) -> float:
    """CPU time of the cluster's processes so far: the postmaster's children that have exited
    (a reader's walsender, once the reader is gone) and those still running."""
    tick = os.sysconf("SC_CLK_TCK")
    postmaster = int((datadir / "postmaster.pid").read_text().split("\n", 1)[0])

    def fields(pid: int | str) -> list[str]:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()  # after "pid (comm) "

    mine = fields(postmaster)
    total = int(mine[13]) + int(mine[14])  # cutime + cstime: children reaped
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            f = fields(entry)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if int(f[1]) == postmaster:  # ppid
            total += int(f[11]) + int(f[12])  # utime + stime
    return total / tick


def timed(command: Sequence[str], datadir: Path, env: dict[str, str] | None = None) -> Timing:
    server_before = server_cpu_seconds(datadir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({result.returncode}):\n{result.stderr}")
    time.sleep(0.5)  # let the postmaster reap the reader's walsender
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timing(elapsed, client, server_cpu_seconds(datadir) - server_before)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=300_000)
    parser.add_argument("--emitter", default=None,
                        help="pgdecode's emitter (default json, or simple if json is missing)")
    parser.add_argument("--matrix", action="store_true",
                        help="every built-in format (json, text, wal2json v1 and v2, json "
                             "with a row filter) on two workloads: ordinary transactions, "
                             "and the same streamed by the server (64kB work mem)")
    parser.add_argument("--bindir", help="PostgreSQL binaries (default: the embedded 18)")
    parser.add_argument("--runs", type=int, default=1, help="best of N per reader")
    parser.add_argument("--streaming", choices=("off", "on"), default="on",
                        help="ask the server to stream large transactions (default on, as "
                             "pgdecode stream does)")
    parser.add_argument("--work-mem", default="64MB",
                        help="the server's logical_decoding_work_mem (default 64MB)")
    parser.add_argument("--keep", action="store_true", help="keep the output files")
    parser.add_argument("--shape", choices=("mixed", "bulk", "both"), default=None,
                        help="transactions of 1000 mixed changes, bulk loads (8,000-row "
                             "inserts, then an UPDATE of a quarter and a DELETE of a tenth), "
                             "or each in turn (default: mixed; --matrix: both)")
    args = parser.parse_args(argv)

    if args.matrix:
        configs = MATRIX
        workloads: tuple[tuple[str, str], ...] = WORKLOADS
    else:
        emitter = args.emitter or default_emitter()
        configs = ((emitter, ("--emitter", emitter)),)
        workloads = ((f"work mem {args.work_mem}", args.work_mem),)
    shape = args.shape or ("both" if args.matrix else "mixed")
    shapes = ("mixed", "bulk") if shape == "both" else (shape,)
    for shape in shapes:
        for name, work_mem in workloads:
            measure(args, f"{shape}, {name}", work_mem, configs, shape)
    return 0


def measure(args: argparse.Namespace, workload: str, work_mem: str,
            configs: Sequence[tuple[str, Sequence[str]]], shape: str = "mixed") -> None:
    """Every reader from its own slot over the same WAL, on a new cluster; a table."""
    from plugin_framework.cluster import LocalCluster, embedded_bindir
    from plugin_framework.sources.session import highest_proto_version

    bindir = Path(args.bindir) if args.bindir else embedded_bindir()
    recvlogical = bindir / "pg_recvlogical"
    workdir = Path(tempfile.mkdtemp(prefix="pgdecode-bench-stream"))
    readers = [*(f"pgdecode {label}" for label, _ in configs), "floor", "recvlogical"]
    # a slot per reader and run, all made before the workload (--matrix --runs 3: 21)
    cluster = LocalCluster(bindir, settings={
        "logical_decoding_work_mem": work_mem,
        "max_replication_slots": str(max(20, len(readers) * args.runs + 2))})
    try:
        cluster.start()
        conninfo = cluster.conninfo()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            version = conn.info.server_version
            proto = highest_proto_version(version)
            conn.execute(SCHEMA)
            slots = {(reader, run): f"bench_{i}_{run}"
                     for i, reader in enumerate(readers) for run in range(args.runs)}
            for slot in slots.values():
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                             (slot,))
            print(f"PostgreSQL {version // 10000} ({bindir}), {os.cpu_count()} CPUs, "
                  f"Python {platform.python_version()}; {workload} workload "
                  f"(logical_decoding_work_mem {work_mem}): {args.changes:,} changes ...",
                  flush=True)
            made = (run_bulk_workload if shape == "bulk" else run_workload)(conn, args.changes)
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            endpos = row[0]

        options = {"proto_version": str(proto), "publication_names": PUBLICATION,
                   "messages": "true"}
        if args.streaming == "on":
            options["streaming"] = "on" if proto >= 4 else "true"
        results: dict[str, list[Timing]] = {name: [] for name in (*readers, "startup")}
        datadir = cluster.datadir
        sizes: dict[str, int] = {}
        lines: dict[str, int] = {}
        env = dict(os.environ)
        for run in range(args.runs):
            for i, (label, arguments) in enumerate(configs):
                reader = f"pgdecode {label}"
                out = workdir / f"pgdecode_{i}_{run}.out"  # with its .progress file
                results[reader].append(timed(
                    [sys.executable, "-m", "plugin_framework.cli", "stream", "-d", conninfo,
                     "-S", slots[reader, run], "--publication", PUBLICATION, *arguments,
                     "-f", str(out), "-E", endpos, "-q", "--streaming", args.streaming,
                     "--proto-version", str(proto)], datadir, env))
                sizes[reader] = out.stat().st_size
                with open(out, "rb") as f:
                    lines[reader] = sum(1 for _ in f)
                if not args.keep:
                    out.unlink()
            floor = workdir / f"floor_{run}.out"
            results["floor"].append(timed(
                [sys.executable, str(Path(__file__).resolve().parent / "floor_reader.py"),
                 conninfo, slots["floor", run], PUBLICATION, endpos, str(proto),
                 args.streaming, str(floor)], datadir, env))
            sizes["floor"] = floor.stat().st_size
            raw = workdir / f"recvlogical_{run}.out"
            command = [str(recvlogical), "-d", conninfo, "--slot", slots["recvlogical", run],
                       "--start", "-f", str(raw), "-E", endpos, "--no-loop"]
            for key, value in options.items():
                command += ["-o", f"{key}={value}"]
            results["recvlogical"].append(timed(command, datadir))
            sizes["recvlogical"] = raw.stat().st_size
            results["startup"].append(timed(
                [sys.executable, "-m", "plugin_framework.cli", "--version"], datadir, env))
            if not args.keep:
                floor.unlink()
                raw.unlink()
    finally:
        cluster.cleanup()
        if not args.keep:
            for leftover in workdir.iterdir():
                leftover.unlink()
            workdir.rmdir()

    best = {name: min(times, key=lambda t: t.seconds) for name, times in results.items()}
    print(report(best, sizes, lines, made, readers, args.streaming, proto))
    if args.keep:
        print(f"output files kept in {workdir}")
    print()


def report(best: dict[str, Timing], sizes: dict[str, int], lines: dict[str, int],
           changes: int, readers: Sequence[str], streaming: str, proto: int) -> str:
    rows = [("reader", "seconds", "changes/s", "output MB", "lines", "throughput ratio",
             "reader CPU us/change", "server CPU us/change")]
    base = best["recvlogical"].seconds
    labels = {"recvlogical": "pg_recvlogical (raw pgoutput)",
              "floor": "callback path (a plugin that does nothing)"}
    for name in ("recvlogical", *(r for r in readers if r != "recvlogical")):
        t = best[name]
        label = labels.get(name, name.replace("pgdecode ", "pgdecode stream: "))
        # Not a judgement of speed: a reader that skipped changes would look fast.
        written = f"{lines[name]:,}" if name in lines else ""
        rows.append((label, f"{t.seconds:.2f}", f"{changes / t.seconds:,.0f}",
                     f"{sizes[name] / 1e6:.1f}", written, f"{base / t.seconds:.2f}",
                     f"{t.client_cpu / changes * 1e6:.1f}", f"{t.server_cpu / changes * 1e6:.1f}"))
    startup = best["startup"]
    rows.append(("python startup (pgdecode --version)", f"{startup.seconds:.2f}", "", "", "",
                 "", f"({startup.client_cpu:.2f} s)", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = [f"{changes:,} changes, pgoutput protocol {proto}, streaming {streaming}; "
           "throughput ratio = pg_recvlogical's seconds / the reader's (goal >= 0.8)", ""]
    for i, row in enumerate(rows):
        out.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                             for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
