"""The ``pgdecode`` command line: its argparse definition and the checks of values that go
beyond argparse's (-d, -E, the slot options). Command and option names follow
pg_recvlogical."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from plugin_framework import __version__
from plugin_framework.app import EmitterChoice, UsageError
from plugin_framework.framework import DEFAULT_MEMORY_LIMIT
from plugin_framework.protocol import LSN
from plugin_framework.rowfilter import add_cli_arguments
from plugin_framework.sources.errors import ConninfoError, check_conninfo
from plugin_framework.sources.session import SourceConfig

# The modules that load pgdecode's C modules (plugin_framework._native), imported by --version
# so that it can say which are in use.
NATIVE_USERS = ("plugin_framework.protocol.tuples", "plugin_framework.framework.context",
                "plugin_framework.rowfilter.raw", "plugin_framework.sources.snapshots.copy",
                "plugin_framework.spark.changes.changerows", "emitters.json.fast",
                "emitters.text.fast", "emitters.wal2json.fast")


class VersionAction(argparse.Action):
    """``--version``: pgdecode's version, then each C module and whether it runs (else the
    Python code it mirrors runs, and why: not built, or PGDECODE_IMPL=python)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        import importlib

        from plugin_framework import native_status

        for name in NATIVE_USERS:
            importlib.import_module(name)
        lines = [f"pgdecode {__version__}", "C modules:"]
        lines += [f"  {module}: {status}" for module, status in native_status().items()]
        print("\n".join(lines))
        parser.exit()


def positive_seconds(text: str) -> float:
    """--status-interval: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def whole_number(low: int, high: int | None = None, what: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``low`` (at most ``high``), ``what``
    naming its unit in messages."""
    unit = f" ({what})" if what else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number{unit}: {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}{unit}, not {text!r}")
        return value

    return parse


