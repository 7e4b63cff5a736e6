"""The text emitter's callbacks: test_decoding's, over the pgoutput stream."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any, Final
from zoneinfo import ZoneInfo

from emitters.options import parse_options
from emitters.text.fast import FAST_PATH_BUILT, row_format
from emitters.text.options import OPTIONS
from emitters.text.relation import RelationText, type_name_from_stream
from plugin_framework import (
    LSN,
    Action,
    Change,
    Column,
    OutputPlugin,
    OutputType,
    Relation,
    Transaction,
    TruncateChange,
)
from plugin_framework.pgtypes import (
    VERSIONED_KEYWORDS,
    format_type_be,
    quote_identifier,
    quote_literal,
    timestamptz_to_str,
)

log = logging.getLogger("emitters.text")

_INSERT: Final = Action.INSERT  # module constants: an enum member lookup is slow
_UPDATE: Final = Action.UPDATE


# --- per-decoding and per-transaction state ----------------------------------------------------

class _TxnData:
    """TestDecodingTxnData."""

    __slots__ = ("stream_wrote", "wrote")

    def __init__(self) -> None:
        self.wrote = False
        self.stream_wrote = False


class _State:
    """TestDecodingData, plus the caches."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.include_xids: bool = values["include-xids"]
        self.include_timestamp: bool = values["include-timestamp"]
        self.skip_empty_xacts: bool = values["skip-empty-xacts"]
        self.only_local: bool = values["only-local"]
        self.relations: dict[int, RelationText] = {}
        self.catalog_types: dict[int, str | None] = {}
        self.zone: tzinfo | None = None
        self.server_version: int | None = None  # server_version_num; None: unknown
        self.server_version_known = False
        self.catalog_failed = False


def _txn_data(txn: Transaction) -> _TxnData:
    data = txn.output_plugin_private
    if data is None:  # a transaction the framework began without us (cannot happen in C)
        data = txn.output_plugin_private = _TxnData()
    assert isinstance(data, _TxnData)
    return data


