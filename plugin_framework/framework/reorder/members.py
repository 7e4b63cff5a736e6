"""The plugins of a pipeline, and how their callbacks are called.

A ``Member`` is one plugin with its own LogicalDecodingContext, as each slot of PostgreSQL
has its own: the reorder buffer calls the plugin's callbacks through it, which is where the
context's write location is set and where an exception becomes a ``CallbackError`` carrying
PostgreSQL's error context (``output_plugin_error_callback`` in logical.c).
"""

from __future__ import annotations

from typing import Any

from plugin_framework.framework.context import FastChange, FastLines, LogicalDecodingContext
from plugin_framework.framework.model import Change, Relation, Transaction
from plugin_framework.framework.plugin import LoadedPlugin
from plugin_framework.protocol import LSN


class CallbackError(Exception):
    """An exception raised by a plugin callback, with PostgreSQL-style context."""

    def __init__(self, context: str, cause: BaseException) -> None:
        self.context = context
        self.cause = cause
        super().__init__(f"{context}: {type(cause).__name__}: {cause}")


class Member:
    """One plugin of a pipeline, with its own context and output."""

    __slots__ = ("callbacks", "ctx", "fast_change", "on_change", "plugin")

    def __init__(self, plugin: LoadedPlugin, ctx: LogicalDecodingContext) -> None:
        self.plugin = plugin
        self.ctx = ctx
        self.callbacks = plugin.callbacks
        self.on_change = plugin.callbacks["change"]
        # the optional fast_change callback (see hookspecs.fast_change), or None
        self.fast_change = plugin.callbacks.get("fast_change")

    def call(self, cb: str, lsn: LSN, xid: int | None, *args: Any, writes: bool = True) -> Any:
        ctx = self.ctx
        ctx.write_location = lsn
        ctx.write_xid = xid
        ctx.accept_writes = writes
        try:
            return self.callbacks[cb](ctx, *args)
        except CallbackError:
            raise
        except Exception as exc:
            raise self._error(cb, lsn, exc) from exc
        finally:
            ctx.accept_writes = False

    def call_change(self, lsn: LSN, xid: int | None, txn: Transaction, change: Change) -> None:
        """``call("change", ...)``, unrolled: it runs once per row change."""
        ctx = self.ctx
        ctx.write_location = lsn
        ctx.write_xid = xid
        ctx.accept_writes = True
        try:
            self.on_change(ctx, txn, change.relation, change)
        except CallbackError:
            raise
        except Exception as exc:
            raise self._error("change", lsn, exc) from exc
        finally:
            ctx.accept_writes = False

    def compile_fast_change(self, relation: Relation, lsn: LSN) -> FastChange | None:
        """The plugin's formatter for ``relation``'s raw row changes, from its
        ``fast_change`` callback (None: the change callback formats them). Its errors are
        reported as the change callback's, whose work it does."""
        assert self.fast_change is not None
        try:
            write: FastChange | None = self.fast_change(self.ctx, relation)
        except CallbackError:
            raise
        except Exception as exc:
            raise self._error("change", lsn, exc) from exc
        return write

    def call_fast_change(self, write: FastChange, data: bytes, lsn: LSN, xid: int | None,
                         txn: Transaction) -> bool:
        """The plugin's ``fast_change`` formatter for one raw row change: True when it did
        the change's work (its record written, or kept for a later one), False when the
        change callback must run instead."""
        try:
            line = write(data, lsn, txn)
            if line is None:
                return False
            if line is not True:
                self.ctx.write_record(lsn, xid, line)
        except CallbackError:
            raise
        except Exception as exc:
            raise self._error("change", lsn, exc) from exc
        return True

    def call_fast_lines(self, lines: FastLines, datas: list[bytes], start: int,
                        lsn: LSN | list[LSN], xid: int | None, txn: Transaction) -> int:
        """``call_fast_change`` for ``datas[start]``, ``datas[start + 1]``, ... in one call of
        the formatter's ``lines``, at ``lsn`` or at each one's of a list of LSNs: the index
        of the first change it did not take (the change callback's then), or
        ``len(datas)``."""
        try:
            records, taken = lines(datas, start, lsn, txn)
            if records:
                self.ctx.write_records(
                    lsn[start:start + len(records)] if isinstance(lsn, list) else lsn, xid,
                    records)
        except CallbackError:
            raise
        except Exception as exc:
            at = lsn[min(start, len(lsn) - 1)] if isinstance(lsn, list) else lsn
            raise self._error("change", at, exc) from exc
        return taken

    def _error(self, cb: str, lsn: LSN, exc: Exception) -> CallbackError:
        ctx = self.ctx
        slot = f'slot "{ctx.slot_name}", ' if ctx.slot_name else ""
        return CallbackError(
            f'{slot}output plugin "{self.plugin.name}", in the {cb} callback, '
            f"associated LSN {lsn}",
            exc,
        )
