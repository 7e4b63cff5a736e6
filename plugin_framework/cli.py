"""The ``pgdecode`` command line. Command and option names follow pg_recvlogical."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from plugin_framework import __version__

if TYPE_CHECKING:
    from plugin_framework.rowfilter import PublicationFilters


class UsageError(Exception):
    """Bad command-line input; printed without a traceback, exit status 2."""


def parse_plugin_options(pairs: Sequence[str],
                         emitters: Sequence[str]) -> dict[str, dict[str, str | None]]:
    """``-o NAME[=VALUE]`` options per emitter; ``-o EMITTER.NAME=VALUE`` scopes to one.

    An unscoped option goes to every emitter; ``-o NAME`` alone has the value None (true, for
    a boolean). A repeated option is an error.
    """
    per: dict[str, dict[str, str | None]] = {e: {} for e in emitters}
    for pair in pairs:
        name, eq, text = pair.partition("=")
        value = text if eq else None
        targets = list(emitters)
        scope, dot, rest = name.partition(".")
        if dot and scope in per:
            targets, name = [scope], rest
        if not name:
            raise UsageError(f"option {pair!r} has no name")
        for target in targets:
            if name in per[target]:
                raise UsageError(f'option "{name}" given twice for emitter "{target}"')
            per[target][name] = value
    return per


def cmd_emitters(args: argparse.Namespace) -> int:
    from plugin_framework.framework.registry import installed_emitters, load_emitter

    allow = _allowlist(args)
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
    from plugin_framework.protocol import ProtocolError, XLogData
    from plugin_framework.sources.capture import CaptureFormatError, read_capture, read_header

    setup_logging(args)
    # Emitters run without a catalog, as the capture was recorded; -d serves the filters.
    # Bad filters, emitters or options fail first; then a file that is no capture, before
    # any output is opened.
    pipeline, filters = filtered_pipeline(args, None, None, args.dbname,
                                          check=lambda f: check_capture(f, args.file),
                                          before_output=lambda: read_header(args.file))
    try:
        header, frames = read_capture(args.file)
        pipeline.slot_name = header.slot
        pipeline.set_proto_version(header.proto_version)
        pipeline.set_server_version(header.server_version)
        pipeline.startup(is_init=False)
        try:
            try:
                for frame in frames:
                    if isinstance(frame, XLogData):
                        pipeline.feed(frame.data, frame.wal_start)
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
    from plugin_framework.framework.model import Relation
    from plugin_framework.protocol import ProtocolError
    from plugin_framework.sources.capture import CaptureFormatError, described_relations

    relations = described_relations(path)
    try:
        for message in relations:
            filters.check(Relation.from_message(message, {}))
    except (CaptureFormatError, ProtocolError):
        return


def _allowlist(args: argparse.Namespace) -> list[str] | None:
    return args.emitter_allowlist.split(",") if args.emitter_allowlist else None


def plan_emitters(args: argparse.Namespace,
                  default_emitter: str = "json") -> list[tuple[Any, dict[str, str | None], str]]:
    """The emitters named on the command line, loaded: each with its -o options and the
    file it writes (-f; FILE.EMITTER each with several)."""
    from plugin_framework.framework.registry import load_emitter

    emitters = args.emitter or [default_emitter]
    if len(set(emitters)) != len(emitters):
        raise UsageError("an emitter can be named once; use -o EMITTER.NAME=VALUE to vary options")
    options = parse_plugin_options(args.option or [], emitters)
    plan = []
    for name in emitters:
        target = args.file_out
        if len(emitters) > 1 and target != "-":
            target = f"{target}.{name}"  # one file per emitter
        plan.append((load_emitter(name, _allowlist(args)), options[name], target))
    return plan


def cannot_open(target: str, exc: OSError, progress: bool = True) -> str:
    """An output file that cannot be opened: which, why, and what to do."""
    which = f" ({exc.filename})" if exc.filename and str(exc.filename) != target else ""
    beside = " (FILE.progress goes beside it)" if progress else ""
    return (f"cannot open {target} for writing{which}: {exc.strerror or exc}: give -f a file "
            f"in an existing directory that you can write to{beside}")


def open_output(target: str) -> Any:
    """FileOutput(target), an error naming the file if it cannot be opened."""
    from plugin_framework.framework import FileOutput, OutputError

    try:
        return FileOutput(target)
    except OSError as exc:
        raise OutputError(cannot_open(target, exc)) from None


def build_pipeline(args: argparse.Namespace, slot: str | None, catalog_conninfo: str | None,
                   default_emitter: str = "json",
                   before_output: Callable[[], object] | None = None) -> Any:
    """A Pipeline with the emitters named on the command line, writing to -f.
    ``before_output``: a last check, once the emitters are loaded, before -f is opened."""
    from plugin_framework.framework import Catalog, Pipeline

    plan = plan_emitters(args, default_emitter)
    if before_output is not None:
        before_output()
    memory = args.memory_limit * 1024 * 1024 if getattr(args, "memory_limit", None) else None
    kwargs: dict[str, Any] = {"slot_name": slot}
    if memory:
        kwargs["memory_limit"] = memory
    if catalog_conninfo:
        kwargs["catalog"] = Catalog(catalog_conninfo)
    pipeline = Pipeline(**kwargs)
    files = args.output_files = []  # for naming the file in an error: see _file_error
    for loaded, options, target in plan:
        # An emitter that delivers elsewhere (Spark) brings its own Output, which says when
        # its work is durable; the others write to -f.
        make_output = getattr(loaded.plugin, "make_output", None)
        if callable(make_output):
            output = make_output()
        else:
            output = open_output(target)
            files.append((output, target))
        pipeline.add(loaded, options=options, output=output)
    return pipeline


def row_filters(args: argparse.Namespace, conninfo: str | None) -> PublicationFilters | None:
    """The filters the row-filter options give (None without any), checked against the
    catalog now. ``conninfo`` None: no catalog (replay without -d), which is enough for
    column lists; what needs one is refused, saying to pass -d."""
    from plugin_framework.rowfilter import PublicationFilters, config_from_args

    cfg = config_from_args(args)
    if cfg is None:
        return None
    if conninfo is None:
        reason = cfg.connection_reason()
        if reason is not None:
            raise UsageError(f"{reason}: pass -d CONNINFO, a connection to the database the "
                             "changes come from")
    import psycopg

    from plugin_framework.sources.errors import explain

    try:
        return PublicationFilters.from_config(cfg, conninfo)
    except psycopg.Error as exc:  # the catalog connection: refused, bad password...
        raise explain(exc, conninfo or "") from None


def filtered_pipeline(args: argparse.Namespace, slot: str | None, catalog_conninfo: str | None,
                      filter_conninfo: str | None,
                      check: Callable[[PublicationFilters], None] | None = None,
                      before_output: Callable[[], object] | None = None,
                      ) -> tuple[Any, PublicationFilters | None]:
    """``build_pipeline`` with the row-filter options (--row-filter, --column-list,
    --filter-config, --filters-from-publication) as its change and truncate filters: how
    ``stream`` and ``replay`` both apply them. The filters come first, so that a bad one is
    refused before any output is opened, and before anything is streamed or acknowledged.
    The caller closes the filters (their catalog connection)."""
    filters = row_filters(args, filter_conninfo)
    try:
        if filters is not None and check is not None:
            check(filters)
        pipeline = build_pipeline(args, slot, catalog_conninfo, before_output=before_output)
    except BaseException:
        if filters is not None:
            filters.close()
        raise
    if filters is not None:
        pipeline.change_filter = filters.as_change_filter()
        pipeline.truncate_filter = filters.truncate_filter
    return pipeline, filters


def source_config(args: argparse.Namespace) -> Any:
    from plugin_framework.protocol import LSN
    from plugin_framework.sources.walsender import SourceConfig

    if not args.slot:
        raise UsageError("a slot is required: -S SLOT")
    if not args.publication:
        raise UsageError("at least one --publication is required")
    if args.two_phase and not args.create_slot:
        raise UsageError("--two-phase may only be specified with --create-slot (two-phase "
                         "decoding is a property of the slot, set when it is created)")
    if args.temporary and not args.create_slot:
        raise UsageError("--temporary may only be specified with --create-slot")
    if args.temporary and args.source != "walsender":
        raise UsageError("--temporary needs --source walsender: a temporary slot lives as "
                         "long as the replication connection that created it")
    try:
        endpos = LSN(args.endpos) if args.endpos else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return SourceConfig(
        conninfo=args.dbname or "", slot=args.slot, publications=args.publication,
        proto_version=args.proto_version, streaming=args.streaming,
        messages=not args.no_messages, binary=args.binary, origin=args.origin, endpos=endpos,
        status_interval=args.status_interval, create_slot=args.create_slot,
        slot_two_phase=args.two_phase, temporary_slot=args.temporary,
        reconnect=not args.no_reconnect,
    )


class StatusLine:
    """A one-line live status on a terminal's stderr: positions, lag, rates."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._last = (time.monotonic(), 0, 0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            p = self.source.progress
            pipeline = self.source.pipeline
            now = time.monotonic()
            then, txns, changes = self._last
            dt = max(now - then, 1e-6)
            rate_t = (pipeline.transactions - txns) / dt
            rate_c = (pipeline.changes - changes) / dt
            self._last = (now, pipeline.transactions, pipeline.changes)
            lag_bytes = max(0, int(p.server_end) - int(p.acked))
            lag_s = max(0.0, time.time() - p.server_time) if p.server_time else 0.0
            state = "" if p.connected else " (reconnecting)"
            sys.stderr.write(
                f"\rreceived {p.received}  acked {p.acked}  lag {lag_bytes} B / {lag_s:.1f} s  "
                f"{rate_t:.0f} txn/s  {rate_c:.0f} changes/s{state}\033[K"
            )
            sys.stderr.flush()


class JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname.lower(),
                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "text") == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("pgdecode: %(levelname)s: %(message)s"))
    root = logging.getLogger("pgdecode")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if getattr(args, "verbose", False) else logging.INFO)
    root.propagate = False


def run_source(source: Any, args: argparse.Namespace) -> None:
    """Run a source with SIGINT/SIGTERM meaning: finish the transaction, acknowledge, exit 0."""
    previous: dict[signal.Signals, Any] = {}

    def stop(signum: int, frame: Any) -> None:
        logging.getLogger("pgdecode").info("signal %d: stopping after this transaction", signum)
        source.request_stop()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, stop)
    status = None
    if not args.quiet and sys.stderr.isatty():
        status = StatusLine(source)
        status.start()
    try:
        source.run()
    finally:
        if status is not None:
            status.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_stream(args: argparse.Namespace) -> int:
    from plugin_framework.sources.sql import SqlSource
    from plugin_framework.sources.walsender import WalsenderSource

    setup_logging(args)
    config = source_config(args)
    # Filters are checked against the catalog now: before anything is streamed or acked.
    pipeline, filters = filtered_pipeline(args, config.slot, config.conninfo, config.conninfo)
    source: Any
    if args.source == "sql":
        source = SqlSource(config, pipeline)
    else:
        source = WalsenderSource(config, pipeline)
    try:
        run_source(source, args)
    finally:
        pipeline.shutdown()
        if filters is not None:
            filters.close()
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from plugin_framework.framework import OutputError, Pipeline
    from plugin_framework.protocol import encode_copy_data
    from plugin_framework.sources.capture import CaptureHeader, CaptureWriter
    from plugin_framework.sources.errors import ConnectionLost, SourceError
    from plugin_framework.sources.walsender import WalsenderSource

    setup_logging(args)
    if args.file_out == "-":
        raise UsageError("capture writes a binary file: give it with -f FILE")
    if args.source != "walsender":
        raise UsageError("capture records the replication stream: --source sql cannot be "
                         "captured")
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
    writer: CaptureWriter | None = None
    source: WalsenderSource

    def tap(message: Any) -> None:
        nonlocal writer
        if writer is None:
            header = CaptureHeader(
                proto_version=pipeline.proto_version, options=dict(source._options),
                server_version=source.server_version, slot=config.slot,
                created=datetime.now(UTC).isoformat())
            writer = CaptureWriter(out, header)
        writer.write(encode_copy_data(message))

    def sync() -> None:
        if writer is not None:
            writer.flush()
            os.fsync(writer.fileno())

    source = WalsenderSource(config, pipeline, tap=tap, before_status=sync)
    try:
        run_source(source, args)
    except ConnectionLost as exc:
        raise SourceError(
            f"{exc}. {args.file_out} holds what the slot was told is done: start a new "
            "capture, to another file, to go on from there") from None
    finally:
        if writer is not None:
            sync()
            writer.close()
        else:
            out.close()
            if not existed:  # nothing was recorded: leave no empty capture behind
                with contextlib.suppress(OSError):
                    os.remove(args.file_out)
    return 0


