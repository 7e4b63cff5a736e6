"""The wal2json emitter: the output plugin's callbacks, over the two format versions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emitters.wal2json.fast import FAST_PATH_BUILT, v1_row_format, v2_row_format
from emitters.wal2json.options import read_options
from emitters.wal2json.relation import (
    compile_relation,
    escape_json,
    escape_raw,
    table_selected,
)
from emitters.wal2json.state import State, origin_id, txn_origin_id, txn_timestamp
from emitters.wal2json.v1 import v1_begin, v1_change, v1_message
from emitters.wal2json.v2 import v2_boundary, v2_change, v2_message, v2_truncate
from plugin_framework import LSN, Action, OutputPlugin
from plugin_framework.framework import (
    LogicalDecodingContext,
    OutputType,
    Relation,
    Spool,
    SpoolBudget,
    Transaction,
    TruncateChange,
)

# Memory for a transaction's output held until its commit (include-lsn); past it, the output
# goes to a temporary file, as the framework's spools do, so a huge transaction stays bounded.
HOLD_MEMORY = 16 * 1024 * 1024


class Wal2JsonEmitter(OutputPlugin):
    """wal2json 2.5's output from pgoutput; see the package docstring (emitters.wal2json)."""

    name = "wal2json"

    # -- set-up --------------------------------------------------------------------------------

    def startup(self, ctx: LogicalDecodingContext, options: Any, is_init: bool) -> None:
        values = read_options(ctx.output_plugin_options, ctx.catalog is not None)
        ctx.output_plugin_private = State(values, ctx.catalog)
        options.output_type = OutputType.TEXTUAL

    def shutdown(self, ctx: LogicalDecodingContext) -> None:
        ctx.output_plugin_private = None

    def filter_by_origin(self, ctx: LogicalDecodingContext, origin: str) -> bool:
        st: State = ctx.output_plugin_private
        if not st.filter_origins:
            return False
        return origin_id(st, origin, "filter-origins") in st.filter_origins

    # -- transactions --------------------------------------------------------------------------

    def begin(self, ctx: LogicalDecodingContext, txn: Transaction) -> None:
        st: State = ctx.output_plugin_private
        st.nr_changes = 0
        fields = b""
        if st.include_xids:
            fields += b',"xid":%d' % txn.xid
        if st.include_timestamp:
            fields += b',"timestamp":"' + txn_timestamp(st, txn) + b'"'
        if st.include_origin:
            fields += b',"origin":%d' % txn_origin_id(st, txn)
        st.txn_fields = fields
        # include-lsn prints the end of the commit record at the begin, which pgoutput's Begin
        # does not carry: hold the transaction's output until the commit tells it.
        hold = (st.include_lsn and txn.end_lsn is None
                and (st.chunks if st.version == 1 else st.include_transaction))
        if st.held is not None:  # a transaction cut short (the stream restarted)
            st.held.close()
        st.held = Spool(SpoolBudget(HOLD_MEMORY)) if hold else None
        st.held_begin = (ctx.write_location, ctx.write_xid) if hold else None
        if st.version == 2:
            if st.include_transaction and not hold:
                ctx.emit(v2_boundary(st, b"B", txn, txn.final_lsn))
        else:
            st.v1_parts = []
            if st.chunks and not hold:
                ctx.emit(v1_begin(st, txn))

    def commit(self, ctx: LogicalDecodingContext, txn: Transaction, commit_lsn: LSN) -> None:
        st: State = ctx.output_plugin_private
        held, st.held = st.held, None
        if held is not None:
            here = (ctx.write_location, ctx.write_xid)
            assert st.held_begin is not None
            ctx.write_location, ctx.write_xid = st.held_begin
            if st.version == 2:
                ctx.emit(v2_boundary(st, b"B", txn, txn.final_lsn))
            elif st.chunks:
                ctx.emit(v1_begin(st, txn))
            try:
                for lsn, xid, _, data in held:
                    ctx.write_location, ctx.write_xid = lsn, xid or None
                    ctx.emit(data)
            finally:
                held.close()
            ctx.write_location, ctx.write_xid = here
        if st.version == 2:
            if st.include_transaction:
                ctx.emit(v2_boundary(st, b"C", txn, commit_lsn))
            return
        ht, nl = st.ht, st.nl
        if st.chunks:
            ctx.emit(ht + b"]" + nl + b"}")
        else:
            parts = st.v1_parts
            st.v1_parts = []
            ctx.emit(b"".join((v1_begin(st, txn), *parts, nl, ht, b"]", nl, b"}")))

    # -- changes -------------------------------------------------------------------------------

    def change(self, ctx: LogicalDecodingContext, txn: Transaction, relation: Relation,
               change: Any) -> None:
        st: State = ctx.output_plugin_private
        action = change.action
        if action is Action.INSERT:
            if not st.do_insert:
                return
        elif action is Action.UPDATE:
            if not st.do_update:
                return
        elif not st.do_delete:
            return
        r = st.rels.get(relation.relation_id)
        if r is None or r.relation is not relation:
            r = st.rels[relation.relation_id] = compile_relation(st, relation)
        if not r.selected:
            return
        if st.version == 2:
            data = v2_change(st, r, change)
            if data is not None:
                self._out(ctx, st, data)
            return
        data = v1_change(st, r, change)
        if data is None:
            return
        if st.chunks:
            self._out(ctx, st, data)
        else:
            st.v1_parts.append(data)

    def fast_change(self, ctx: LogicalDecodingContext, relation: Relation) -> Any:
        """The table's C formatter for this transaction (docs/framework.md, "fast_change"),
        which does what ``change`` does, unless the output is held for the commit
        (include-lsn: the transaction's first line needs the commit's LSN); None then."""
        st: State = ctx.output_plugin_private
        if st.held is not None or not FAST_PATH_BUILT:
            return None
        r = st.rels.get(relation.relation_id)
        if r is None or r.relation is not relation:
            if not (st.do_insert and st.do_update and st.do_delete):
                # The callback plans a table (catalog queries, warnings) only for a change
                # it prints: leave this relation's first transaction to it.
                return None
            try:
                r = compile_relation(st, relation)
            except ValueError:
                return None  # the change callback says so, for a change it prints
            st.rels[relation.relation_id] = r
        if not r.selected:
            return None
        if st.version == 1:  # the same for every transaction
            if r.fast is None:
                r.fast = (b"", v1_row_format(st, r))
        elif r.fast is None or r.fast[0] != st.txn_fields:
            r.fast = (st.txn_fields, v2_row_format(st, r))
        return r.fast[1]

    def truncate(self, ctx: LogicalDecodingContext, txn: Transaction,
                 relations: Sequence[Relation], change: TruncateChange) -> None:
        st: State = ctx.output_plugin_private
        if st.version == 1 or not st.do_truncate:
            return  # wal2json's format 1 prints nothing for TRUNCATE
        for relation in relations:
            if table_selected(st, relation.namespace, relation.name):
                self._out(ctx, st, v2_truncate(st, relation, change))

    def message(self, ctx: LogicalDecodingContext, txn: Transaction | None, message_lsn: LSN,
                transactional: bool, prefix: str, message: bytes) -> None:
        st: State = ctx.output_plugin_private
        if st.filter_msg_prefixes and prefix in st.filter_msg_prefixes:
            return
        if st.add_msg_prefixes and prefix not in st.add_msg_prefixes:
            return
        content = escape_raw(bytes(message).split(b"\0", 1)[0])
        prefix_json = escape_json(prefix)
        if st.version == 2:
            data = v2_message(st, message_lsn, transactional, prefix_json, content)
            if transactional:
                self._out(ctx, st, data)
            else:
                ctx.emit(data)
            return
        data = v1_message(st, transactional, prefix_json, content)
        if not transactional:
            ctx.emit(data)
        elif st.chunks:
            self._out(ctx, st, data)
        else:
            st.v1_parts.append(data)

    @staticmethod
    def _out(ctx: LogicalDecodingContext, st: State, data: bytes) -> None:
        held = st.held
        if held is None:
            ctx.emit(data)
        else:
            held.append(ctx.write_location, ctx.write_xid or 0, False, data)
