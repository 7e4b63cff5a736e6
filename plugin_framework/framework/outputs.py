"""Where a plugin's output records go, and how far they are durable: the ``Output``
protocol, ``MemoryOutput`` for tests, and ``FileOutput``, durable file I/O that survives a
crash and resumes where it was.

In PostgreSQL, OutputPluginWrite hands the ``out`` buffer to the walsender (or to the SQL
function's tuplestore); here each write is an ``OutputRecord`` handed to the plugin's Output.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from plugin_framework._frozen import frozen_setters, new_object
from plugin_framework.protocol import LSN


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One write of a plugin: the LSN and xid it belongs to, and its bytes."""

    lsn: LSN
    xid: int | None
    data: bytes


# A record is made for every line a plugin writes, by setting its slots (see _frozen.py).
_SET_LSN, _SET_XID, _SET_DATA = frozen_setters(OutputRecord, "lsn", "xid", "data")


def new_record(lsn: LSN, xid: int | None, data: bytes) -> OutputRecord:
    """``OutputRecord(lsn, xid, data)``, faster (one is made for every line written)."""
    record: OutputRecord = new_object(OutputRecord)
    _SET_LSN(record, lsn)
    _SET_XID(record, xid)
    _SET_DATA(record, data)
    return record


_BUFFER = 1 << 20  # FileOutput's write buffer for regular files


class OutputError(Exception):
    """A plugin wrote outside a callback or wrote data its output type does not allow."""


class Output(Protocol):
    """Where a plugin's records go, and how far they are durable."""

    durable_lsn: LSN

    def write(self, record: OutputRecord) -> None: ...

    def mark(self, lsn: LSN) -> None:
        """Everything the plugin will ever write for WAL before ``lsn`` has been written."""

    def flush(self) -> LSN:
        """Make everything marked durable; return the new ``durable_lsn``."""

    def close(self) -> None: ...

    # Optional: an output that has these can take back the output of a transaction cut
    # short by a lost connection (the server sends it again from its start).
    #   def savepoint(self) -> object: where the output is now
    #   def rollback_to(self, savepoint: object) -> None: drop everything written since


class MemoryOutput:
    """Keeps records in a list: for tests, and for plugins that deliver elsewhere."""

    def __init__(self) -> None:
        self.records: list[OutputRecord] = []
        self.durable_lsn = LSN(0)
        self._marked = LSN(0)

    def write(self, record: OutputRecord) -> None:
        self.records.append(record)

    def savepoint(self) -> int:
        return len(self.records)

    def rollback_to(self, savepoint: int) -> None:
        del self.records[savepoint:]

    def mark(self, lsn: LSN) -> None:
        self._marked = max(self._marked, lsn)

    def flush(self) -> LSN:
        self.durable_lsn = self._marked
        return self.durable_lsn

    def close(self) -> None:
        pass

    @property
    def lines(self) -> list[str]:
        return [r.data.decode() for r in self.records]


