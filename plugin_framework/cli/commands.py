"""The ``pgdecode`` commands, one function each: ``COMMANDS[args.command](args)`` runs one
and returns its exit status."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from plugin_framework.app import (
    Assembly,
    EmitterChoice,
    UsageError,
    build_pipeline,
    cannot_open,
    open_source,
    run_source,
)
from plugin_framework.cli.logs import setup_logging
from plugin_framework.cli.parser import (
    allowlist,
    emitter_choice,
    memory_limit,
    source_config,
)
from plugin_framework.cli.status import StatusLine
from plugin_framework.demo import run_demo
from plugin_framework.framework import (
    CallbackError,
    Catalog,
    CatalogError,
    MemoryOutput,
    OutputError,
    Pipeline,
    Relation,
)
from plugin_framework.framework.registry import installed_emitters, load_emitter
from plugin_framework.protocol import ProtocolError, XLogData
from plugin_framework.rowfilter import config_from_args
from plugin_framework.sources.capture import (
    CaptureFormatError,
    CaptureHeader,
    SessionRecorder,
    Verified,
    described_relations,
    read_capture,
    verify_capture,
)
from plugin_framework.sources.errors import (
    ConnectionLost,
    SlotUnusable,
    SourceError,
    explain,
    invalidated_advice,
)
from plugin_framework.sources.metrics import serve_metrics
from plugin_framework.sources.slots import (
    create_slot,
    drop_slot,
    list_slots,
    slot_health,
    sql_query,
    usable_slot,
)
from plugin_framework.sources.snapshots.catalog import (
    published_tables,
    qualified_name,
    snapshot_table,
)
from plugin_framework.sources.snapshots.requests import request_snapshot
from plugin_framework.sources.walsender import WalsenderSource

if TYPE_CHECKING:
    from plugin_framework.rowfilter import PublicationFilters

log = logging.getLogger("pgdecode.cli")


def cmd_emitters(args: argparse.Namespace) -> int:
    allow = allowlist(args)
    rows = [("NAME", "DISTRIBUTION", "VERSION", "CALLBACKS")]
    for info in installed_emitters(allow):
        try:
            callbacks = ",".join(sorted(load_emitter(info.name, allow).callbacks))
        except Exception as exc:  # a broken third-party emitter must not hide the others
            callbacks = f"(cannot load: {exc})"
        rows.append((info.name, info.distribution, info.version, callbacks))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[3])
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    setup_logging(args)
    verified: list[Verified] = []

    def verify() -> None:
        """The capture read through first: one that is damaged, or cut inside a
        transaction, is refused before any output is opened (unless --partial)."""
        found = verify_capture(args.file)
        if found.damage is not None and not args.partial:
            raise CaptureFormatError(
                f"{args.file} is truncated or damaged ({found.damage}): nothing was "
                "replayed. Record the capture again; or pass --partial to replay the whole "
                "transactions before the damage (the output then lacks the rest)")
        verified.append(found)

    # Emitters run without a catalog, as the capture was recorded; -d serves the filters.
    # Bad filters, emitters or options fail first; then a file that is no capture, or a
    # damaged one, before any output is opened.
    assembly = assemble(args, None, filter_conninfo=args.dbname,
                        check=lambda f: check_capture(f, args.file), before_output=verify)
    pipeline, filters = assembly.pipeline, assembly.filters
    damage, damaged_frame = verified[0].damage, verified[0].at
    try:
        header, frames = read_capture(args.file)
        assembly.start(slot_name=header.slot, proto_version=header.proto_version,
                       server_version=header.server_version)
        try:
            try:
                for number, frame in enumerate(frames, 1):
                    if number == damaged_frame:
                        raise CaptureFormatError(damage)
                    if isinstance(frame, XLogData):
                        pipeline.feed(frame.data, frame.wal_start)
                if damage is not None or not pipeline.at_boundary:
                    # (--partial) what the checks found and the replay itself did not: a
                    # message out of order, a capture cut inside a transaction
                    raise CaptureFormatError(damage or "it ends inside a transaction")
            except (CaptureFormatError, ProtocolError) as exc:
                # The capture ends inside a transaction, or a frame is not what the server
                # sent: take the transaction cut short back out of the output files (not out
                # of stdout: a pipe cannot take lines back), as after a lost connection.
                torn = pipeline.in_flight
                pipeline.reset()
                raise CaptureFormatError(damaged_capture(args, exc, pipeline, torn)) from None
        finally:
            pipeline.shutdown()
    finally:
        if filters is not None:
            filters.close()
    return 0


def damaged_capture(args: argparse.Namespace, exc: Exception, pipeline: Any,
                    torn: bool) -> str:
    """What a replay that ended at a truncated or damaged capture did."""
    detail = str(exc).removeprefix(f"{args.file}: ")
    done = (f"replayed {pipeline.transactions} transaction"
            f"{'' if pipeline.transactions == 1 else 's'}, up to {pipeline.position}")
    if torn and args.file_out == "-":
        done += ("; the transaction it cuts short was partly written to stdout (which cannot "
                 "take lines back)")
    elif torn:
        done += "; the transaction it cuts short was taken back out of the output"
    return f"{args.file} is truncated or damaged ({detail}): {done}"


def check_capture(filters: PublicationFilters, path: str) -> None:
    """Apply the filters to every table the capture describes, before replaying it: a column
    list that does not fit a table is refused before any output is written (without -d,
    the capture's Relation messages are all there is to check it against). A truncated or
    damaged capture is checked as far as it goes: the replay stops there too, and says so."""
    relations = described_relations(path)
    try:
        for message in relations:
            filters.check(Relation.from_message(message, {}))
    except (CaptureFormatError, ProtocolError):
        return


def assemble(args: argparse.Namespace, slot: str | None, catalog_conninfo: str | None = None,
             **kwargs: Any) -> Assembly:
    """``build_pipeline`` with the emitters, -f, --memory-limit and the row-filter options
    (--row-filter, --column-list, --filter-config, --filters-from-publication) of the
    command line; the files it opens are kept in ``args.output_files``, to name the file in
    an error (see errors.file_error)."""
    files = args.output_files = []
    return build_pipeline(emitter_choice(args), slot_name=slot,
                          catalog_conninfo=catalog_conninfo or None,
                          memory_limit=memory_limit(args), filters=config_from_args(args),
                          output_files=files, **kwargs)


def status_line(args: argparse.Namespace, source: Any) -> StatusLine | None:
    """The live status line, on a terminal unless -q."""
    return None if args.quiet or not sys.stderr.isatty() else StatusLine(source)


def cmd_stream(args: argparse.Namespace) -> int:
    setup_logging(args)
    config = source_config(args)
    # Filters are checked against the catalog now: before anything is streamed or acked.
    assembly = assemble(args, config.slot, config.conninfo, filter_conninfo=config.conninfo)
    source = open_source(config, assembly.pipeline, args.source)
    metrics = None
    if args.metrics_port is not None:
        try:
            metrics = serve_metrics(source, args.metrics_port, args.metrics_address)
        except OSError as exc:
            assembly.close()
            raise UsageError(f"cannot serve metrics on port {args.metrics_port}: "
                             f"{exc.strerror or exc}") from None
    try:
        run_source(source, assembly, status=status_line(args, source))
    finally:
        if metrics is not None:
            metrics.shutdown()
    return 0


def cmd_mirror(args: argparse.Namespace) -> int:
    """``stream`` through the spark emitter, configured to keep the tables' state at --to."""
    if args.format == "delta" or args.history:
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise UsageError(f"{'--history' if args.history else '--format delta'} needs the "
                             "deltalake package: pip install 'pgdecode[delta]'") from None
    checkpoint = args.checkpoint
    if checkpoint is None:
        if "://" in args.to and not args.to.startswith("file://"):
            raise UsageError("--to is not a local directory: give the batch log a local "
                             "directory with --checkpoint DIR (keep it with the slot)")
        checkpoint = os.path.join(args.to.removeprefix("file://"), "_pgdecode_checkpoint")
    args.emitter, args.file_out, args.emitter_allowlist = ["spark"], "-", None
    args.option = mirror_options(args.to, args.format, checkpoint, master=args.master,
                                 spark_conf=args.spark_conf or (), max_rows=args.max_rows,
                                 max_delay=args.max_delay)
    if args.history:
        args.option.append(f"history-path={args.to.rstrip('/')}/_history")
    if args.no_reread:
        args.option.append("no-reread=" + ",".join(args.no_reread))
    if args.publication:  # (without one, the stream's checks say what is missing)
        args.option.append("keys=" + json.dumps(mirror_keys(args)))
    if args.create_slot:
        args.two_phase = True  # prepared transactions are delivered at COMMIT PREPARED
    # a batch waiting on --max-delay goes out at a status update at the latest
    args.status_interval = min(args.status_interval, args.max_delay)
    return cmd_stream(args)


def mirror_keys(args: argparse.Namespace) -> dict[str, list[str]]:
    """The published tables' keys, as the catalog has them now (those a snapshot reads them
    by: docs/snapshot.md; none where the publication leaves a key column out), for the
    sinks to key REPLICA IDENTITY FULL tables by (TableSink's ``keys``)."""
    try:
        with psycopg.connect(args.dbname or "", autocommit=True) as conn:
            tables = published_tables(conn, args.publication)
    except psycopg.Error as exc:
        raise explain(exc, args.dbname or "", args.slot) from None
    return {t.qualified: list(t.key) if t.ordered else [] for t in tables}


def mirror_options(to: str, fmt: str, checkpoint: str, *, master: str,
                   spark_conf: Sequence[str] = (), max_rows: int = 10000,
                   max_delay: float = 5.0) -> list[str]:
    """The spark emitter's -o options of a mirror."""
    for item in spark_conf:
        if "=" not in item or "," in item:
            raise UsageError(f"--spark-conf takes KEY=VALUE (one setting, no comma), not "
                             f"{item!r}")
    options = [f"checkpoint={checkpoint}", f"{'delta' if fmt == 'delta' else 'state'}-path={to}",
               f"master={master}", f"max-rows={max_rows}", f"max-delay={max_delay}",
               "app-name=pgdecode-mirror"]
    if spark_conf:
        options.append("spark-conf=" + ",".join(spark_conf))
    return options


def cmd_capture(args: argparse.Namespace) -> int:
    setup_logging(args)
    if args.file_out == "-":
        raise UsageError("capture writes a binary file: give it with -f FILE")
    if args.source != "walsender":
        raise UsageError("capture records the replication stream: --source sql cannot be "
                         "captured")
    if args.heartbeat is not None:
        raise UsageError("--heartbeat is for stream and mirror: a capture records every "
                         "message, and its replay would hand the heartbeats to the emitters")
    config = source_config(args)
    # A capture is one session's stream: after a reconnect the server sends again what was
    # not acknowledged, and a replay would see it twice, the first time cut short.
    config.reconnect = False
    existed = os.path.exists(args.file_out)
    if existed and os.path.getsize(args.file_out) > 0:
        raise UsageError(f"{args.file_out} exists: a capture is never overwritten (the slot "
                         "has moved past what it holds); give another file")
    # Opened now, so that a file that cannot be written is refused before streaming starts;
    # the header is written with the first message (it holds what the connection told).
    try:
        out = open(args.file_out, "ab")  # noqa: SIM115  (handed to the writer, or closed)
    except OSError as exc:
        raise OutputError(cannot_open(args.file_out, exc, progress=False)) from None
    pipeline = Pipeline()
    source: WalsenderSource

    def header() -> CaptureHeader:
        return CaptureHeader(
            proto_version=pipeline.proto_version, options=dict(source.options),
            server_version=source.server_version, slot=config.slot,
            created=datetime.now(UTC).isoformat())

    recorder = SessionRecorder(out, header)
    source = WalsenderSource(config, pipeline, tap=recorder.write, before_status=recorder.sync)
    try:
        run_source(source, status=status_line(args, source))
    except ConnectionLost as exc:
        raise SourceError(
            f"{exc}. {args.file_out} holds what the slot was told is done: start a new "
            "capture, to another file, to go on from there") from None
    finally:
        started, cut = recorder.started, recorder.close()
        if cut is not None:
            log.warning("the capture ended inside a transaction: its part was taken back "
                        "out of %s (%d bytes are kept); the next capture of the slot gets "
                        "that transaction whole", args.file_out, cut)
        if not started and not existed:  # nothing was recorded: leave no empty capture
            with contextlib.suppress(OSError):
                os.remove(args.file_out)
    return 0


def cmd_slot(args: argparse.Namespace) -> int:
    setup_logging(args)  # (creating a slot says what it waits for)
    try:
        with psycopg.connect(args.dbname or "", autocommit=True) as conn:
            if args.action == "list":
                rows = [("SLOT", "DATABASE", "ACTIVE", "TWO_PHASE", "CONFIRMED_FLUSH",
                         "WAL_STATUS")]
                for s in list_slots(conn):
                    rows.append((s.name, s.database or "", "yes" if s.active else "no",
                                 "yes" if s.two_phase else "no",
                                 str(s.confirmed_flush_lsn or ""), s.wal_status or ""))
                print_table(rows)
                return 0
            if not args.slot:
                raise UsageError("a slot is required: -S SLOT")
            if args.action == "create":
                info, created = create_slot(conn, args.slot, two_phase=args.two_phase,
                                            failover=args.failover,
                                            if_not_exists=args.if_not_exists)
                state = "created" if created else "exists"
                print(f"{info.name} {state} at {info.confirmed_flush_lsn}")
            else:
                dropped = drop_slot(conn, args.slot, if_exists=args.if_exists)
                print(f"{args.slot} {'dropped' if dropped else 'did not exist'}")
    except psycopg.errors.DuplicateObject:
        raise SourceError(f'replication slot "{args.slot}" already exists: drop it first, or '
                          "pass --if-not-exists to accept an existing slot") from None
    except psycopg.errors.UndefinedObject:
        raise SourceError(f'replication slot "{args.slot}" does not exist (pass --if-exists '
                          "to accept that)") from None
    except psycopg.Error as exc:
        raise explain(exc, args.dbname or "", args.slot) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return 0


def print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def cmd_status(args: argparse.Namespace) -> int:
    """The logical slots' health (sources/slots.py: slot_health), as a table or JSON."""
    try:
        with psycopg.connect(args.dbname or "", autocommit=True) as conn:
            slots = slot_health(conn, args.slot)
    except psycopg.Error as exc:
        raise explain(exc, args.dbname or "", args.slot) from None
    if args.slot and not slots:
        raise SlotUnusable(f'replication slot "{args.slot}" does not exist: create it with '
                           f"`pgdecode slot create -S {args.slot} ...`")
    mirror = None if args.mirror is None else mirror_status(args.mirror)
    if args.json:
        print(json.dumps(slots if mirror is None else {"slots": slots, "mirror": mirror},
                         default=str, indent=2))
        return 0

    def size(n: int | None) -> str:
        if n is None:
            return "-"
        for unit in ("B", "kB", "MB", "GB"):
            if abs(n) < 10240 or unit == "GB":
                return f"{n} {unit}"
            n //= 1024
        raise AssertionError

    def flag(value: bool | None) -> str:
        return "-" if value is None else "yes" if value else "no"

    rows = [("SLOT", "PLUGIN", "DATABASE", "ACTIVE_PID", "TWO_PHASE", "FAILOVER",
             "CONFIRMED_FLUSH", "LAG", "RETAINED", "WAL_STATUS", "SAFE_WAL_SIZE",
             "INACTIVE_SINCE", "PREPARED")]
    for s in slots:
        inactive = s["inactive_since"]
        rows.append((
            s["slot"], s["plugin"] or "-", s["database"] or "-", str(s["active_pid"] or "-"),
            flag(s["two_phase"]), flag(s["failover"]), s["confirmed_flush_lsn"] or "-",
            size(s["lag_bytes"]), size(s["retained_bytes"]), s["wal_status"] or "-",
            size(s["safe_wal_size"]),
            "-" if inactive is None else inactive.isoformat(timespec="seconds"),
            "-" if s["prepared"] is None else str(s["prepared"])))
        if s["wal_status"] == "lost":
            reason = s["invalidation_reason"]
            print(f'pgdecode: warning: slot "{s["slot"]}" was invalidated'
                  f'{f" ({reason})" if reason else ""}: '
                  f'{invalidated_advice(s["slot"], reason)}', file=sys.stderr)
        elif s["wal_status"] == "unreserved":
            print(f'pgdecode: warning: slot "{s["slot"]}" holds back more WAL than '
                  "max_slot_wal_keep_size allows: it will be invalidated at the next "
                  "checkpoint unless its consumer catches up", file=sys.stderr)
    print_table(rows)
    if mirror is not None:
        consistent = mirror["consistent_lsn"]
        print(f"mirror {args.mirror} (slot {mirror['slot']}, batch {mirror['batch']}): "
              + (f"equal to the source as of {consistent}" if consistent is not None else
                 "not known to equal the source (a snapshot under way, none taken, or rows "
                 "being read again)"))
    return 0


def mirror_status(path: str) -> dict[str, Any]:
    """What the checkpoint of a mirror (``pgdecode mirror --to PATH``, or its --checkpoint
    directory) says of it: the last batch and the LSN as of which the targets equal the
    source (None: not known to)."""
    from plugin_framework.spark.foreachbatch.checkpoint import Checkpoint, CheckpointError

    directory = os.path.join(path, "_pgdecode_checkpoint")
    if not os.path.isdir(directory):
        directory = path
    if not os.path.isfile(os.path.join(directory, "metadata")):
        raise UsageError(f"--mirror {path}: no mirror's checkpoint there (give the --to or "
                         "the --checkpoint directory of pgdecode mirror)")
    try:
        checkpoint = Checkpoint(directory)
    except CheckpointError as exc:
        raise SourceError(str(exc)) from None
    last = checkpoint.last_committed
    return {"checkpoint": directory, "slot": checkpoint.slot,
            "batch": None if last is None else last.batch_id,
            "consistent_lsn": None if checkpoint.consistent is None
            else str(checkpoint.consistent)}


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Ask the stream reading the slot for an incremental snapshot of each --table (a
    message it reads from its slot; docs/snapshot.md). The slot must exist: the stream that
    reads it (now or later) takes the snapshot. Each table is checked first as the stream
    checks it, against --publication (else every publication that publishes it): nothing is
    asked for if one cannot be taken."""
    if not args.slot:
        raise UsageError("a slot is required: -S SLOT")
    try:
        with psycopg.connect(args.dbname or "", autocommit=True) as conn:
            # the stream that reads the slot (now or later) takes the snapshot
            usable_slot(sql_query(conn), args.slot, dbname=conn.info.dbname,
                        server_version=conn.info.server_version, reader=False)
            for table in args.table:
                snapshot_table(conn, table, args.publication or publishing(conn, table))
            for table in args.table:
                lsn = request_snapshot(conn, args.slot, table)
                print(f"asked for an incremental snapshot of {table} at {lsn}")
    except psycopg.Error as exc:
        raise explain(exc, args.dbname or "", args.slot) from None
    return 0


def publishing(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """The publications that publish the table (none: SourceError)."""
    name = qualified_name(table)
    schema, _, rel = name.rpartition(".")
    if not conn.execute("SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = %s AND c.relname = %s", (schema, rel)).fetchall():
        raise SourceError(f"incremental snapshot of {name}: there is no such table (names "
                          "are as the catalog spells them: SCHEMA.TABLE, case included)")
    rows = conn.execute("SELECT pubname FROM pg_publication_tables "
                        "WHERE schemaname = %s AND tablename = %s ORDER BY pubname",
                        (schema, rel)).fetchall()
    if not rows:
        raise SourceError(
            f"incremental snapshot of {name}: no publication publishes the table: add it to "
            "the stream's (ALTER PUBLICATION ... ADD TABLE) first, so that the stream carries "
            "its changes")
    return [pubname for pubname, in rows]


def cmd_demo(args: argparse.Namespace) -> int:
    setup_logging(args)
    if args.spark:
        return demo_spark(args)
    check_emitters(args)  # before a server is started and the workload run
    files = args.output_files = []
    return int(run_demo(emitter_choice(args), memory_limit=memory_limit(args),
                        output_files=files))


def demo_spark(args: argparse.Namespace) -> int:
    """The tour mirrored into Parquet by Spark (as ``pgdecode mirror`` does), then each
    table's mirror shown."""
    import tempfile

    if args.emitter or args.option:
        raise UsageError("--spark chooses the emitter itself (spark, as pgdecode mirror): "
                         "leave out --emitter and -o")
    with tempfile.TemporaryDirectory(prefix="pgdecode-demo-") as work:
        to = os.path.join(work, "lake")
        options = mirror_options(to, "parquet", os.path.join(work, "checkpoint"),
                                 master="local[2]",
                                 spark_conf=["spark.ui.enabled=false",
                                             "spark.ui.showConsoleProgress=false"],
                                 max_delay=1.0)
        status = run_demo(EmitterChoice(["spark"], options, "-", None, "spark"),
                          memory_limit=memory_limit(args))
        from pyspark.sql import SparkSession

        from plugin_framework.spark import read_state

        spark = SparkSession.builder.getOrCreate()
        for table in sorted(os.listdir(os.path.join(to, "public"))):
            print(f"public.{table}, as mirrored in {to}/public/{table}:")
            read_state(spark, to, f"public.{table}").orderBy("id").show(truncate=40)
        spark.stop()
    return int(status)


def check_emitters(args: argparse.Namespace) -> None:
    """Refuse now what the emitters and -f would refuse once streaming starts: an emitter
    that is not installed, -o options the emitter rejects (a ValueError from its startup,
    the convention for options; docs/framework.md), an -f that cannot be written. Emitters
    that deliver elsewhere (Spark) are checked when they start: their startup sets up
    delivery."""

    class NoServerYet(Catalog):
        """A catalog, as the demo's emitters get one, that has no server to ask yet."""

        def _connection(self) -> Any:
            raise CatalogError("no server to ask yet")

    plan = emitter_choice(args).load()
    pipeline = Pipeline(slot_name="demo_slot", catalog=NoServerYet(""))
    for planned in plan:
        if planned.make_output is None:
            pipeline.add(planned.plugin, options=planned.options, output=MemoryOutput())
    try:
        pipeline.startup(is_init=False)
    except CallbackError as exc:
        if isinstance(exc.cause, ValueError):
            raise
        # Anything else (a catalog query, say) is for the real start to tell.
    else:
        pipeline.shutdown()
    for planned in plan:
        target = planned.target
        if target == "-" or planned.make_output is not None:
            continue
        existed = os.path.exists(target)
        try:
            open(target, "ab").close()
        except OSError as exc:
            raise OutputError(cannot_open(target, exc)) from None
        if not existed:
            os.remove(target)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "stream": cmd_stream, "mirror": cmd_mirror, "capture": cmd_capture, "slot": cmd_slot,
    "emitters": cmd_emitters, "snapshot": cmd_snapshot, "status": cmd_status,
    "replay": cmd_replay, "demo": cmd_demo,
}
