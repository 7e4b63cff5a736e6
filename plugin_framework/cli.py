"""The ``pgdecode`` command line. Command and option names follow pg_recvlogical."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from plugin_framework import __version__


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

    allow = args.emitter_allowlist.split(",") if args.emitter_allowlist else None
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
    from plugin_framework.framework import FileOutput, Pipeline
    from plugin_framework.framework.registry import load_emitter
    from plugin_framework.protocol import XLogData
    from plugin_framework.sources.capture import read_capture

    header, frames = read_capture(args.file)
    emitters = args.emitter or ["simple"]
    options = parse_plugin_options(args.option or [], emitters)
    allow = args.emitter_allowlist.split(",") if args.emitter_allowlist else None
    pipeline = Pipeline(proto_version=header.proto_version, slot_name=header.slot)
    for name in emitters:
        pipeline.add(load_emitter(name, allow), options=options[name],
                     output=FileOutput(args.file_out))
    pipeline.startup(is_init=False)
    try:
        for frame in frames:
            if isinstance(frame, XLogData):
                pipeline.feed(frame.data, frame.wal_start)
    finally:
        pipeline.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgdecode",
        description="Consume PostgreSQL logical replication (pgoutput) with Python output plugins.",
    )
    parser.add_argument("--version", action="version", version=f"pgdecode {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def emitter_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--emitter", action="append", metavar="NAME",
                       help="emitter to run (repeatable); see `pgdecode emitters`")
        p.add_argument("-o", "--option", action="append", metavar="NAME[=VALUE]",
                       help="emitter option; EMITTER.NAME=VALUE for one emitter only")
        p.add_argument("-f", "--file", dest="file_out", default="-", metavar="FILE",
                       help="output file, - for stdout (default)")
        p.add_argument("--emitter-allowlist", metavar="NAME,...",
                       help="load only these emitters (also PGDECODE_EMITTER_ALLOWLIST)")

    p = sub.add_parser("emitters", help="list installed emitters")
    p.add_argument("--emitter-allowlist", metavar="NAME,...")
    p.set_defaults(func=cmd_emitters)

    p = sub.add_parser("replay", help="drive emitters from a capture file, without a server")
    p.add_argument("file", metavar="FILE", help="a capture written by `pgdecode capture`")
    emitter_args(p)
    p.set_defaults(func=cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"pgdecode: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from plugin_framework.framework import CallbackError, PipelineError, PluginLoadError
        from plugin_framework.framework.registry import EmitterNotFound
        from plugin_framework.protocol import ProtocolError
        from plugin_framework.sources.capture import CaptureFormatError

        if isinstance(exc, CallbackError | PipelineError | PluginLoadError | EmitterNotFound
                      | ProtocolError | CaptureFormatError | OSError):
            print(f"pgdecode: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