def cmd_slot(args: argparse.Namespace) -> int:
    import psycopg

    from plugin_framework.sources.errors import SourceError, explain
    from plugin_framework.sources.slots import create_slot, drop_slot, list_slots

    try:
        with psycopg.connect(args.dbname or "", autocommit=True) as conn:
            if args.action == "list":
                rows = [("SLOT", "DATABASE", "ACTIVE", "TWO_PHASE", "CONFIRMED_FLUSH",
                         "WAL_STATUS")]
                for s in list_slots(conn):
                    rows.append((s.name, s.database or "", "yes" if s.active else "no",
                                 "yes" if s.two_phase else "no",
                                 str(s.confirmed_flush_lsn or ""), s.wal_status or ""))
                widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
                for row in rows:
                    print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
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


def cmd_demo(args: argparse.Namespace) -> int:
    from plugin_framework.demo import run_demo

    setup_logging(args)
    check_emitters(args)  # before a server is started and the workload run
    return int(run_demo(args))


def check_emitters(args: argparse.Namespace) -> None:
    """Refuse now what the emitters and -f would refuse once streaming starts: an emitter
    that is not installed, -o options the emitter rejects (a ValueError from its startup,
    the convention for options; docs/framework.md), an -f that cannot be written. Emitters
    that deliver elsewhere (Spark) are checked when they start: their startup sets up
    delivery."""
    from plugin_framework.framework import (
        CallbackError,
        Catalog,
        CatalogError,
        MemoryOutput,
        OutputError,
        Pipeline,
    )

    class NoServerYet(Catalog):
        """A catalog, as the demo's emitters get one, that has no server to ask yet."""

        def _connection(self) -> Any:
            raise CatalogError("no server to ask yet")

    plan = plan_emitters(args)
    pipeline = Pipeline(slot_name="demo_slot", catalog=NoServerYet(""))
    for loaded, options, _ in plan:
        if not callable(getattr(loaded.plugin, "make_output", None)):
            pipeline.add(loaded, options=options, output=MemoryOutput())
    try:
        pipeline.startup(is_init=False)
    except CallbackError as exc:
        if isinstance(exc.cause, ValueError):
            raise
        # Anything else (a catalog query, say) is for the real start to tell.
    else:
        pipeline.shutdown()
    for loaded, _, target in plan:
        if target == "-" or callable(getattr(loaded.plugin, "make_output", None)):
            continue
        existed = os.path.exists(target)
        try:
            open(target, "ab").close()
        except OSError as exc:
            raise OutputError(cannot_open(target, exc)) from None
        if not existed:
            os.remove(target)


