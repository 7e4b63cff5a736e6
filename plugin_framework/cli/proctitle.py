"""The process title: a password given in -d is masked there, so that ``ps`` and
/proc/PID/cmdline do not show it to every user of the machine for the life of the process.

libpq's own tools cannot do this (C programs may overwrite argv; Python cannot reach it), so
``setproctitle`` does it, as it does for gunicorn and celery. It is a dependency of pgdecode;
where it is missing, the command warns and goes on. The password is visible for the moment
between the start of the process and this call: PGPASSWORD, ~/.pgpass or a service file keep
it off the command line altogether (docs/cli.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from plugin_framework.sources.errors import conninfo_without_password


def masked_argv(argv: Sequence[str]) -> list[str] | None:
    """``argv`` with every connection string's password masked (as a whole argument, after
    ``--option=`` or after ``-d``); None when none holds a password."""
    out = list(argv)
    changed = False
    for i, arg in enumerate(argv):
        candidates = []  # an option's value first, else the whole argument
        if arg.startswith("--") and "=" in arg:
            name, _, value = arg.partition("=")
            candidates.append((f"{name}=", value))
        elif arg.startswith("-d") and len(arg) > 2:
            candidates.append(("-d", arg[2:]))
        candidates.append(("", arg))
        for prefix, value in candidates:
            masked = conninfo_without_password(value)
            if masked is not None:
                out[i] = prefix + masked
                changed = True
                break
    return out if changed else None


def hide_password() -> None:
    """Set the process title to the command line with its passwords masked, if it has any;
    the process name (/proc/PID/comm, what ``pgrep`` and ``top`` match) stays as it was."""
    masked = masked_argv(sys.orig_argv)
    if masked is None:
        return
    try:
        # Imported by name: an optional import, typed or not, whichever is installed.
        setproctitle = importlib.import_module("setproctitle")
    except ImportError:
        print("pgdecode: warning: the password given in -d stays visible to other users in "
              "ps (the setproctitle package, which hides it, is not installed): install it, "
              "or give the password with PGPASSWORD, ~/.pgpass or a service file",
              file=sys.stderr)
        return
    try:
        with open("/proc/self/comm") as f:
            name = f.read().rstrip("\n")
    except OSError:
        name = None
    setproctitle.setproctitle(" ".join(masked))
    if name is not None:
        setproctitle.setthreadtitle(name)  # the main thread's name is the process name
