"""Buffers for transactions that must be held before delivery (streamed transactions for
plugins without stream callbacks, prepared ones for plugins without two-phase callbacks).

All spools of a pipeline share one memory budget; past it, a spool moves its entries to a
temporary file, so a multi-gigabyte transaction runs in bounded memory (as PostgreSQL's
reorder buffer spills to disk past logical_decoding_work_mem).
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING

from plugin_framework._native import load_native
from plugin_framework.protocol import LSN, ROW_CHANGE_MIN_SIZE, ROW_CHANGE_TAGS
from plugin_framework.protocol.lsn import wire_lsn

if TYPE_CHECKING:
    from plugin_framework.framework.native import _spool
else:
    _spool = load_native("plugin_framework.framework.native._spool")

_ENTRY = struct.Struct(">QIBI")  # lsn, xid (0 = none), in_stream, length
_XID = struct.Struct(">I")
_READ_BLOCK = 1 << 20  # a spilled spool is read back in blocks of this size

Entry = tuple[LSN, int, bool, bytes]  # lsn, xid of the change (subxid), in_stream, raw message

# Entries read back a run at a time (read_run): the messages, their LSNs, the xid and
# in_stream they share, whether they are a run of row changes, and where the next entry is.
Run = tuple[list[bytes], list[LSN], int, bool, bool, int]


def pack_entries_py(lsns: Sequence[LSN], xid: int, in_stream: bool,
                    raws: Sequence[bytes]) -> bytes:
    """The entries of messages ``raws`` at ``lsns`` of one (sub)transaction, end to end, as
    ``Spool.append`` packs each."""
    pack = _ENTRY.pack
    return b"".join(pack(lsn, xid, in_stream, len(raw)) + raw
                    for lsn, raw in zip(lsns, raws, strict=True))


def read_run_py(buf: bytes | bytearray | memoryview, pos: int, end: int, strip: bool) -> Run:
    """From the entry at ``pos`` of the packed entries in ``buf[:end]``: the run of row
    changes (Insert, Update, Delete long enough for their ids) of one relation with the same
    xid and in_stream, or else the one entry there; and the position after them. With
    ``strip``, a run's streamed changes come without their xid (the form a fast_change
    formatter takes); a single entry's message is always as spooled. Nothing (the position
    ``pos``) when no whole entry starts at ``pos``."""
    datas: list[bytes] = []
    lsns: list[LSN] = []
    head, end = _ENTRY.size, min(end, len(buf))
    xid, in_stream, relid, is_run = 0, False, b"", False
    while end - pos >= head:
        lsn, entry_xid, entry_in_stream, length = _ENTRY.unpack_from(buf, pos)
        if end - pos - head < length:
            break
        raw = bytes(buf[pos + head:pos + head + length])
        skip = 4 * entry_in_stream  # a streamed change's xid after its tag
        change = length >= ROW_CHANGE_MIN_SIZE + skip and raw[0] in ROW_CHANGE_TAGS
        key = raw[1 + skip:ROW_CHANGE_MIN_SIZE + skip]
        if datas and not (is_run and change and entry_xid == xid
                          and bool(entry_in_stream) == in_stream and key == relid):
            break
        if not datas:
            xid, in_stream, relid, is_run = entry_xid, bool(entry_in_stream), key, change
        datas.append(raw[:1] + raw[1 + skip:] if strip and change and skip else raw)
        lsns.append(wire_lsn(lsn))
        pos += head + length
        if not is_run:
            break
    return datas, lsns, xid, in_stream, is_run, pos


def pack_entries(lsns: Sequence[LSN], xid: int, in_stream: bool,
                 raws: Sequence[bytes]) -> bytes:
    """``pack_entries_py``, in C where it is built (native/_spool.c)."""
    if _spool is None:
        return pack_entries_py(lsns, xid, in_stream, raws)
    return _spool.pack_entries(lsns, xid, in_stream, raws)


def read_run(buf: bytes | bytearray | memoryview, pos: int, end: int, strip: bool) -> Run:
    """``read_run_py``, in C where it is built (native/_spool.c)."""
    if _spool is None:
        return read_run_py(buf, pos, end, strip)
    return _spool.read_run(buf, pos, end, strip, wire_lsn)


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

    def append_run(self, lsns: Sequence[LSN], xid: int, in_stream: bool,
                   raws: Sequence[bytes]) -> None:
        """``append`` of each of ``raws`` at its LSN, in one go: into memory while the
        budget allows the whole run, else to disk."""
        packed = pack_entries(lsns, xid, in_stream, raws)
        budget = self._budget
        budget.spooled_bytes += len(packed) - _ENTRY.size * len(raws)
        if budget.used + len(packed) > budget.limit:
            self._spill()
            self._write(packed)
        else:
            self._memory += packed
            budget.used += len(packed)
        self.count += len(raws)

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

    def runs(self, strip: bool) -> Iterator[Run]:
        """Every entry in append order (as ``__iter__``), a run of row changes at a time
        (``read_run``): those on disk read back in blocks, then those in memory."""
        if self._file is not None:
            f = self._file
            f.flush()
            f.seek(0)
            yield from file_runs(f, strip)
            f.seek(0, 2)
        memory, pos = self._memory, 0
        end = len(memory)  # (entries appended meanwhile are not seen, as by __iter__)
        while pos < end:  # (runs of about a block: their messages are copies)
            run = read_run(memory, pos, min(end, pos + _READ_BLOCK), strip)
            if run[5] == pos:  # an entry longer than a block
                run = read_run(memory, pos, end, strip)
            if run[5] == pos:
                raise OSError(f"a spool ends inside an entry ({end - pos} bytes left)")
            yield run
            pos = run[5]

    def close(self) -> None:
        self._budget.used -= len(self._memory)
        self._memory = bytearray()
        if self._file is not None:
            self._file.close()
            self._file = None
            self._budget.on_disk -= self._file_bytes
            self._file_bytes = 0


def file_runs(f: IO[bytes], strip: bool, count: int | None = None) -> Iterator[Run]:
    """The runs (``read_run``) of the packed entries in ``f`` from where it is: to its end,
    or the first ``count`` entries; read in blocks."""
    rest, left = b"", count
    while left is None or left > 0:
        block = f.read(_READ_BLOCK)
        if not block:
            break
        buf, pos = rest + block, 0
        while left is None or left > 0:
            datas, lsns, xid, in_stream, is_run, after = read_run(buf, pos, len(buf), strip)
            if after == pos:
                break
            if left is not None:
                if len(datas) > left:  # (what follows the entries is not one of them)
                    datas, lsns = datas[:left], lsns[:left]
                left -= len(datas)
            yield datas, lsns, xid, in_stream, is_run, after
            pos = after
        rest = buf[pos:]
    if (left or 0) > 0 or (count is None and rest):
        raise OSError(f"a spool file ends inside an entry, or before its {count} entries")
