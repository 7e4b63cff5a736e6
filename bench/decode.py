"""Decode benchmark: our pgoutput Decoder against pypgoutput's, on the same captured bytes.

    python bench/decode.py [--changes N] [--bindir DIR] [--out FILE] [--load FILE]

Starts a throwaway PostgreSQL cluster (the system's PostgreSQL 15 if installed, else the
embedded 18), runs a mixed workload on a seven-column table (mostly inserts, some updates and
deletes, 1000 changes per transaction, generated server-side), captures the raw pgoutput
messages (protocol 1, which pypgoutput understands) with pg_logical_slot_peek_binary_changes,
and times on those bytes:

- ours: ``Decoder(1).decode`` for every message, every column of every tuple forced to str
  with ``TupleData.decoded()``;
- pypgoutput: its per-message decoder classes (``pypgoutput.decoders``), dispatched on the
  first byte as its reader does, every column value collected in a list (it decodes to str
  eagerly);
- bare: a loop that only reads each message's first byte (the loop's own cost).

Best of --runs (3), taken per slice of the messages with the decoders interleaved, so that a
burst of load on a shared machine does not decide the result; wall-clock (perf_counter) for the
table, CPU time (process_time) on the last line. It prints numbers and never judges them: no
thresholds, exit status 0. Before timing, it checks that both decoders produce the same column
strings for the first 1000 Insert, Update and Delete messages.
``--out`` saves the capture as length-prefixed frames; ``--load`` reuses one without a server.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from pypgoutput import decoders as pypg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import PUBLICATION, SCHEMA, choose_bindir, run_workload  # bench/ is not a package

from plugin_framework.protocol import UNCHANGED_TOAST, Decoder, Delete, Insert, TupleData, Update

SLOT = "bench_slot"
CHECKED_CHANGES = 1000
SLICES = 16  # timed separately, see best_of

PEEK = """
SELECT data FROM pg_logical_slot_peek_binary_changes(
    %s, NULL, NULL, 'proto_version', '1', 'publication_names', %s)
"""

Value = str | bytes | None
Runner = Callable[[Sequence[bytes]], int]


# --- capture ---------------------------------------------------------------------------------


def capture(bindir: Path, changes: int) -> tuple[list[bytes], str]:
    """Run the workload on a throwaway cluster; return the pgoutput messages and the version."""
    from plugin_framework.cluster import LocalCluster  # only needed with a server

    # The cluster's default 64kB would spill every 1000-change transaction to disk while peeking.
    cluster = LocalCluster(bindir, settings={"logical_decoding_work_mem": "256MB"})
    try:
        cluster.start()
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            conn.execute(SCHEMA)
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [SLOT])
            print(f"server {version} ({bindir}); running {changes:,} changes ...", flush=True)
            started = time.perf_counter()
            # The cluster runs with synchronous_commit = off, and peeking decodes only flushed
            # WAL: without this the last transaction could be missing from the capture.
            conn.execute("SET synchronous_commit = on")
            run_workload(conn, changes)
            print(f"  workload {time.perf_counter() - started:.1f} s", flush=True)
            started = time.perf_counter()
            rows = conn.execute(PEEK, [SLOT, PUBLICATION], binary=True).fetchall()
            print(f"  capture {time.perf_counter() - started:.1f} s", flush=True)
        return [bytes(row[0]) for row in rows], version
    finally:
        cluster.cleanup()


_FRAME_LEN = struct.Struct(">I")


def save_frames(path: Path, messages: Sequence[bytes]) -> None:
    with path.open("wb") as out:
        for data in messages:
            out.write(_FRAME_LEN.pack(len(data)))
            out.write(data)


def load_frames(path: Path) -> list[bytes]:
    raw = path.read_bytes()
    messages = []
    pos = 0
    while pos < len(raw):
        (size,) = _FRAME_LEN.unpack_from(raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise SystemExit(f"{path}: truncated frame at byte {pos - 4}")
        messages.append(raw[pos : pos + size])
        pos += size
    return messages


# --- the decoders, as timed --------------------------------------------------------------------


def run_ours(messages: Sequence[bytes]) -> int:
    """Decode every message; force every column of every tuple to str. Returns values seen."""
    decode = Decoder(1).decode
    values = 0
    for data in messages:
        message: Any = decode(data)
        kind = type(message)
        if kind is Insert:
            values += len(message.new.decoded())
        elif kind is Update:
            values += len(message.new.decoded())
            before = message.key if message.key is not None else message.old
            if before is not None:
                values += len(before.decoded())
        elif kind is Delete:
            before = message.key if message.key is not None else message.old
            values += len(before.decoded())
    return values


_PYPG_CLASSES: dict[int, Callable[[bytes], pypg.PgoutputMessage]] = {
    ord("B"): pypg.Begin,
    ord("C"): pypg.Commit,
    ord("R"): pypg.Relation,
    ord("I"): pypg.Insert,
    ord("U"): pypg.Update,
    ord("D"): pypg.Delete,
    ord("T"): pypg.Truncate,
}


def run_pypgoutput(messages: Sequence[bytes]) -> int:
    """The same with pypgoutput, whose column values are already str: collect them in a list."""
    classes = _PYPG_CLASSES
    Insert_, Update_, Delete_ = pypg.Insert, pypg.Update, pypg.Delete
    values = 0
    for data in messages:
        cls = classes.get(data[0])
        if cls is None:
            continue  # a message kind pypgoutput cannot decode (none in this workload)
        message: Any = cls(data)
        if cls is Insert_:
            values += len([c.col_data for c in message.new_tuple.column_data])
        elif cls is Update_:
            values += len([c.col_data for c in message.new_tuple.column_data])
            if message.old_tuple is not None:
                values += len([c.col_data for c in message.old_tuple.column_data])
        elif cls is Delete_:
            values += len([c.col_data for c in message.old_tuple.column_data])
    return values


def run_bare(messages: Sequence[bytes]) -> int:
    """Only the loop: read each message's type byte."""
    for data in messages:
        data[0]  # the point is to do nothing else
    return 0