def positive_seconds(text: str) -> float:
    """--status-interval: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def positive_megabytes(text: str) -> int:
    """--memory-limit: a positive whole number of megabytes."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of megabytes: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1 (megabyte), not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgdecode",
        description="Consume PostgreSQL logical replication (pgoutput) with Python output "
                    "plugins.",
    )
    parser.add_argument("--version", action="version", version=f"pgdecode {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def emitter_args(p: argparse.ArgumentParser, default: str) -> None:
        p.add_argument("--emitter", action="append", metavar="NAME",
                       help=f"emitter to run (repeatable; default {default}); see "
                            "`pgdecode emitters`")
        p.add_argument("-o", "--option", action="append", metavar="NAME[=VALUE]",
                       help="emitter option; EMITTER.NAME=VALUE for one emitter only")
        p.add_argument("-f", "--file", dest="file_out", default="-", metavar="FILE",
                       help="output file, - for stdout (default); with several emitters, "
                            "FILE.EMITTER each")
        p.add_argument("--emitter-allowlist", metavar="NAME,...",
                       help="load only these emitters (also PGDECODE_EMITTER_ALLOWLIST)")
        p.add_argument("--memory-limit", type=positive_megabytes, metavar="MB",
                       help="memory for reassembling transactions before spilling to disk "
                            "(default 64)")

    def connection_args(p: argparse.ArgumentParser, slot_required: bool = True) -> None:
        p.add_argument("-d", "--dbname", metavar="CONNINFO",
                       help="libpq connection string or URI (PG* environment variables apply)")
        p.add_argument("-S", "--slot", metavar="SLOT", help="replication slot name")

    def source_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--publication", action="append", metavar="PUB",
                       help="publication to stream (repeatable)")
        p.add_argument("--create-slot", action="store_true",
                       help="create the slot first if it does not exist")
        p.add_argument("--two-phase", action="store_true",
                       help="with --create-slot: enable two-phase decoding on the slot")
        p.add_argument("--temporary", action="store_true",
                       help="with --create-slot: a temporary slot, dropped when the stream "
                            "ends (it cannot survive a reconnect)")
        p.add_argument("-E", "--endpos", metavar="LSN",
                       help="stop once a transaction ending at or past LSN is processed")
        p.add_argument("--source", choices=("walsender", "sql"), default="walsender",
                       help="replication connection (default) or the SQL functions")
        p.add_argument("--proto-version", type=int, choices=(1, 2, 3, 4),
                       help="pgoutput protocol version (default: the highest the server has)")
        p.add_argument("--streaming", choices=("off", "on", "parallel"), default="on",
                       help="stream large in-progress transactions (default on)")
        p.add_argument("--no-messages", action="store_true",
                       help="do not request logical messages")
        p.add_argument("--binary", action="store_true", help="binary column values")
        p.add_argument("--origin", choices=("any", "none"),
                       help="only changes with no origin (none), or all (any; PostgreSQL 16+)")
        p.add_argument("--status-interval", type=positive_seconds, default=10.0,
                       metavar="SECONDS",
                       help="seconds between acknowledgements (default 10)")
        p.add_argument("--no-reconnect", action="store_true",
                       help="exit instead of reconnecting when the connection drops")
        p.add_argument("-q", "--quiet", action="store_true", help="no status line")
        p.add_argument("--log-format", choices=("text", "json"), default="text")
        p.add_argument("-v", "--verbose", action="store_true")

    from plugin_framework.rowfilter import add_cli_arguments

    p = sub.add_parser("stream", help="stream a slot through emitters")
    connection_args(p)
    source_args(p)
    emitter_args(p, "json")
    add_cli_arguments(p)
    p.set_defaults(func=cmd_stream)

    p = sub.add_parser("capture", help="record a slot's raw stream for `pgdecode replay`")
    connection_args(p)
    source_args(p)
    p.add_argument("-f", "--file", dest="file_out", default="-", metavar="FILE")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("slot", help="create, drop or list replication slots")
    p.add_argument("action", choices=("create", "drop", "list"))
    connection_args(p)
    p.add_argument("--two-phase", action="store_true", help="create: enable two-phase decoding")
    p.add_argument("--failover", action="store_true", help="create: a failover slot (17+)")
    p.add_argument("--if-not-exists", action="store_true")
    p.add_argument("--if-exists", action="store_true")
    p.set_defaults(func=cmd_slot)

    p = sub.add_parser("emitters", help="list installed emitters")
    p.add_argument("--emitter-allowlist", metavar="NAME,...")
    p.set_defaults(func=cmd_emitters)

    p = sub.add_parser("replay", help="drive emitters from a capture file, without a server")
    p.add_argument("file", metavar="FILE", help="a capture written by `pgdecode capture`")
    p.add_argument("-d", "--dbname", metavar="CONNINFO",
                   help="the database the capture was recorded from, for the row filters that "
                        "need its catalog (--row-filter, --filters-from-publication); the "
                        "emitters do not use it")
    emitter_args(p, "json")
    add_cli_arguments(p)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("demo", help="a tour on a throwaway embedded PostgreSQL 18")
    emitter_args(p, "json")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        check_dbname(args)
        status = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except UsageError as exc:
        _report(args, f"{exc}", usage=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if _stdout_closed(exc, args):
            return _end_at_closed_stdout()
        message = _file_error(exc, args)
        if message is not None:
            _report(args, message)
            return 1
        if _is_user_facing(exc):
            _report(args, f"{exc}")
            return 1
        raise


def check_dbname(args: argparse.Namespace) -> None:
    """-d, checked once before any command uses it: a string that cannot be parsed, or that
    libpq would misread (part of the password taken for a host or port, and printed), is
    refused without showing any of it."""
    from plugin_framework.sources.errors import ConninfoError, check_conninfo

    dbname = getattr(args, "dbname", None)
    if dbname:
        try:
            check_conninfo(dbname)
        except ConninfoError as exc:
            raise UsageError(str(exc)) from None


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and what led to it: causes, contexts, a callback's own exception."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return seen


def _stdout_closed(exc: BaseException, args: argparse.Namespace) -> bool:
    """Whether the command failed because the reader of stdout went away (``| head``)."""
    return getattr(args, "file_out", "-") == "-" and any(
        isinstance(e, BrokenPipeError) for e in _causes(exc))


def _end_at_closed_stdout() -> int:
    """End quietly when stdout's reader went away, as pg_recvlogical -f - does (like cat,
    grep and other C tools, it is killed by SIGPIPE: no message, and a shell reports status
    128 + 13 = 141). Python ignores SIGPIPE and gets EPIPE instead; exit with the status
    the shell would show. (The slot is acknowledged only up to what the pipe took.) stdout
    now points at /dev/null, so that the interpreter's last flush of what is left in its
    buffer fails quietly too."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + int(signal.SIGPIPE)


def _file_error(exc: BaseException, args: argparse.Namespace) -> str | None:
    """An error writing an output file (-f), naming the file and saying what to do; None if
    the error is something else. The OSError of a failed write names no file: its traceback
    tells which of the command's outputs raised it."""
    files = getattr(args, "output_files", None) or []
    for error in _causes(exc):
        if not isinstance(error, OSError) or error.filename is not None:
            continue
        tb = error.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            for output, target in files:
                if owner is output:
                    return (f"cannot write to {target}: {error.strerror or error}. Make room "
                            "there (or give another file with -f) and run the command again: "
                            "it goes on from what the file holds")
            tb = tb.tb_next
    return None


def _report(args: argparse.Namespace, message: str, usage: bool = False) -> None:
    """The error that ends the command: a JSON line with --log-format json."""
    if getattr(args, "log_format", "text") == "json":
        record = logging.LogRecord("pgdecode", logging.ERROR, __file__, 0, message, None, None)
        print(JsonLogFormatter().format(record), file=sys.stderr)
    else:
        print(f"pgdecode: {'' if usage else 'error: '}{message}", file=sys.stderr)


def _is_user_facing(exc: Exception) -> bool:
    from plugin_framework.framework import (
        CallbackError,
        OutputError,
        PipelineError,
        PluginLoadError,
    )
    from plugin_framework.framework.registry import EmitterNotFound
    from plugin_framework.protocol import ProtocolError
    from plugin_framework.rowfilter import RowFilterError
    from plugin_framework.sources.capture import CaptureFormatError
    from plugin_framework.sources.errors import SourceError

    user_facing: tuple[type[Exception], ...] = (
        CallbackError, OutputError, PipelineError, PluginLoadError, EmitterNotFound,
        ProtocolError, CaptureFormatError, SourceError, RowFilterError, OSError)
    return isinstance(exc, user_facing)


if __name__ == "__main__":
    sys.exit(main())