class FileOutput:
    """Writes each record followed by a newline (as pg_recvlogical does) to a file or stdout.

    ``flush`` fsyncs regular files, so that what is reported durable survives a crash; a pipe
    or terminal is durable once handed to the operating system. A regular file also gets a
    progress file beside it (``FILE.progress``: the durable LSN and the file's size at that
    point, replaced atomically at each flush). Reopened after a crash, the file is cut back
    to that size, dropping the output of a transaction that was cut short, and the pipeline
    skips what the file already holds (``resume_lsn``): each transaction is in the file
    exactly once, however often the server sends it.
    """

    def __init__(self, target: str | os.PathLike[str] | IO[bytes] = "-") -> None:
        self.resume_lsn = LSN(0)
        self._path: Path | None = None  # a regular file's
        self._progress: Path | None = None
        self._slot: str | None = None  # the slot whose stream the file holds
        # xids of streamed transactions that have blocks in the file but no end yet: now, at
        # the last mark, and at the durable point this file was resumed from
        self._open_streams: list[int] = []
        self._marked_streams: list[int] = []
        self.resume_open_streams: list[int] = []
        if isinstance(target, str | os.PathLike):
            if os.fspath(target) == "-":
                self._file: IO[bytes] = sys.stdout.buffer
                self._owned = False
            elif (path := Path(target)).exists() and not path.is_file():
                # A named pipe or a device: written as a pipe is, with no progress file
                # beside it (nothing can be cut back or resumed there).
                self._file = open(path, "ab")  # noqa: SIM115  (closed in close())
                self._owned = True
            else:
                self._path = path
                self._progress = path.with_name(path.name + ".progress")
                size = self._resume(path)
                # A large buffer: one write(2) per ~1 MB of lines, not per 8 KB
                self._file = open(path, "ab", buffering=_BUFFER)  # noqa: SIM115  (closed in close())
                if size is None:
                    # Record where this stream's output starts before writing any: a crash
                    # before the first flush must not leave a torn transaction behind.
                    self._save_progress(LSN(0), self._file.tell())
                elif self._file.tell() > size:
                    self._file.truncate(size)
                    self._file.seek(size)
                self._owned = True
        else:
            self._file, self._owned = target, False
        self.durable_lsn = self.resume_lsn
        self._marked = self.resume_lsn
        self._marked_size = self._position()
        self._write = self._file.write

    def _resume(self, path: Path) -> int | None:
        """The size to cut the file back to, from FILE.progress; None for a new file."""
        assert self._progress is not None
        try:
            state = json.loads(self._progress.read_text())
            self.resume_lsn = LSN(state["lsn"])
            self._slot = state.get("slot")
            self.resume_open_streams = [int(x) for x in state.get("open_streams", [])]
            size = state["size"]
            if type(size) is not int or size < 0:
                raise ValueError(f"the recorded size {size!r} is not a byte count")
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise OutputError(
                f"{self._progress} is damaged ({exc}); remove it and {path} to start afresh"
            ) from None
        actual = path.stat().st_size if path.exists() else 0
        if size > actual:
            # What FILE.progress calls durable was acknowledged to the server, which will not
            # send it again: resuming would hide that it is gone.
            raise OutputError(
                f"{path} has {actual} bytes, but {self._progress} records {size} bytes "
                "written and acknowledged to the server: output the slot will not send again "
                f"is missing from {path}. Restore the file; to start afresh instead, remove "
                "both files and re-create the slot (the missing changes are then not in it)"
            )
        return size

    def _position(self) -> int:
        try:
            return self._file.tell()
        except (OSError, ValueError):
            return 0

    def claim(self, slot: str) -> None:
        """Bind the file to the slot whose stream it holds. Resuming skips the transactions
        the file already has by their LSNs, which only means something for that slot: a
        file written from another slot is refused rather than silently skipping changes."""
        if self._progress is None:
            return
        if self._slot is not None and self._slot != slot:
            raise OutputError(
                f'{self._path} holds the changes of replication slot '
                f'"{self._slot}", not "{slot}": write this slot\'s changes to another file '
                "(pgdecode resumes a file only from the slot that wrote it)"
            )
        if self._slot is None:
            self._slot = slot
            self._save_progress(self.durable_lsn, self._marked_size)

    def write(self, record: OutputRecord) -> None:
        self._write(record.data + b"\n")  # one call: cheaper than two for a line's bytes

    def savepoint(self) -> int | None:
        """The file's size now (None for a pipe or terminal, which cannot take back lines)."""
        return self._position() if self._progress is not None else None

    def rollback_to(self, savepoint: int | None) -> None:
        """Cut the file back to ``savepoint``: the lines of a transaction that the server
        will send again from its start."""
        if savepoint is None:
            return
        self._file.flush()
        self._file.truncate(savepoint)
        self._file.seek(savepoint)

    def note_open_streams(self, xids: list[int]) -> None:
        """The streamed transactions whose blocks this file has, still without an end (the
        pipeline says so before each mark). A restart resumes with them in
        ``resume_open_streams``: the server streams them again from their start, so the
        plugin is told to abort each first, as after a lost connection."""
        self._open_streams = xids

    def mark(self, lsn: LSN) -> None:
        if lsn > self._marked:
            self._marked = lsn
            if self._progress is not None:
                self._marked_size = self._file.tell()
                self._marked_streams = self._open_streams

    def flush(self) -> LSN:
        self._file.flush()
        with contextlib.suppress(OSError, ValueError):  # pipes and terminals cannot be fsynced
            os.fsync(self._file.fileno())
        if self._progress is not None and self._marked > self.durable_lsn:
            self._save_progress(self._marked, self._marked_size)
        self.durable_lsn = self._marked
        return self.durable_lsn

    def _save_progress(self, lsn: LSN, size: int) -> None:
        """Replace the progress file atomically and durably (the directory too: the server
        forgets what it is told is durable, so this must survive a power loss)."""
        assert self._progress is not None
        tmp = self._progress.with_name(self._progress.name + ".tmp")
        state: dict[str, Any] = {"lsn": str(lsn), "size": size}
        if self._slot is not None:
            state["slot"] = self._slot
        if self._marked_streams:
            state["open_streams"] = self._marked_streams
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._progress)
        with contextlib.suppress(OSError):
            fd = os.open(self._progress.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        self.flush()
        if self._owned:
            self._file.close()
