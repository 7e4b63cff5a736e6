"""The ``text`` emitter: contrib/test_decoding's output, from the pgoutput stream.

Every line is what PostgreSQL's test_decoding prints through ``pg_logical_slot_get_changes``
(or pg_recvlogical) for the same transactions, byte for byte, when the publication covers
all tables (``FOR ALL TABLES``, every action published) and pgoutput sends text-format values
and messages (``binary`` off, ``messages`` on)::

    BEGIN 741
    table public.items: INSERT: id[integer]:1 name[text]:'one' price[numeric]:9.50
    table public.items: UPDATE: old-key: id[integer]:1 new-tuple: id[integer]:2 ...
    table public.docs: UPDATE: id[integer]:1 body[text]:unchanged-toast-datum
    table public.a, public.b: TRUNCATE: restart_seqs cascade
    message: transactional: 1 prefix: audit, sz: 5 content:hello
    COMMIT 741 (at 2024-05-01 10:11:12.345678+00)
    PREPARE TRANSACTION 'gid-1', txid 742
    COMMIT PREPARED 'gid-1', txid 742
    opening a streamed block for transaction TXN 743
    streaming change for TXN 743
    closing a streamed block for transaction TXN 743
    committing streamed transaction TXN 743

Options are test_decoding's, with its names, defaults and error messages: ``include-xids``
(true), ``include-timestamp`` (false), ``skip-empty-xacts`` (false), ``only-local`` (false),
``include-rewrites`` (false), ``stream-changes`` (false), ``force-binary`` (false). As in C,
a valueless ``-o include-xids`` (likewise include-timestamp, skip-empty-xacts, only-local)
means true, while a valueless ``-o stream-changes`` (likewise force-binary, include-rewrites)
changes nothing. ``filter_prepare`` skips, like test_decoding, the prepared transactions
whose gid contains ``_nodecode``: they are printed as ordinary ones at COMMIT PREPARED.

Known differences (docs/emitters-text.md has the details):

- Empty transactions. test_decoding prints ``BEGIN``/``COMMIT`` for transactions with
  nothing to show (DDL, an autovacuum ANALYZE, a VACUUM FULL) unless ``skip-empty-xacts``;
  pgoutput (PostgreSQL 15 and later) never sends such transactions, so they are missing
  here. With ``skip-empty-xacts`` the outputs are the same. Likewise a stream block holding
  nothing printable is not reported.
- What pgoutput does not send cannot be printed: a DELETE without an old tuple (REPLICA
  IDENTITY NOTHING; test_decoding's ``DELETE: (no-tuple-data)``), table-rewrite changes
  (``include-rewrites`` is accepted and has no effect), generated columns unless the
  publication has ``publish_generated_columns = stored`` (PostgreSQL 18), and whatever row
  filters or column lists of the publication leave out.
- Type names. Built-in types are named by a port of ``format_type_be``. For other types
  pgoutput's Type message is not enough: a domain arrives under its base type's name and an
  array of a user type as ``_name``; they are looked up (once per type) with
  ``format_type`` through ``ctx.catalog`` when the pipeline has one, which names them as
  they are now rather than as they were when the change was made. Without a catalog, a
  ``_name`` is printed ``name[]`` and a domain as its base type.
- Identifiers are quoted as the server the stream comes from quotes them: the few names
  whose quoting changed between PostgreSQL 15 and 18 (``system_user``, ``json_table``,
  ``merge_action``...: keywords since 16 or 17) by that server's version, taken when one
  of them is met from ``ctx.server_version`` if the source set it, else through the
  catalog; without either (``pgdecode replay`` today), as 18 quotes them.
- ``include-timestamp`` prints times in the TimeZone of a session opened with the catalog's
  connection string (which is what the walsender of that connection would use), read once;
  without a catalog in ``$PGTZ``, else UTC.
- A transactional message with ``skip-empty-xacts`` opens the transaction (prints BEGIN, or
  the stream block's opening line) from PostgreSQL 17 on, not before: the server version
  is read as for quoting; without it, the newer behaviour.
- Column values are the server's text output, so they depend on the settings (DateStyle,
  IntervalStyle, extra_float_digits, bytea_output, TimeZone) of the session that decoded
  the pgoutput stream, exactly as test_decoding's depend on its own session's.
- A message whose content is not valid UTF-8 needs ``force-binary`` (test_decoding would
  return it as invalid text).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from itertools import compress
from typing import Any, Final
from zoneinfo import ZoneInfo

from emitters.options import Option, parse_bool, parse_options
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
from plugin_framework.protocol import TupleData

__all__ = ["OPTIONS", "TestDecodingEmitter", "quote_literal", "timestamptz_to_str"]

log = logging.getLogger(__name__)


# --- options ----------------------------------------------------------------------------------

def _strict_bool(text: str) -> bool:
    """PostgreSQL's parse_bool, raising where test_decoding reports a bad value."""
    value = parse_bool(text)
    if value is None:
        raise ValueError  # no detail: test_decoding's message has none
    return value


