"""COPY ... TO STDOUT through psycopg's copy of libpq (``copy_out``), and that library bound
to the C COPY reader (``_copyrow.read_messages``) and to the replication stream's reader of
buffered messages (``_copyrow.read_copy_data``, ``copy_data_reader``).

The snapshots read COPY rows through libpq (``copy_out``, for snapshot.py). Read from
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

import contextlib
import ctypes
import functools
import logging
import os
import re
import select
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq, sql
from psycopg.abc import Buffer

from plugin_framework._native import load_native

if TYPE_CHECKING:
    from plugin_framework.sources.native import _copyrow
else:
    _copyrow = load_native("plugin_framework.sources.native._copyrow")

log = logging.getLogger("pgdecode.snapshot")

# sources/native/_copyrow.c's read_copy_data: (pgconn_ptr, max_messages) -> (messages, status)
ReadCopyData = Callable[[int, int], tuple[list[bytes], int]]


def failed_result(result: pq.abc.PGresult | None) -> tuple[str, str | None] | None:
    """The server's message and SQLSTATE of a failed libpq result; None if it did not fail."""
    if result is None or result.status != pq.ExecStatus.FATAL_ERROR:
        return None
    message = (result.error_message or b"").decode(errors="replace").strip()
    code = result.error_field(pq.DiagnosticField.SQLSTATE)
    return message, code.decode() if code else None

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


# _copyrow.read_messages with head and ncols given: (pgconn_ptr, max_rows) -> (rows, status)
ReadRows = Callable[[int, int], tuple[list[bytes], int]]


def copy_out(conn: psycopg.Connection[Any], statement: sql.Composable,
             convert: Callable[[Buffer], bytes], chunk_rows: int,
             read: ReadRows | None = None) -> Iterator[list[bytes]]:
    """Run ``statement``, a COPY ... TO STDOUT, on ``conn`` and yield ``convert`` of each
    row (one CopyData message) in lists of ``chunk_rows``, then the rest (always, maybe
    empty; so only the last list is short). ``read``: the C reader that makes this loop's
    libpq calls and conversions with the GIL released (``_copyrow.read_messages``, bound to
    psycopg's libpq: libpq.py); its ``convert`` is the same C code.

    Through libpq (psycopg.pq, psycopg's documented low-level interface), as the replication
    stream is read (replication.py): psycopg's ``Copy.read`` waits through a generator for
    every row, which cost as much as the rest of the row's way; this waits only when libpq
    has no whole row buffered. Errors are psycopg's (``psycopg.errors`` by SQLSTATE). Left
    early (the consumer stops), the rest of the COPY is read and dropped, as psycopg's Copy
    does, so that the connection can be used again."""
    pgconn = conn.pgconn
    pgconn.send_query(statement.as_bytes(conn))
    result = _next_result(pgconn)
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        _drain_results(pgconn)
        raise _error(pgconn, result)
    get = pgconn.get_copy_data
    rows: list[bytes] = []
    append = rows.append
    done = False
    # the PGconn's address (psycopg's PGconn has it, its abc does not; None once closed)
    ptr: int | None = getattr(pgconn, "pgconn_ptr", None)
    if ptr is None:
        read = None
    try:
        while read is not None and ptr is not None:
            rows, status = read(ptr, chunk_rows)
            if status < 0:  # -1: the COPY is over; -2: libpq failed (as below)
                break
            yield rows
        while read is None:
            nbytes, data = get(1)
            if nbytes > 0:
                append(convert(data))
                if len(rows) >= chunk_rows:
                    yield rows
                    rows = []
                    append = rows.append
            elif nbytes == 0:
                _wait(pgconn)
            else:  # -1: the COPY is over; -2: libpq failed (its result says why)
                break
        done = True
        result = _next_result(pgconn)
        _drain_results(pgconn)
        if result is None or result.status != pq.ExecStatus.COMMAND_OK:
            raise _error(pgconn, result)
    finally:
        if not done:
            with contextlib.suppress(psycopg.Error, OSError):
                while (nbytes := get(1)[0]) >= 0:
                    if nbytes == 0:
                        _wait(pgconn)
                _drain_results(pgconn)
    yield rows


def _wait(pgconn: pq.abc.PGconn) -> None:
    """Until the server sends more (psycopg's wait, without its generator)."""
    select.select([pgconn.socket], [], [])
    pgconn.consume_input()


def _next_result(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    while pgconn.is_busy():
        _wait(pgconn)
    return pgconn.get_result()


def _drain_results(pgconn: pq.abc.PGconn) -> None:
    while _next_result(pgconn) is not None:
        pass


def _error(pgconn: pq.abc.PGconn, result: pq.abc.PGresult | None) -> psycopg.Error:
    """The psycopg exception for a failed result (its SQLSTATE's class), or for libpq's
    error (a lost connection)."""
    failed = failed_result(result)
    if failed is not None:
        message, code = failed
        if not code:  # libpq's own, with no SQLSTATE: "server closed the connection ..."
            return psycopg.OperationalError(message)
        try:
            return psycopg.errors.lookup(code)(message)
        except KeyError:
            return psycopg.DatabaseError(message)
    message = pgconn.get_error_message().strip()
    return psycopg.OperationalError(message or "the COPY ended without a result")


def copy_data_reader() -> ReadCopyData | None:
    """``_copyrow.read_copy_data`` (the replication stream's reader of the messages libpq
    has buffered) where it is built and bound to psycopg's libpq, else None."""
    if _copyrow is None or not copy_reader_bound():
        return None
    return _copyrow.read_copy_data
