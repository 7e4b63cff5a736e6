"""The decoding context a plugin's callbacks receive (LogicalDecodingContext, logical.h).

Mirrors LogicalDecodingContext: ``output_plugin_options`` (the ``-o name=value`` options),
``output_plugin_private``, ``options`` (OutputPluginOptions), and ``prepare_write`` /
``write`` around the ``out`` buffer (OutputPluginPrepareWrite / OutputPluginWrite). Each
``write`` is one output record handed to the plugin's Output (outputs.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from plugin_framework._native import load_native
from plugin_framework.framework.model import Transaction
from plugin_framework.framework.outputs import Output, OutputError, new_record, write_many
from plugin_framework.protocol import LSN

if TYPE_CHECKING:
    from plugin_framework.framework.native._text import first_invalid_utf8, is_utf8
else:
    _text = load_native("plugin_framework.framework.native._text")
    first_invalid_utf8 = None if _text is None else _text.first_invalid_utf8
    is_utf8 = None if _text is None else _text.is_utf8


class OutputType(StrEnum):
    """OutputPluginOutputType: what ``options.output_type`` promises the plugin writes."""

    TEXTUAL = "textual"  # OUTPUT_PLUGIN_TEXTUAL_OUTPUT: valid UTF-8, checked on write
    BINARY = "binary"  # OUTPUT_PLUGIN_BINARY_OUTPUT: any bytes


@dataclass(slots=True)
class OutputPluginOptions:
    """OutputPluginOptions: what a plugin's startup callback sets in ``options``."""

    output_type: OutputType = OutputType.TEXTUAL
    receive_rewrites: bool = False


class FastChange(Protocol):
    """A plugin's formatter of one relation's raw row changes, as its ``fast_change``
    callback returns it (see hookspecs.fast_change)."""

    def __call__(self, data: bytes, lsn: LSN, txn: Transaction,
                 /) -> bytes | Literal[True] | None: ...


class FastLines(Protocol):
    """A formatter's optional ``lines``: its records for a run of raw row changes (see
    hookspecs.fast_change)."""

    def __call__(self, datas: list[bytes], start: int, lsn: LSN | list[LSN],
                 txn: Transaction, /) -> tuple[list[bytes], int]: ...


@dataclass(eq=False)
class LogicalDecodingContext:
    """What every callback of one plugin receives as ``ctx``."""

    plugin_name: str
    output: Output
    output_plugin_options: dict[str, str | None] = field(default_factory=dict)
    slot_name: str | None = None
    catalog: Any = None  # a Catalog when the source can reach the database
    server_version: int | None = None  # the source server's server_version_num, if known
    output_plugin_private: Any = None
    options: OutputPluginOptions = field(default_factory=OutputPluginOptions)
    out: bytearray = field(default_factory=bytearray)
    write_location: LSN = field(default_factory=LSN)
    write_xid: int | None = None
    accept_writes: bool = False
    streaming: bool = False  # receives streamed blocks; startup may clear it
    twophase: bool = False  # receives prepared transactions at PREPARE; startup may clear it
    # Set in startup: skip everything replayed from any replication origin (test_decoding's
    # only-local), without asking filter_by_origin. When every plugin of a pipeline sets
    # it, a source asks the server to send only local changes (PostgreSQL 16+, origin
    # 'none'), which also leaves out non-transactional messages from an origin: pgoutput
    # does not say a non-transactional message's origin, so nothing else can.
    filter_all_origins: bool = False
    # Set by a source that takes incremental snapshots (the walsender source), else None:
    # ``request_snapshot(table, keys=None)`` has the rows of ``table`` ("schema.table") read
    # again into the stream as snapshot rows, every row or those under ``keys`` (each a
    # list of the key columns' values as the stream's text has them, in the key's order).
    # The request is durable (a message in the WAL the slot reads) and taken at once: a
    # consumer that holds a table's state asks so for what the stream cannot give it (a
    # mirror after ALTER TABLE, or rows whose unchanged TOAST values it lacks). Returns the
    # LSN of the request's message: the rows come after the stream has passed it.
    request_snapshot: Callable[[str, Sequence[Sequence[str | None]] | None], LSN] | None = None
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
        self._check_textual(data)
        self.output.write(new_record(self.write_location, self.write_xid, data))
        self._prepared = False

    def _check_textual(self, raw: bytes) -> None:
        if self.options.output_type is OutputType.TEXTUAL and not raw.isascii():
            if is_utf8 is not None and is_utf8(raw):  # in C: no str made only to be dropped
                return
            try:
                raw.decode()
            except UnicodeDecodeError as exc:
                raise OutputError(
                    f'output plugin "{self.plugin_name}" produced invalid UTF-8 at byte '
                    f"{exc.start} in textual mode; set ctx.options.output_type = "
                    "OutputType.BINARY in startup to write binary data"
                ) from None

    def _first_invalid(self, datas: list[bytes]) -> int | None:
        """The index of the first of ``datas`` that ``_check_textual`` refuses, or None; in C
        where it is built, which decodes nothing (a str made of each line, or of their join,
        only to be dropped, was a fifth of an initial snapshot's time)."""
        if first_invalid_utf8 is not None:
            bad = first_invalid_utf8(datas)
            return None if bad < 0 else bad
        for i, data in enumerate(datas):
            if not data.isascii():
                try:
                    data.decode()
                except UnicodeDecodeError:
                    return i
        return None

    def write_record(self, lsn: LSN, xid: int | None, data: bytes) -> None:
        """Write ``data`` as one record at ``lsn`` (a fast_change formatter's line)."""
        self.write_location = lsn
        self.write_xid = xid
        self._check_textual(data)
        self.output.write(new_record(lsn, xid, data))

    def write_records(self, lsn: LSN | list[LSN], xid: int | None,
                      datas: list[bytes]) -> None:
        """``write_record`` for each of ``datas`` (a formatter's ``lines``) at ``lsn``, or at
        its own of a list of LSNs, in one call of the output where it has ``write_many``.
        A record that is not UTF-8 in textual mode is refused as ``write_record`` refuses
        it, after the records before it are written."""
        self.write_location = lsn[-1] if isinstance(lsn, list) else lsn
        self.write_xid = xid
        if self.options.output_type is OutputType.TEXTUAL:
            bad = self._first_invalid(datas)
            if bad is not None:
                if bad:
                    write_many(self.output, lsn[:bad] if isinstance(lsn, list) else lsn,
                               xid, datas[:bad])
                self._check_textual(datas[bad])  # raises, saying where in it
                # (it let it through: the reference decides, and the rest is written)
                lsn = lsn[bad:] if isinstance(lsn, list) else lsn
                datas = datas[bad:]
        write_many(self.output, lsn, xid, datas)

    def emit(self, data: str | bytes) -> None:
        """prepare_write, append ``data``, write: the common case in one call (and cheaper:
        no copy through ``out``, and a str needs no UTF-8 check)."""
        if not self.accept_writes:
            raise OutputError(
                f'output plugin "{self.plugin_name}" wrote outside of a callback that may write'
            )
        if isinstance(data, str):
            raw = data.encode()  # valid UTF-8 by construction
        else:
            raw = data if type(data) is bytes else bytes(data)
            self._check_textual(raw)
        self.output.write(new_record(self.write_location, self.write_xid, raw))
