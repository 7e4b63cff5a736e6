"""Buffers for transactions that must be held before delivery (streamed transactions for
plugins without stream callbacks, prepared ones for plugins without two-phase callbacks).

All spools of a pipeline share one memory budget; past it, a spool moves its entries to a
temporary file, so a multi-gigabyte transaction runs in bounded memory (as PostgreSQL's
reorder buffer spills to disk past logical_decoding_work_mem).
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator
from typing import IO

from plugin_framework.protocol import LSN

_ENTRY = struct.Struct(">QIBI")  # lsn, xid (0 = none), in_stream, length

Entry = tuple[LSN, int, bool, bytes]  # lsn, xid of the change (subxid), in_stream, raw message


class SpoolBudget:
    """The memory budget shared by a pipeline's spools."""

    def __init__(self, limit: int, directory: str | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.directory = directory
        self.spooled_bytes = 0  # everything appended, in memory or not
        self.spilled_bytes = 0  # what went to disk
        self.on_disk = 0  # what is on disk now (spools not closed yet)


class Spool:
    """An append-only, replayable sequence of raw messages of one transaction.

    Entries are kept packed, in memory as on disk (an entry header, then the message), so
    that the budget counts what they really take: one Python object per entry would cost
    about 160 bytes more than the message, more than the message itself for most rows."""

    def __init__(self, budget: SpoolBudget) -> None:
        self._budget = budget
        self._memory = bytearray()
        self._file: IO[bytes] | None = None
        self._file_bytes = 0
        self.count = 0

    def append(self, lsn: LSN, xid: int, in_stream: bool, raw: bytes) -> None:
        size = len(raw) + _ENTRY.size
        budget = self._budget
        budget.spooled_bytes += len(raw)
        if budget.used + size > budget.limit:
            self._spill()
            self._write(_ENTRY.pack(lsn, xid, in_stream, len(raw)), raw)
        else:
            memory = self._memory
            memory += _ENTRY.pack(lsn, xid, in_stream, len(raw))
            memory += raw
            budget.used += size
        self.count += 1

    def _open(self) -> IO[bytes]:
        if self._file is None:
            self._file = tempfile.TemporaryFile(  # noqa: SIM115  (closed in close())
                prefix="pgdecode-spool-", dir=self._budget.directory
            )
        return self._file

    def _spill(self) -> None:
        if self._memory:
            self._write(self._memory)
            self._budget.used -= len(self._memory)
            self._memory = bytearray()

    def _write(self, *chunks: bytes | bytearray) -> None:
        f = self._open()
        for chunk in chunks:
            f.write(chunk)
            self._budget.spilled_bytes += len(chunk)
            self._budget.on_disk += len(chunk)
            self._file_bytes += len(chunk)

    def __iter__(self) -> Iterator[Entry]:
        """Every entry in append order: first those spilled to disk, then those in memory
        (as they are when the iteration reaches them: entries appended meanwhile are not
        seen)."""
        size = _ENTRY.size
        if self._file is not None:
            f = self._file
            f.flush()
            f.seek(0)
            while head := f.read(size):
                lsn, xid, in_stream, length = _ENTRY.unpack(head)
                yield LSN(lsn), xid, bool(in_stream), f.read(length)
            f.seek(0, 2)
        memory, pos = self._memory, 0
        end = len(memory)
        while pos < end:
            lsn, xid, in_stream, length = _ENTRY.unpack_from(memory, pos)
            pos += size + length
            yield LSN(lsn), xid, bool(in_stream), bytes(memory[pos - length:pos])

    def close(self) -> None:
        self._budget.used -= len(self._memory)
        self._memory = bytearray()
        if self._file is not None:
            self._file.close()
            self._file = None
            self._budget.on_disk -= self._file_bytes
            self._file_bytes = 0
