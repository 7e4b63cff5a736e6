"""The process title: a password given in -d is masked there, so that ``ps`` and
/proc/PID/cmdline do not show it to every user of the machine for the life of the process.

libpq's own tools cannot do this (C programs may overwrite argv; Python cannot reach it), so
``setproctitle`` does it, as it does for gunicorn and celery. It is a dependency of pgdecode;
where it is missing, the command warns and goes on. The password is visible for the moment
between the start of the process and this call, which comes before the command imports
anything heavy (psycopg, the framework): every argument that may hold a password is hidden
whole at once, then shown again with only its password masked once libpq's parser is loaded.
PGPASSWORD, ~/.pgpass or a service file keep it off the command line altogether
(docs/cli.md).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Sequence

HIDDEN = "(connection string hidden)"
# What may hold a password, told without a parser: a password= key, or a URI's user info
# with a ":" (checked again with libpq's parser next)
_MAY_HOLD = re.compile(r"password|postgres(?:ql)?://[^/?#]*:[^/?#]*@", re.IGNORECASE)


def masked_argv(argv: Sequence[str]) -> list[str] | None:
    """``argv`` with every connection string's password masked (as a whole argument, after
    ``--option=`` or after ``-d``); None when none holds a password."""
    from plugin_framework.sources.errors import conninfo_without_password

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
    argv = sys.orig_argv
    if not any(_MAY_HOLD.search(arg) for arg in argv):
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
    def show(title: str) -> None:
        setproctitle.setproctitle(title)
        if name is not None:
            setproctitle.setthreadtitle(name)  # the main thread's name is the process name

    # At once each argument that may hold one, whole; then only the passwords, as libpq's
    # parser finds them (it loads psycopg)
    show(" ".join(HIDDEN if _MAY_HOLD.search(a) else a for a in argv))
    show(" ".join(masked_argv(argv) or argv))