def _bool_valueless_true(text: str | None) -> bool:
    return True if text is None else _strict_bool(text)


def _bool_valueless_ignored(text: str | None) -> bool:
    # test_decoding ``continue``s on a valueless force-binary, include-rewrites and
    # stream-changes: the option stays at its default (false).
    return False if text is None else _strict_bool(text)


OPTIONS: Final = (
    Option("include-xids", True, _bool_valueless_true,
           "print the transaction id in BEGIN, COMMIT and the other transaction lines"),
    Option("include-timestamp", False, _bool_valueless_true,
           "print the commit (or prepare) time at COMMIT and PREPARE lines"),
    Option("force-binary", False, _bool_valueless_ignored,
           "declare the output binary (needed for messages that are not valid UTF-8)"),
    Option("skip-empty-xacts", False, _bool_valueless_true,
           "print BEGIN and COMMIT only for transactions that print something"),
    Option("only-local", False, _bool_valueless_true,
           "skip transactions replayed from a replication origin"),
    Option("include-rewrites", False, _bool_valueless_ignored,
           "accepted for compatibility; pgoutput never sends table-rewrite changes"),
    Option("stream-changes", False, _bool_valueless_ignored,
           "print in-progress transactions block by block, as the server streams them"),
)


# --- relations ----------------------------------------------------------------------------------

# How print_literal prints a column's text, by its type OID (the column's own type: a domain
# over integer is quoted, as in C).
_QUOTED, _BARE, _BOOL, _BIT = 0, 1, 2, 3
_STYLES: Final[dict[int, int]] = {
    21: _BARE, 23: _BARE, 20: _BARE, 26: _BARE, 700: _BARE, 701: _BARE, 1700: _BARE,  # ints,
    # oid, floats, numeric
    1560: _BIT, 1562: _BIT,  # bit, varbit
    16: _BOOL,
}

_INSERT: Final = Action.INSERT  # module constants: an enum member lookup is slow
_UPDATE: Final = Action.UPDATE

_KIND_TEXT: Final = 0x74  # 't'
_KIND_NULL: Final = 0x6E  # 'n'
_KIND_UNCHANGED_TOAST: Final = 0x75  # 'u'

_IDENT = r'(?:"(?:[^"]|"")*"|[^".]+)'
_QUALIFIED = re.compile(rf"(?:({_IDENT})\.)?({_IDENT})")


def _unquote(ident: str) -> str:
    return ident[1:-1].replace('""', '"') if ident.startswith('"') else ident


