"""How a command that fails ends: the message (text, or a JSON line with --log-format
json), and the exit status: 2 for bad input, 1 for an error the user can act on, 3 when the
slot is missing or invalidated (restarting will not help), 4 when a stop (SIGTERM, Ctrl-C)
came before a snapshot was complete (running the command again goes on with it), 141 when
stdout's reader went away, 130 on Ctrl-C; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys

from plugin_framework.app import UsageError
from plugin_framework.cli.logs import JsonLogFormatter
from plugin_framework.framework import CallbackError, OutputError, PipelineError, PluginLoadError
from plugin_framework.framework.registry import EmitterNotFound
from plugin_framework.framework.statecheck import StateFileError
from plugin_framework.protocol import ProtocolError
from plugin_framework.rowfilter import RowFilterError
from plugin_framework.sources.capture import CaptureFormatError
from plugin_framework.sources.errors import SlotUnusable, SourceError
from plugin_framework.sources.snapshots.initial import SnapshotUnfinished

__all__ = ["UsageError", "exit_status", "is_user_facing", "report", "report_usage"]


def causes(exc: BaseException) -> list[BaseException]:
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


def stdout_closed(exc: BaseException, args: argparse.Namespace) -> bool:
    """Whether the command failed because the reader of stdout went away (``| head``)."""
    return getattr(args, "file_out", "-") == "-" and any(
        isinstance(e, BrokenPipeError) for e in causes(exc))


def end_at_closed_stdout() -> int:
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


def file_error(exc: BaseException, args: argparse.Namespace) -> str | None:
    """An error writing an output file (-f), naming the file and saying what to do; None if
    the error is something else. The OSError of a failed write names no file: its traceback
    tells which of the command's outputs raised it."""
    files = getattr(args, "output_files", None) or []
    for error in causes(exc):
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


SLOT_UNUSABLE = 3  # the exit status when the slot is missing or invalidated
SNAPSHOT_UNFINISHED = 4  # stopped with a snapshot not complete: run again to go on


def report(args: argparse.Namespace, message: str, usage: bool = False) -> None:
    """The error that ends the command: a JSON line with --log-format json."""
    if getattr(args, "log_format", "text") == "json":
        record = logging.LogRecord("pgdecode", logging.ERROR, __file__, 0, message, None, None)
        print(JsonLogFormatter().format(record), file=sys.stderr)
    else:
        print(f"pgdecode: {'' if usage else 'error: '}{message}", file=sys.stderr)


USER_FACING: tuple[type[Exception], ...] = (
    CallbackError, OutputError, PipelineError, PluginLoadError, EmitterNotFound, ProtocolError,
    CaptureFormatError, SourceError, RowFilterError, StateFileError, OSError)


def is_user_facing(exc: Exception) -> bool:
    """Whether an error tells the user something to act on (else it is a bug: traceback)."""
    return isinstance(exc, USER_FACING)


def report_usage(args: argparse.Namespace, exc: UsageError) -> int:
    """Bad input: the message, exit status 2."""
    report(args, f"{exc}", usage=True)
    return 2


def exit_status(exc: Exception, args: argparse.Namespace) -> int:
    """The exit status of a command that failed with ``exc``, its message printed; called
    while ``exc`` is handled, it raises it again if it is a bug."""
    if stdout_closed(exc, args):
        return end_at_closed_stdout()
    message = file_error(exc, args)
    if message is not None:
        report(args, message)
        return 1
    if is_user_facing(exc):
        report(args, f"{exc}")
        if isinstance(exc, SlotUnusable):
            return SLOT_UNUSABLE
        return SNAPSHOT_UNFINISHED if isinstance(exc, SnapshotUnfinished) else 1
    raise exc