class TestDecodingEmitter(OutputPlugin):
    """contrib/test_decoding's output. See the package docstring (emitters.text)."""

    __test__ = False  # not a pytest test class, despite the name
    name = "text"

    # --- start and end --------------------------------------------------------------------

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        values = parse_options(OPTIONS, ctx.output_plugin_options)
        ctx.output_plugin_private = _State(values)
        options.output_type = OutputType.BINARY if values["force-binary"] else OutputType.TEXTUAL
        options.receive_rewrites = values["include-rewrites"]
        ctx.streaming = ctx.streaming and values["stream-changes"]
        ctx.filter_all_origins = values["only-local"]  # filter_by_origin's answer, for all

    def shutdown(self, ctx: Any) -> None:
        ctx.output_plugin_private = None

    # --- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _catalog_query(ctx: Any, state: _State, sql: str) -> Any:
        """The first value of a catalog query, or None without a catalog or on failure."""
        catalog = ctx.catalog
        if catalog is None or state.catalog_failed:
            return None
        try:
            rows = catalog.query(sql)
        except Exception as exc:
            # Never fail decoding for a name; say so once and use what the stream tells.
            log.warning("text emitter: catalog query failed, not asking again (type names "
                        "from the stream, times in UTC, newest behaviour): %s", exc)
            state.catalog_failed = True
            return None
        return rows[0][0] if rows else None

    def _type_name(self, ctx: Any, state: _State, column: Column) -> str:
        """format_type_be(atttypid)."""
        oid = column.type_oid
        name = format_type_be(oid)
        if name != "???":
            return name  # built in: pgoutput sends no Type message, the port knows it
        if oid not in state.catalog_types:
            # The OID inline: Catalog's read-only check parses the SQL, and cannot parse
            # psycopg's %s placeholders.
            found = self._catalog_query(ctx, state, f"SELECT format_type({int(oid)}::oid, NULL)")
            state.catalog_types[oid] = (
                found if isinstance(found, str) and found != "???" else None)
        found = state.catalog_types[oid]
        if found is not None:
            return found
        return type_name_from_stream(column, lambda name: self._quote(ctx, state, name))

    def _relation(self, ctx: Any, state: _State, relation: Relation) -> RelationText:
        text = state.relations.get(relation.relation_id)
        if text is not None:
            if text.relation is relation:
                return text
            if (text.columns == relation.columns and text.relation.name == relation.name
                    and text.relation.namespace == relation.namespace):
                text.relation = relation  # the same description in a new object
                return text
        names = [self._type_name(ctx, state, c) for c in relation.columns]
        text = state.relations[relation.relation_id] = RelationText(
            relation, names, lambda name: self._quote(ctx, state, name))
        return text

    def _quote(self, ctx: Any, state: _State, name: str) -> str:
        """quote_identifier as the stream's server does it: the version is needed (and asked
        for) only for the few names whose quoting changed between releases."""
        if name in VERSIONED_KEYWORDS:
            return quote_identifier(name, self._server_version(ctx, state))
        return quote_identifier(name)

    def _server_version(self, ctx: Any, state: _State) -> int | None:
        """The server_version_num of the server the stream comes from, once; None when
        unknown (the newest release's behaviour is followed then). A source that knows it
        may put it in ``ctx.server_version``; otherwise it is asked through the catalog."""
        if not state.server_version_known:
            state.server_version_known = True
            version = getattr(ctx, "server_version", None)
            if not (isinstance(version, int) and version > 0):
                num = self._catalog_query(
                    ctx, state, "SELECT current_setting('server_version_num')")
                version = int(num) if isinstance(num, str) and num.isdigit() else None
            state.server_version = version
        return state.server_version

    def _zone(self, ctx: Any, state: _State) -> tzinfo:
        if state.zone is None:
            state.zone = self._session_zone(ctx, state)
        return state.zone

    def _session_zone(self, ctx: Any, state: _State) -> tzinfo:
        name = self._catalog_query(ctx, state, "SELECT current_setting('TimeZone')")
        if not isinstance(name, str):
            name = os.environ.get("PGTZ") or "UTC"
        try:
            return ZoneInfo(name)
        except (ValueError, OSError, LookupError):  # ZoneInfoNotFoundError is a KeyError
            pass
        # A POSIX-style zone ("<+03>-03", "UTC+3"): the server's current offset, fixed.
        seconds = self._catalog_query(
            ctx, state, "SELECT EXTRACT(TIMEZONE FROM now())::integer")
        if isinstance(seconds, int):
            return timezone(timedelta(seconds=seconds))
        log.warning("text emitter: time zone %r is unknown here, printing times in UTC", name)
        return UTC

    def _messages_open_xacts(self, ctx: Any, state: _State) -> bool:
        """Whether a transactional message counts as a change for skip-empty-xacts: from
        PostgreSQL 17 on (15 and 16 print it without BEGIN and without counting it)."""
        version = self._server_version(ctx, state)
        return version is None or version >= 170000

    def _at(self, ctx: Any, state: _State, moment: datetime | None) -> str:
        if moment is None:
            return ""
        return " (at " + timestamptz_to_str(moment, self._zone(ctx, state)) + ")"

    @staticmethod
    def _emit_begin(ctx: Any, state: _State, txn: Transaction) -> None:
        ctx.emit(f"BEGIN {txn.xid}" if state.include_xids else "BEGIN")

    @staticmethod
    def _emit_stream_start(ctx: Any, state: _State, txn: Transaction) -> None:
        if state.include_xids:
            ctx.emit(f"opening a streamed block for transaction TXN {txn.xid}")
        else:
            ctx.emit("opening a streamed block for transaction")

    # --- ordinary transactions ---------------------------------------------------------------

    def begin(self, ctx: Any, txn: Transaction) -> None:
        txn.output_plugin_private = _TxnData()
        state: _State = ctx.output_plugin_private
        if not state.skip_empty_xacts:
            self._emit_begin(ctx, state, txn)

    def commit(self, ctx: Any, txn: Transaction, commit_lsn: LSN) -> None:
        state: _State = ctx.output_plugin_private
        data = txn.output_plugin_private
        txn.output_plugin_private = None
        if state.skip_empty_xacts and not (data is not None and data.wrote):
            return
        line = f"COMMIT {txn.xid}" if state.include_xids else "COMMIT"
        if state.include_timestamp:
            line += self._at(ctx, state, txn.commit_time)
        ctx.emit(line)

    def change(self, ctx: Any, txn: Transaction, relation: Relation, change: Change) -> None:
        state: _State = ctx.output_plugin_private
        if state.skip_empty_xacts:
            data = _txn_data(txn)
            if not data.wrote:
                self._emit_begin(ctx, state, txn)
            data.wrote = True
        text = state.relations.get(relation.relation_id)
        if text is None or text.relation is not relation:
            text = self._relation(ctx, state, relation)
        ctx.prepare_write()
        out: bytearray = ctx.out
        action = change.action
        if action is _INSERT:
            new = change.new
            out += text.insert
            if new is None:
                out += b" (no-tuple-data)"
            else:
                text.append(out, new.data, False)
        elif action is _UPDATE:
            new, old = change.new, change.old
            out += text.update
            if old is not None:
                out += b" old-key:"
                text.append(out, old.data, True)
                out += b" new-tuple:"
            if new is None:
                out += b" (no-tuple-data)"
            else:
                text.append(out, new.data, False)
        else:
            old = change.old
            out += text.delete
            if old is None:
                out += b" (no-tuple-data)"
            else:
                text.append(out, old.data, True)
        ctx.write()

    def fast_change(self, ctx: Any, relation: Relation) -> Any:
        """The relation's C formatter (docs/framework.md, "fast_change"), which writes what
        ``change`` writes; None where the C module is not built."""
        if not FAST_PATH_BUILT:
            return None
        state: _State = ctx.output_plugin_private
        text = state.relations.get(relation.relation_id)
        if text is None or text.relation is not relation:
            text = self._relation(ctx, state, relation)
        if text.fast is None:
            text.fast = row_format(text, state.skip_empty_xacts)
        return text.fast

    def truncate(self, ctx: Any, txn: Transaction, relations: list[Relation],
                 change: TruncateChange) -> None:
        state: _State = ctx.output_plugin_private
        if state.skip_empty_xacts:
            data = _txn_data(txn)
            if not data.wrote:
                self._emit_begin(ctx, state, txn)
            data.wrote = True
        names = ", ".join(self._quote(ctx, state, r.namespace) + "."
                          + self._quote(ctx, state, r.name) for r in relations)
        flags = ""
        if change.restart_identity:
            flags += " restart_seqs"
        if change.cascade:
            flags += " cascade"
        ctx.emit(f"table {names}: TRUNCATE:{flags or ' (no-flags)'}")

    def message(self, ctx: Any, txn: Transaction | None, message_lsn: LSN,
                transactional: bool, prefix: str, message: bytes) -> None:
        state: _State = ctx.output_plugin_private
        if (transactional and txn is not None and state.skip_empty_xacts
                and self._messages_open_xacts(ctx, state)):
            data = _txn_data(txn)
            if not data.wrote:
                self._emit_begin(ctx, state, txn)
            data.wrote = True
        ctx.prepare_write()
        ctx.out += (f"message: transactional: {int(transactional)} prefix: {prefix}, "
                    f"sz: {len(message)} content:").encode()
        ctx.out += message
        ctx.write()

    def filter_by_origin(self, ctx: Any, origin: str) -> bool:
        state: _State = ctx.output_plugin_private
        return state.only_local

    # --- two-phase ---------------------------------------------------------------------------

    def filter_prepare(self, ctx: Any, xid: int, gid: str) -> bool:
        return "_nodecode" in gid

    def begin_prepare(self, ctx: Any, txn: Transaction) -> None:
        self.begin(ctx, txn)

    def _two_phase_line(self, ctx: Any, state: _State, what: str, txn: Transaction,
                        moment: datetime | None) -> None:
        line = f"{what} {quote_literal(txn.gid or '')}"
        if state.include_xids:
            line += f", txid {txn.xid}"
        if state.include_timestamp:
            line += self._at(ctx, state, moment)
        ctx.emit(line)

    def prepare(self, ctx: Any, txn: Transaction, prepare_lsn: LSN) -> None:
        state: _State = ctx.output_plugin_private
        data = txn.output_plugin_private
        if state.skip_empty_xacts and not (data is not None and data.wrote):
            return
        self._two_phase_line(ctx, state, "PREPARE TRANSACTION", txn, txn.prepare_time)

    def commit_prepared(self, ctx: Any, txn: Transaction, commit_lsn: LSN) -> None:
        state: _State = ctx.output_plugin_private
        self._two_phase_line(ctx, state, "COMMIT PREPARED", txn, txn.commit_time)

    def rollback_prepared(self, ctx: Any, txn: Transaction, prepare_end_lsn: LSN,
                          prepare_time: datetime) -> None:
        state: _State = ctx.output_plugin_private
        # C prints xact_time.commit_time, which the rollback record's time has replaced; it
        # still holds the prepare time (a union) where nothing replaced it.
        moment = txn.commit_time if txn.commit_time is not None else prepare_time
        self._two_phase_line(ctx, state, "ROLLBACK PREPARED", txn, moment)

    # --- streaming ---------------------------------------------------------------------------

    def stream_start(self, ctx: Any, txn: Transaction) -> None:
        state: _State = ctx.output_plugin_private
        _txn_data(txn).stream_wrote = False
        if not state.skip_empty_xacts:
            self._emit_stream_start(ctx, state, txn)

    def stream_stop(self, ctx: Any, txn: Transaction) -> None:
        state: _State = ctx.output_plugin_private
        if state.skip_empty_xacts and not _txn_data(txn).stream_wrote:
            return
        if state.include_xids:
            ctx.emit(f"closing a streamed block for transaction TXN {txn.xid}")
        else:
            ctx.emit("closing a streamed block for transaction")

    def stream_abort(self, ctx: Any, txn: Transaction, abort_lsn: LSN | None) -> None:
        state: _State = ctx.output_plugin_private
        top = txn.toptxn if txn.toptxn is not None else txn
        data = top.output_plugin_private
        wrote = data is not None and data.wrote
        if txn.toptxn is None:
            txn.output_plugin_private = None
        if state.skip_empty_xacts and not wrote:
            return
        if state.include_xids:
            ctx.emit(f"aborting streamed (sub)transaction TXN {txn.xid}")
        else:
            ctx.emit("aborting streamed (sub)transaction")

    def stream_prepare(self, ctx: Any, txn: Transaction, prepare_lsn: LSN) -> None:
        state: _State = ctx.output_plugin_private
        data = txn.output_plugin_private
        if state.skip_empty_xacts and not (data is not None and data.wrote):
            return
        gid = quote_literal(txn.gid or "")
        if state.include_xids:
            line = f"preparing streamed transaction TXN {gid}, txid {txn.xid}"
        else:
            line = f"preparing streamed transaction {gid}"
        if state.include_timestamp:
            line += self._at(ctx, state, txn.prepare_time)
        ctx.emit(line)

    def stream_commit(self, ctx: Any, txn: Transaction, commit_lsn: LSN) -> None:
        state: _State = ctx.output_plugin_private
        data = txn.output_plugin_private
        txn.output_plugin_private = None
        if state.skip_empty_xacts and not (data is not None and data.wrote):
            return
        line = (f"committing streamed transaction TXN {txn.xid}" if state.include_xids
                else "committing streamed transaction")
        if state.include_timestamp:
            line += self._at(ctx, state, txn.commit_time)
        ctx.emit(line)

    def _stream_wrote(self, ctx: Any, state: _State, txn: Transaction) -> None:
        """A printable stream item: open the block first under skip-empty-xacts."""
        data = _txn_data(txn)
        if state.skip_empty_xacts and not data.stream_wrote:
            self._emit_stream_start(ctx, state, txn)
        data.wrote = data.stream_wrote = True

    def stream_change(self, ctx: Any, txn: Transaction, relation: Relation,
                      change: Change) -> None:
        state: _State = ctx.output_plugin_private
        self._stream_wrote(ctx, state, txn)
        ctx.emit(f"streaming change for TXN {txn.xid}" if state.include_xids
                 else "streaming change for transaction")

    def stream_truncate(self, ctx: Any, txn: Transaction, relations: list[Relation],
                        change: TruncateChange) -> None:
        state: _State = ctx.output_plugin_private
        self._stream_wrote(ctx, state, txn)
        ctx.emit(f"streaming truncate for TXN {txn.xid}" if state.include_xids
                 else "streaming truncate for transaction")

    def stream_message(self, ctx: Any, txn: Transaction, message_lsn: LSN, transactional: bool,
                       prefix: str, message: bytes) -> None:
        state: _State = ctx.output_plugin_private
        if transactional and self._messages_open_xacts(ctx, state):
            self._stream_wrote(ctx, state, txn)
        head = (f"streaming message: transactional: {int(transactional)} prefix: {prefix}, "
                f"sz: {len(message)}")
        if transactional:
            ctx.emit(head)
        else:
            ctx.emit(head.encode() + b" content:" + message)
