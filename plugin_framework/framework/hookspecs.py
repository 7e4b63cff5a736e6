"""pluggy hook specifications: the output-plugin callbacks as hooks.

A plugin is any object with ``@hookimpl`` functions of these names (a module, a class, an
instance), or an ``OutputPlugin`` subclass instance. Hooks are called with keyword arguments,
so the argument names below are public API. Each plugin is loaded into its own plugin manager:
pgdecode calls one plugin's callbacks at a time, with that plugin's own context.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from plugin_framework.framework.context import (
        FastChange,
        LogicalDecodingContext,
        OutputPluginOptions,
    )
    from plugin_framework.framework.model import Change, Relation, Transaction, TruncateChange
    from plugin_framework.protocol import LSN

PROJECT = "pgdecode"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def startup(ctx: LogicalDecodingContext, options: OutputPluginOptions, is_init: bool) -> None:
    """Once, before anything else: validate ``ctx.output_plugin_options``, set
    ``options.output_type`` and allocate ``ctx.output_plugin_private``. ``is_init`` is true
    when the slot is being created."""


@hookspec(firstresult=True)
def shutdown(ctx: LogicalDecodingContext) -> None:
    """Once, when decoding ends: release what startup allocated."""


@hookspec(firstresult=True)
def begin(ctx: LogicalDecodingContext, txn: Transaction) -> None:
    """A committed transaction starts."""


@hookspec(firstresult=True)
def change(ctx: LogicalDecodingContext, txn: Transaction, relation: Relation,
           change: Change) -> None:
    """One INSERT, UPDATE or DELETE of ``txn`` on ``relation``."""


@hookspec(firstresult=True)
def truncate(ctx: LogicalDecodingContext, txn: Transaction, relations: list[Relation],
             change: TruncateChange) -> None:
    """One TRUNCATE statement over ``relations``; ``change`` carries cascade and
    restart_identity."""


@hookspec(firstresult=True)
def commit(ctx: LogicalDecodingContext, txn: Transaction, commit_lsn: LSN) -> None:
    """The transaction begun by ``begin`` committed at ``commit_lsn``."""


@hookspec(firstresult=True)
def message(ctx: LogicalDecodingContext, txn: Transaction | None, message_lsn: LSN,
            transactional: bool, prefix: str, message: bytes) -> None:
    """A logical message (pg_logical_emit_message). ``txn`` is None for a non-transactional
    message."""


@hookspec(firstresult=True)
def filter_by_origin(ctx: LogicalDecodingContext, origin: str) -> bool:
    """Return true to skip every transaction replayed from replication origin ``origin``."""
    raise NotImplementedError


@hookspec(firstresult=True)
def filter_prepare(ctx: LogicalDecodingContext, xid: int, gid: str) -> bool:
    """Return true to decode the prepared transaction ``gid`` as an ordinary one at COMMIT
    PREPARED instead of at PREPARE TRANSACTION."""
    raise NotImplementedError


@hookspec(firstresult=True)
def begin_prepare(ctx: LogicalDecodingContext, txn: Transaction) -> None:
    """A transaction that will be prepared starts."""


@hookspec(firstresult=True)
def prepare(ctx: LogicalDecodingContext, txn: Transaction, prepare_lsn: LSN) -> None:
    """The transaction begun by ``begin_prepare`` was prepared (PREPARE TRANSACTION)."""


@hookspec(firstresult=True)
def commit_prepared(ctx: LogicalDecodingContext, txn: Transaction, commit_lsn: LSN) -> None:
    """A prepared transaction was committed (COMMIT PREPARED)."""


@hookspec(firstresult=True)
def rollback_prepared(ctx: LogicalDecodingContext, txn: Transaction, prepare_end_lsn: LSN,
                      prepare_time: datetime) -> None:
    """A prepared transaction was rolled back (ROLLBACK PREPARED)."""


@hookspec(firstresult=True)
def stream_start(ctx: LogicalDecodingContext, txn: Transaction) -> None:
    """A block of changes of the in-progress transaction ``txn`` starts."""


@hookspec(firstresult=True)
def stream_stop(ctx: LogicalDecodingContext, txn: Transaction) -> None:
    """The block of changes started by ``stream_start`` ends."""


@hookspec(firstresult=True)
def stream_abort(ctx: LogicalDecodingContext, txn: Transaction, abort_lsn: LSN | None) -> None:
    """A streamed transaction, or one of its subtransactions (``txn.toptxn`` set), aborted:
    discard its changes. ``abort_lsn`` is None unless the server sent it."""


@hookspec(firstresult=True)
def stream_prepare(ctx: LogicalDecodingContext, txn: Transaction, prepare_lsn: LSN) -> None:
    """A streamed transaction was prepared."""


@hookspec(firstresult=True)
def stream_commit(ctx: LogicalDecodingContext, txn: Transaction, commit_lsn: LSN) -> None:
    """A streamed transaction committed: apply its streamed changes."""


@hookspec(firstresult=True)
def stream_change(ctx: LogicalDecodingContext, txn: Transaction, relation: Relation,
                  change: Change) -> None:
    """One change inside a stream block; ``txn`` may be a subtransaction."""


@hookspec(firstresult=True)
def stream_message(ctx: LogicalDecodingContext, txn: Transaction, message_lsn: LSN,
                   transactional: bool, prefix: str, message: bytes) -> None:
    """A transactional logical message inside a stream block."""


@hookspec(firstresult=True)
def stream_truncate(ctx: LogicalDecodingContext, txn: Transaction, relations: list[Relation],
                    change: TruncateChange) -> None:
    """A TRUNCATE inside a stream block."""


@hookspec(firstresult=True)
def fast_change(ctx: LogicalDecodingContext, relation: Relation) -> FastChange | None:
    """Optional, pgdecode's own (no C counterpart in OutputPluginCallbacks): a formatter of
    ``relation``'s row changes straight from their pgoutput bytes, or None to leave that
    relation's changes to ``change``.

    The formatter is called as ``write(data, lsn, txn)`` with an Insert, Update or Delete
    message in its non-streamed form, and returns the one record ``change`` would have
    written for it; or True when ``change`` would write no record (it would keep the change
    for a record written later, as wal2json's format 1 builds one document per transaction)
    and the formatter did that; or None to have ``change`` called for that change after all.
    The pipeline asks once per relation per transaction, and uses the formatter wherever
    ``change`` would get the message's change unaltered (docs/framework.md, "A fast path");
    it writes the record at the change's LSN as ``ctx.emit`` would. ``change`` stays the
    reference. It exists for speed: the built-in emitters' formatters are written in C.

    A formatter may also have ``lines(datas, start, lsn, txn)``: the records ``write`` would
    return for ``datas[start]``, ``datas[start + 1]``, ... (a list of messages), up to the
    first for which it would return None, as ``(records, next)``, ``next`` that message's
    index or ``len(datas)``. ``lsn`` is every message's LSN, or a list of each one's (at the
    same index). The pipeline uses it for runs of changes it has all at once (an initial
    snapshot's chunk, at one LSN; a transaction replayed from the spool, or a run of one
    relation's changes read in one batch, a list). A formatter whose ``write`` returns True
    returns no records (it keeps each change of the run, as ``write`` does)."""