class Timing(NamedTuple):
    wall: float  # seconds, time.perf_counter
    cpu: float  # seconds of this process's CPU time, time.process_time
    values: int  # column values the runner saw


def time_once(runner: Runner, messages: Sequence[bytes]) -> Timing:
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        values = runner(messages)
        return Timing(time.perf_counter() - wall, time.process_time() - cpu, values)
    finally:
        gc.enable()


def best_of(runners: dict[str, Runner], messages: Sequence[bytes], runs: int) -> dict[str, Timing]:
    """Each runner's best time over ``runs`` rounds, made robust to a shared machine's bursts
    of load: the messages are cut into SLICES consecutive slices, each round times every runner
    on every slice in turn, and a runner's time is the sum over the slices of its best time on
    each (wall-clock and CPU time apart). Values: what the runner saw in one pass."""
    size = -(-len(messages) // SLICES)
    slices = [messages[start : start + size] for start in range(0, len(messages), size)]
    best = {name: [Timing(float("inf"), float("inf"), 0)] * len(slices) for name in runners}
    for _ in range(runs):
        for index, part in enumerate(slices):
            for name, runner in runners.items():
                t = time_once(runner, part)
                old = best[name][index]
                best[name][index] = Timing(min(old.wall, t.wall), min(old.cpu, t.cpu), t.values)
    return {
        name: Timing(sum(t.wall for t in ts), sum(t.cpu for t in ts), sum(t.values for t in ts))
        for name, ts in best.items()
    }


# --- sanity check ----------------------------------------------------------------------------


def _ours_rows(message: object) -> list[list[Value]]:
    tuples: list[TupleData | None]
    if isinstance(message, Insert):
        tuples = [message.new]
    elif isinstance(message, Update):
        tuples = [message.key if message.key is not None else message.old, message.new]
    elif isinstance(message, Delete):
        tuples = [message.key if message.key is not None else message.old]
    else:
        return []
    return [
        [None if v is UNCHANGED_TOAST else v for v in row.decoded()]  # type: ignore[misc]
        for row in tuples if row is not None
    ]


def _pypg_rows(message: Any) -> list[list[Value]]:
    if isinstance(message, pypg.Insert):
        tuples = [message.new_tuple]
    elif isinstance(message, pypg.Update):
        tuples = [message.old_tuple, message.new_tuple]
    elif isinstance(message, pypg.Delete):
        tuples = [message.old_tuple]
    else:
        return []
    return [[c.col_data for c in row.column_data] for row in tuples if row is not None]


def check_same_output(messages: Sequence[bytes], limit: int) -> dict[str, int]:
    """Both decoders give the same relation id and column strings for the first ``limit``
    Insert, Update and Delete messages (each); return how many of each were compared."""
    decoder = Decoder(1)
    checked = dict.fromkeys("IUD", 0)
    for index, data in enumerate(messages):
        ours = decoder.decode(data)  # every message: the decoder follows the stream's state
        kind = chr(data[0])
        if checked.get(kind, limit) >= limit:
            continue
        theirs = _PYPG_CLASSES[data[0]](data)
        ours_rows, theirs_rows = _ours_rows(ours), _pypg_rows(theirs)
        if (ours.relation_id != theirs.relation_id  # type: ignore[union-attr]
                or ours_rows != theirs_rows or not ours_rows):
            raise SystemExit(
                f"message {index} ({kind}): the decoders disagree\n"
                f"  ours:       {ours}\n  pypgoutput: {theirs!r}"
            )
        checked[kind] += 1
        if min(checked.values()) >= limit:
            break
    return checked


# --- report ----------------------------------------------------------------------------------


def report(messages: Sequence[bytes], timings: dict[str, Timing]) -> str:
    count = len(messages)
    megabytes = sum(map(len, messages)) / 1e6
    reference = timings["pypgoutput"].wall
    lines = [
        f"messages: {count:,}   MB: {megabytes:.1f}",
        "",
        f"{'decoder':<12} {'seconds':>8} {'messages/s':>12} {'MB/s':>8} {'vs pypgoutput':>14}",
    ]
    for name, timing in timings.items():
        seconds = timing.wall
        lines.append(
            f"{name:<12} {seconds:>8.3f} {count / seconds:>12,.0f} {megabytes / seconds:>8.1f} "
            f"{reference / seconds:>13.2f}x"
        )
    ours, theirs = timings["ours"], timings["pypgoutput"]
    lines += [
        "",
        f"ratio ours/pypgoutput (messages/s): {theirs.wall / ours.wall:.2f}x",
        f"same in CPU time (time.process_time): {theirs.cpu / ours.cpu:.2f}x "
        f"(ours {ours.cpu:.3f} s, pypgoutput {theirs.cpu:.3f} s)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=320_000,
                        help="changes in the workload (default 320000)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: system 15, "
                        "else the embedded server)")
    parser.add_argument("--out", type=Path, help="also save the capture to this file")
    parser.add_argument("--load", type=Path, help="decode a capture saved with --out instead "
                        "of running a server")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per decoder (best of)")
    args = parser.parse_args(argv)

    print(f"Python {platform.python_version()} ({sys.executable}), {platform.machine()}")
    if args.load:
        messages = load_frames(args.load)
        print(f"loaded {args.load}")
    else:
        messages, _version = capture(choose_bindir(args.bindir), args.changes)
        if args.out:
            save_frames(args.out, messages)
            print(f"saved the capture to {args.out}")
    kinds = Counter(chr(m[0]) for m in messages)
    print("message kinds: " + ", ".join(f"{k} {n:,}" for k, n in sorted(kinds.items())))
    changes = kinds["I"] + kinds["U"] + kinds["D"]
    if not args.load and changes != args.changes:
        print(f"warning: captured {changes:,} changes, expected {args.changes:,}")

    checked = check_same_output(messages, CHECKED_CHANGES)
    print("sanity: both decoders give the same column strings for the first "
          + ", ".join(f"{n:,} {kind}" for kind, n in checked.items()) + " messages")

    runners: dict[str, Runner] = {
        "ours": run_ours, "pypgoutput": run_pypgoutput, "bare": run_bare
    }
    load_before = os.getloadavg()[0]
    timings = best_of(runners, messages, args.runs)
    load_after = os.getloadavg()[0]
    ours_values, theirs_values = timings["ours"].values, timings["pypgoutput"].values
    if ours_values != theirs_values:
        print(f"warning: column values seen differ: ours {ours_values:,}, "
              f"pypgoutput {theirs_values:,}")
    print(f"column values decoded per run: {ours_values:,}; best of {args.runs} runs "
          f"(per slice of 1/{SLICES}, interleaved), gc disabled while timing; "
          f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {load_after:.1f} after")
    print()
    print(report(messages, timings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
