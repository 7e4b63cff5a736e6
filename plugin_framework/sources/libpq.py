"""psycopg's copy of libpq, bound to the C COPY reader (``_copyrow.read_messages``).

The initial snapshot reads COPY rows through libpq (snapshot.py, ``copy_out``). Read from
Python, each row costs a call of psycopg's ``get_copy_data`` and its result objects, all under
the GIL, which the pipeline's thread needs at the same time. ``read_messages`` makes the same
libpq calls from C with the GIL released. It must call the very library psycopg loaded: the
PGconn is psycopg's, and another build of libpq may lay it out differently.

That library is the one libpq mapped into this process (psycopg's binary package brings its
own copy; its C and Python implementations load the system's). It is found in
/proc/self/maps, so only on Linux. Where it cannot be told for certain (no such file, more
than one libpq mapped, a version other than psycopg's ``pq.version()``), nothing is bound and
copy_out reads from Python, as before.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import sys

from psycopg import pq

try:
    from plugin_framework.sources import _copyrow
except ImportError:  # installed without a C compiler
    _copyrow = None  # type: ignore[assignment]

log = logging.getLogger("pgdecode.snapshot")

_LIBPQ = re.compile(r"libpq([-.].*)?\.(so|dylib)(\.|$)")
_FUNCTIONS = ("PQgetCopyData", "PQconsumeInput", "PQfreemem", "PQsocket")


def mapped_libpq(maps: str = "/proc/self/maps") -> str | None:
    """The path of the one libpq mapped into this process, or None (none, several, or no
    /proc)."""
    try:
        with open(maps) as f:
            fields = [line.split(None, 5) for line in f if "libpq" in line]
    except OSError:
        return None
    found = {f[5].strip() for f in fields
             if len(f) == 6 and _LIBPQ.match(os.path.basename(f[5].strip()))}
    return found.pop() if len(found) == 1 else None


@functools.cache
def copy_reader_bound() -> bool:
    """Whether ``_copyrow.read_messages`` may read COPY rows on psycopg's connections (it is
    bound to psycopg's libpq: once, on the first call)."""
    if _copyrow is None or not sys.platform.startswith("linux"):
        return False
    pq.version()  # psycopg's libpq is loaded by now
    path = mapped_libpq()
    if path is None:
        log.debug("COPY rows read from Python: psycopg's libpq is not found for certain")
        return False
    try:
        lib = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
        if lib.PQlibVersion() != pq.version():
            log.debug("COPY rows read from Python: %s is not psycopg's libpq version", path)
            return False
        _copyrow.bind_libpq(*(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
                              for name in _FUNCTIONS))
    except (OSError, AttributeError, ValueError) as exc:
        log.debug("COPY rows read from Python: cannot bind %s (%s)", path, exc)
        return False
    return True