class _RelationText:
    """What a relation's lines are made of, computed once per Relation message.

    A row is printed through a ``bytes %`` template made for its pattern of column kinds
    (which columns are null or unchanged TOAST): the headers, the quotes and the null and
    unchanged-toast-datum texts are in the template, only the values are filled in. Values
    are quoted by doubling every ``'`` of all of them at once: only quoted types can hold
    one (numbers, booleans and bit strings never do), and none can hold a NUL.
    """

    __slots__ = ("columns", "delete", "insert", "key_patterns", "patterns", "relation",
                 "tuple_columns", "update")

    def __init__(self, relation: Relation, type_names: list[str],
                 quote: Callable[[str], str] = quote_identifier) -> None:
        self.relation = relation
        self.columns = relation.columns
        table = ("table " + quote(relation.namespace) + "." + quote(relation.name)
                 + ":").encode()
        self.insert = table + b" INSERT:"
        self.update = table + b" UPDATE:"
        self.delete = table + b" DELETE:"
        cols = []
        for column, type_name in zip(relation.columns, type_names, strict=True):
            bare = f" {quote(column.name)}[{type_name}]:".encode()
            style = _STYLES.get(column.type_oid, _QUOTED)
            head = bare + (b"'" if style == _QUOTED else b"B'" if style == _BIT else b"")
            cols.append((style, head, bare))
        # (style, header with the value's opening, bare header for null / unchanged TOAST)
        self.tuple_columns: tuple[tuple[int, bytes, bytes], ...] = tuple(cols)
        self.patterns: dict[bytes, _Pattern | None] = {}  # new tuples: nulls printed
        self.key_patterns: dict[bytes, _Pattern | None] = {}  # old tuples: nulls skipped

    def append(self, out: bytearray, data: TupleData, skip_nulls: bool) -> None:
        """tuple_to_stringinfo over pgoutput's raw column texts."""
        patterns = self.key_patterns if skip_nulls else self.patterns
        kinds = data.kinds
        try:
            pattern = patterns[kinds]
        except KeyError:
            pattern = _Pattern.make(self.tuple_columns, kinds, skip_nulls)
            if len(patterns) < _MAX_PATTERNS:
                patterns[kinds] = pattern
        if pattern is None:  # binary values or a column count that does not match
            _append_tuple(out, self.tuple_columns, data, skip_nulls)
            return
        values: Any = data.values
        if pattern.mask is not None:
            values = tuple(compress(values, pattern.mask))
        if pattern.bools:
            values = list(values)
            for i in pattern.bools:
                values[i] = b"true" if values[i] == b"t" else b"false"
            values = tuple(values)
        joined = b"\0".join(values)
        if b"'" in joined:
            values = tuple(joined.replace(b"'", b"''").split(b"\0"))
        out += pattern.template % values


_MAX_PATTERNS: Final = 256  # kinds patterns cached per relation; beyond, the slow loop


class _Pattern:
    """The template for one pattern of column kinds."""

    __slots__ = ("bools", "mask", "template")

    def __init__(self, template: bytes, mask: tuple[bool, ...] | None,
                 bools: tuple[int, ...]) -> None:
        self.template = template
        self.mask = mask  # which columns have a value; None: all of them
        self.bools = bools  # positions, among the values, of booleans

    @classmethod
    def make(cls, columns: tuple[tuple[int, bytes, bytes], ...], kinds: bytes,
             skip_nulls: bool) -> _Pattern | None:
        if len(kinds) != len(columns):
            return None
        parts: list[bytes] = []
        mask: list[bool] = []
        bools: list[int] = []
        for kind, (style, head, bare) in zip(kinds, columns, strict=True):
            if kind == _KIND_TEXT:
                if style == _BOOL:
                    bools.append(sum(mask))
                mask.append(True)
                closing = b"'" if style == _QUOTED or style == _BIT else b""
                parts.append(head.replace(b"%", b"%%") + b"%s" + closing)
                continue
            mask.append(False)
            if kind == _KIND_NULL:
                if not skip_nulls:
                    parts.append(bare.replace(b"%", b"%%") + b"null")
            elif kind == _KIND_UNCHANGED_TOAST:
                parts.append(bare.replace(b"%", b"%%") + b"unchanged-toast-datum")
            else:
                return None
        return cls(b"".join(parts), None if all(mask) else tuple(mask), tuple(bools))


