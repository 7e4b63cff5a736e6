"""The decoding context a plugin's callbacks receive, and where its output goes.

Mirrors LogicalDecodingContext: ``output_plugin_options`` (the ``-o name=value`` options),
``output_plugin_private``, ``options`` (OutputPluginOptions), and ``prepare_write`` /
``write`` around the ``out`` buffer. Each ``write`` is one output record handed to the
plugin's Output.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import IO, Any, Protocol

from plugin_framework.protocol import LSN


class OutputType(StrEnum):
    TEXTUAL = "textual"
    BINARY = "binary"


@dataclass(slots=True)
class OutputPluginOptions:
    output_type: OutputType = OutputType.TEXTUAL
    receive_rewrites: bool = False


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One write of a plugin: the LSN and xid it belongs to, and its bytes."""

    lsn: LSN
    xid: int | None
    data: bytes


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


class MemoryOutput:
    """Keeps records in a list: for tests, and for plugins that deliver elsewhere."""

    def __init__(self) -> None:
        self.records: list[OutputRecord] = []
        self.durable_lsn = LSN(0)
        self._marked = LSN(0)

    def write(self, record: OutputRecord) -> None:
        self.records.append(record)

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

    ``flush`` fsyncs regular files, so that what is reported durable survives a crash;
    a pipe or terminal is durable once handed to the operating system.
    """

    def __init__(self, target: str | os.PathLike[str] | IO[bytes] = "-") -> None:
        if isinstance(target, str | os.PathLike):
            if os.fspath(target) == "-":
                self._file: IO[bytes] = sys.stdout.buffer
                self._owned = False
            else:
                self._file = open(target, "ab")  # noqa: SIM115  (closed in close())
                self._owned = True
        else:
            self._file, self._owned = target, False
        self.durable_lsn = LSN(0)
        self._marked = LSN(0)
        self._write = self._file.write

    def write(self, record: OutputRecord) -> None:
        self._write(record.data)
        self._write(b"\n")

    def mark(self, lsn: LSN) -> None:
        if lsn > self._marked:
            self._marked = lsn

    def flush(self) -> LSN:
        self._file.flush()
        with contextlib.suppress(OSError, ValueError):  # pipes and terminals cannot be fsynced
            os.fsync(self._file.fileno())
        self.durable_lsn = self._marked
        return self.durable_lsn

    def close(self) -> None:
        self.flush()
        if self._owned:
            self._file.close()


@dataclass(eq=False)
class LogicalDecodingContext:
    """What every callback of one plugin receives as ``ctx``."""

    plugin_name: str
    output: Output
    output_plugin_options: dict[str, str | None] = field(default_factory=dict)
    slot_name: str | None = None
    catalog: Any = None  # a Catalog when the source can reach the database
    output_plugin_private: Any = None
    options: OutputPluginOptions = field(default_factory=OutputPluginOptions)
    out: bytearray = field(default_factory=bytearray)
    write_location: LSN = field(default_factory=LSN)
    write_xid: int | None = None
    accept_writes: bool = False
    streaming: bool = False  # receives streamed blocks; startup may clear it
    twophase: bool = False  # receives prepared transactions at PREPARE; startup may clear it
    _prepared: bool = False

    def prepare_write(self, last_write: bool = True) -> None:
        """Start a new output record in ``out`` (OutputPluginPrepareWrite)."""
        if not self.accept_writes:
            raise OutputError(
                f'output plugin "{self.plugin_name}" wrote outside of a callback that may write'
            )
        self.out.clear()
        self._prepared = True

    def write(self, last_write: bool = True) -> None:
        """Hand ``out`` to the plugin's output as one record (OutputPluginWrite)."""
        if not self._prepared:
            raise OutputError(
                f'output plugin "{self.plugin_name}" called write() without prepare_write()'
            )
        data = bytes(self.out)
        if self.options.output_type is OutputType.TEXTUAL:
            try:
                data.decode()
            except UnicodeDecodeError as exc:
                raise OutputError(
                    f'output plugin "{self.plugin_name}" produced invalid UTF-8 at byte '
                    f"{exc.start} in textual mode; set ctx.options.output_type = "
                    "OutputType.BINARY in startup to write binary data"
                ) from None
        self.output.write(OutputRecord(self.write_location, self.write_xid, data))
        self._prepared = False

    def emit(self, data: str | bytes) -> None:
        """prepare_write, append ``data``, write: the common case in one call."""
        self.prepare_write()
        self.out += data.encode() if isinstance(data, str) else data
        self.write()