positive_megabytes = whole_number(1, what="megabytes")  # --memory-limit
positive_int = whole_number(1)
port_number = whole_number(1, 65535, "a TCP port")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgdecode",
        description="Consume PostgreSQL logical replication (pgoutput) with Python output "
                    "plugins.",
    )
    parser.add_argument("--version", action=VersionAction, nargs=0,
                        help="show the version and which C modules are in use, and exit")
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
                            f"(default {DEFAULT_MEMORY_LIMIT >> 20})")

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
        p.add_argument("--heartbeat", type=positive_seconds, metavar="SECONDS",
                       help="write a heartbeat message into the database every SECONDS, so "
                            "that the slot of an idle database moves on (needs EXECUTE on "
                            "pg_logical_emit_message; off by default)")
        p.add_argument("-q", "--quiet", action="store_true", help="no status line")
        p.add_argument("--log-format", choices=("text", "json"), default="text")
        p.add_argument("-v", "--verbose", action="store_true")

    def snapshot_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--snapshot", choices=("initial", "only"),
                       help="with --create-slot: first copy the published tables' rows as of "
                            "the new slot (initial), then stream; or only copy them (only)")
        p.add_argument("--snapshot-workers", type=int, default=2, metavar="N",
                       help="connections copying tables, and key ranges of large ones, in "
                            "parallel (default 2)")
        p.add_argument("--snapshot-table", action="append", metavar="SCHEMA.TABLE",
                       help="copy a published table's rows into the running stream, chunk by "
                            "chunk (an incremental snapshot; repeatable)")

    def metrics_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--metrics-port", type=port_number, metavar="PORT",
                       help="serve Prometheus metrics at http://ADDRESS:PORT/metrics")
        p.add_argument("--metrics-address", default="", metavar="ADDRESS",
                       help="the address to serve metrics on (default: all)")

    p = sub.add_parser("stream", help="stream a slot through emitters")
    connection_args(p)
    source_args(p)
    snapshot_args(p)
    metrics_args(p)
    emitter_args(p, "json")
    add_cli_arguments(p)

    p = sub.add_parser("mirror", help="keep the published tables' current state in Parquet or "
                                      "Delta Lake, through Spark")
    connection_args(p)
    source_args(p)
    snapshot_args(p)
    metrics_args(p)
    p.add_argument("--to", required=True, metavar="DIR",
                   help="where the tables go (DIR/SCHEMA/TABLE): a local path, or a URI "
                        "that pyarrow (Parquet) or deltalake (Delta) writes to")
    p.add_argument("--format", choices=("parquet", "delta"), default="parquet",
                   help="parquet (default; each batch rewrites the files holding the keys it "
                        "touches) or delta (each batch merged; needs pgdecode[delta])")
    p.add_argument("--no-reread", action="append", metavar="TABLE", default=None,
                   help="do not read TABLE (schema.table) again after an ALTER TABLE the mirror "
                        "cannot follow exactly (for huge tables; repeatable): added columns "
                        "stay NULL in older rows until they change")
    p.add_argument("--history", action="store_true",
                   help="also keep every version of every row, as Delta tables at "
                        "DIR/_history/SCHEMA/TABLE (needs pgdecode[delta])")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="local directory of the batch log, kept with the slot (default "
                        "DIR/_pgdecode_checkpoint when --to is local)")
    p.add_argument("--master", default="local[*]",
                   help="Spark master URL (default local[*]); under spark-submit, its own")
    p.add_argument("--spark-conf", action="append", metavar="KEY=VALUE",
                   help="a Spark setting (repeatable)")
    p.add_argument("--max-rows", type=positive_int, default=10000, metavar="N",
                   help="changes that close a micro-batch (default 10000)")
    p.add_argument("--max-delay", type=positive_seconds, default=5.0, metavar="SECONDS",
                   help="seconds after which a micro-batch goes out (default 5)")
    p.add_argument("--memory-limit", type=positive_megabytes, metavar="MB",
                   help="memory for reassembling transactions before spilling to disk "
                        f"(default {DEFAULT_MEMORY_LIMIT >> 20})")
    add_cli_arguments(p)

    p = sub.add_parser("snapshot", help="ask a running stream for an incremental snapshot")
    connection_args(p)
    p.add_argument("--table", action="append", required=True, metavar="SCHEMA.TABLE",
                   help="the published table to copy into the stream (repeatable)")
    p.add_argument("--publication", action="append", metavar="NAME",
                   help="the stream's publications, to check each table against (default: "
                        "every publication that publishes it; repeatable)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("-v", "--verbose", action="store_true")

    p = sub.add_parser("capture", help="record a slot's raw stream for `pgdecode replay`")
    connection_args(p)
    source_args(p)
    p.add_argument("-f", "--file", dest="file_out", default="-", metavar="FILE")

    p = sub.add_parser("slot", help="create, drop or list replication slots")
    p.add_argument("action", choices=("create", "drop", "list"))
    connection_args(p)
    p.add_argument("--two-phase", action="store_true", help="create: enable two-phase decoding")
    p.add_argument("--failover", action="store_true", help="create: a failover slot (17+)")
    p.add_argument("--if-not-exists", action="store_true")
    p.add_argument("--if-exists", action="store_true")

    p = sub.add_parser("status", help="the health of the database's logical slots")
    connection_args(p)
    p.add_argument("--json", action="store_true", help="JSON, for scripts")
    p.add_argument("--mirror", metavar="DIR", help="also say whether the mirror at DIR (its "
                   "--to or --checkpoint) equals the source, and as of which LSN")

    p = sub.add_parser("emitters", help="list installed emitters")
    p.add_argument("--emitter-allowlist", metavar="NAME,...")

    p = sub.add_parser("replay", help="drive emitters from a capture file, without a server")
    p.add_argument("file", metavar="FILE", help="a capture written by `pgdecode capture`")
    p.add_argument("-d", "--dbname", metavar="CONNINFO",
                   help="the database the capture was recorded from, for the row filters that "
                        "need its catalog (--row-filter, --filters-from-publication); the "
                        "emitters do not use it")
    p.add_argument("--partial", action="store_true",
                   help="replay a truncated or damaged capture up to its last whole "
                        "transaction before the damage (exit status 1 all the same), instead "
                        "of refusing it before anything is replayed")
    emitter_args(p, "json")
    add_cli_arguments(p)

    p = sub.add_parser("demo", help="a tour on a throwaway embedded PostgreSQL 18")
    emitter_args(p, "json")
    p.add_argument("--spark", action="store_true",
                   help="mirror the tour's tables through Spark (pgdecode mirror) and show "
                        "them")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("-v", "--verbose", action="store_true")
    return parser


def check_dbname(args: argparse.Namespace) -> None:
    """-d, checked once before any command uses it: a string that cannot be parsed, or that
    libpq would misread (part of the password taken for a host or port, and printed), is
    refused without showing any of it."""
    dbname = getattr(args, "dbname", None)
    if dbname:
        try:
            check_conninfo(dbname)
        except ConninfoError as exc:
            raise UsageError(str(exc)) from None


def source_config(args: argparse.Namespace) -> SourceConfig:
    """The source's configuration from the command line, checked."""
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
    snapshot = getattr(args, "snapshot", None)
    workers = getattr(args, "snapshot_workers", 2)
    if snapshot is not None:
        if not args.create_slot:
            raise UsageError(
                "--snapshot needs --create-slot: the copy is taken at the new slot's "
                "consistent point, so that the stream continues exactly where it ends")
        if args.source != "walsender":
            raise UsageError("--snapshot needs --source walsender: the copy reads the "
                             "snapshot that creating the slot on the replication connection "
                             "exports")
    if getattr(args, "snapshot_table", None):
        if args.source != "walsender":
            raise UsageError("--snapshot-table needs --source walsender")
        if args.no_messages:
            raise UsageError("--snapshot-table needs logical messages (its watermarks are "
                             "messages in the stream): leave out --no-messages")
        if args.binary:
            raise UsageError("--snapshot-table needs text values (the chunk's keys are "
                             "matched with the stream's): leave out --binary")
    heartbeat = getattr(args, "heartbeat", None)
    if heartbeat is not None and args.source != "walsender":
        raise UsageError("--heartbeat needs --source walsender (the SQL functions would hand "
                         "the heartbeats to the emitters)")
    if not 1 <= workers <= 64:
        raise UsageError(f"--snapshot-workers must be between 1 and 64, not {workers}")
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
        reconnect=not args.no_reconnect, snapshot=snapshot, snapshot_workers=workers,
        snapshot_tables=getattr(args, "snapshot_table", None) or (), heartbeat=heartbeat,
    )


def allowlist(args: argparse.Namespace) -> list[str] | None:
    """--emitter-allowlist, as a list (None: not given)."""
    return args.emitter_allowlist.split(",") if args.emitter_allowlist else None


def emitter_choice(args: argparse.Namespace, default: str = "json") -> EmitterChoice:
    """The emitters the command line names (--emitter, -o, -f, --emitter-allowlist)."""
    return EmitterChoice(args.emitter, args.option or [], args.file_out, allowlist(args),
                         default)


def memory_limit(args: argparse.Namespace) -> int | None:
    """--memory-limit, in bytes (None: the default)."""
    megabytes = getattr(args, "memory_limit", None)
    return megabytes * 1024 * 1024 if megabytes else None