def _append_tuple(out: bytearray, columns: tuple[tuple[int, bytes, bytes], ...],
                  data: TupleData, skip_nulls: bool) -> None:
    """tuple_to_stringinfo column by column: for what has no template."""
    for kind, value, (style, head, bare) in zip(data.kinds, data.values, columns, strict=True):
        if kind == _KIND_TEXT:
            out += head
            if style == _QUOTED:
                out += value.replace(b"'", b"''")  # type: ignore[union-attr]
                out += b"'"
            elif style == _BARE:
                out += value  # type: ignore[arg-type]
            elif style == _BOOL:
                out += b"true" if value == b"t" else b"false"
            else:
                out += value  # type: ignore[arg-type]
                out += b"'"
        elif kind == _KIND_NULL:
            if not skip_nulls:
                out += bare
                out += b"null"
        elif kind == _KIND_UNCHANGED_TOAST:
            out += bare
            out += b"unchanged-toast-datum"
        else:
            raise ValueError(
                "the text emitter prints the server's text output of values: start pgoutput "
                "with binary = false"
            )


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
        self.relations: dict[int, _RelationText] = {}
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
    """contrib/test_decoding's output. See the module docstring."""

    __test__ = False  # not a pytest test class, despite the name
    name = "text"

    # --- start and end --------------------------------------------------------------------

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        values = parse_options(OPTIONS, ctx.output_plugin_options)
        ctx.output_plugin_private = _State(values)
        options.output_type = OutputType.BINARY if values["force-binary"] else OutputType.TEXTUAL
        options.receive_rewrites = values["include-rewrites"]
        ctx.streaming = ctx.streaming and values["stream-changes"]

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
        return _type_name_from_stream(column, lambda name: self._quote(ctx, state, name))

    def _relation(self, ctx: Any, state: _State, relation: Relation) -> _RelationText:
        text = state.relations.get(relation.relation_id)
        if text is not None:
            if text.relation is relation:
                return text
            if (text.columns == relation.columns and text.relation.name == relation.name
                    and text.relation.namespace == relation.namespace):
                text.relation = relation  # the same description in a new object
                return text
        names = [self._type_name(ctx, state, c) for c in relation.columns]
        text = state.relations[relation.relation_id] = _RelationText(
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


def _type_name_from_stream(column: Column, quote: Callable[[str], str]) -> str:
    """A non-built-in type's name as pgoutput's Type message gave it (Column.type_name,
    format_type with the typmod), without typmod, ``_name`` read as the array ``name[]``,
    and its identifiers quoted by ``quote`` (Column.type_name quotes as the newest release
    does)."""
    name = column.type_name
    suffix = f"({column.type_modifier})"
    if column.type_modifier >= 0 and name.endswith(suffix):
        name = name[: -len(suffix)]
    match = _QUALIFIED.fullmatch(name)
    if match is None:
        return name
    namespace, ident = match.groups()
    if namespace:
        namespace = _requote(namespace, quote)
    plain = _unquote(ident)
    if len(plain) > 1 and plain.startswith("_"):
        element = quote(plain[1:]) + "[]"
        return f"{namespace}.{element}" if namespace else element
    ident = _requote(ident, quote)
    return f"{namespace}.{ident}" if namespace else ident


def _requote(ident: str, quote: Callable[[str], str]) -> str:
    """A quoted identifier whose quoting depends on the release, quoted again by ``quote``.
    Only quoted ones: a bare ``json`` is the built-in type's name, which is never quoted."""
    if ident.startswith('"'):
        plain = _unquote(ident)
        if plain in VERSIONED_KEYWORDS:
            return quote(plain)
    return ident
