"""The ``pgdecode`` command line (``pgdecode = "plugin_framework.cli:main"``).

- parser: the argparse definition and the checks of values
- commands: one function per command (stream, capture, slot, emitters, replay, demo)
- status: the live status line; logs: text or JSON logging
- errors: how a failed command is reported, and its exit status
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from typing import Any

from plugin_framework.cli.proctitle import hide_password

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The command; ``argv`` None: this process's own command line, whose passwords are
    then masked in the process title (see proctitle) before anything heavy is imported."""
    if argv is None:
        hide_password()
    from plugin_framework.cli.commands import COMMANDS
    from plugin_framework.cli.errors import UsageError, exit_status, report_usage
    from plugin_framework.cli.parser import build_parser, check_dbname

    if argv is None:
        # This process is the command: what it imported lives as long as it does. Keep the
        # cycle collector from traversing all of that in each full collection of a long run
        # and once more at exit (50-80 ms of a short command's time).
        gc.freeze()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        check_dbname(args)
        status = int(COMMANDS[args.command](args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except UsageError as exc:
        return report_usage(args, exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return exit_status(exc, args)


def __getattr__(name: str) -> Any:
    """``build_parser``, imported when first asked for (it loads the framework)."""
    if name == "build_parser":
        from plugin_framework.cli.parser import build_parser

        return build_parser
    raise AttributeError(f"module 'plugin_framework.cli' has no attribute {name!r}")
