"""A two-phase-aware audit trail: one JSON line per PREPARE TRANSACTION and one per outcome.

    {"event": "prepare", "gid": "order-42", "xid": 750, "changes": 3, "tables": [...], ...}
    {"event": "commit_prepared", "gid": "order-42", "xid": 750, "lsn": "0/16C0A28", ...}

Ordinary transactions are recorded as single "commit" lines. Transactions whose gid starts
with the ``ignore-prefix`` option are left to be decoded at COMMIT PREPARED (filter_prepare).
Written only against pgdecode's public API.
"""

from __future__ import annotations

from typing import Any

import orjson

from plugin_framework import LSN, OutputPlugin


class TwoPhaseAudit(OutputPlugin):
    name = "audit-2pc"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        opts = dict(ctx.output_plugin_options)
        self.ignore_prefix = opts.pop("ignore-prefix", None)
        if opts:
            raise ValueError(f'option "{next(iter(opts))}" is unknown')

    def _record(self, ctx: Any, event: str, txn: Any, lsn: LSN, **extra: Any) -> None:
        line = {"event": event, "gid": txn.gid, "xid": txn.xid, "lsn": str(lsn), **extra}
        ctx.emit(orjson.dumps(line))

    def filter_prepare(self, ctx: Any, xid: int, gid: str) -> bool:
        return bool(self.ignore_prefix) and gid.startswith(self.ignore_prefix)

    def begin(self, ctx: Any, txn: Any) -> None:
        txn.output_plugin_private = {"changes": 0, "tables": set()}

    def begin_prepare(self, ctx: Any, txn: Any) -> None:
        self.begin(ctx, txn)

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        txn.output_plugin_private["changes"] += 1
        txn.output_plugin_private["tables"].add(relation.qualified_name)

    def _summary(self, txn: Any) -> dict[str, Any]:
        state = txn.output_plugin_private
        return {"changes": state["changes"], "tables": sorted(state["tables"])}

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        self._record(ctx, "commit", txn, commit_lsn, **self._summary(txn))

    def prepare(self, ctx: Any, txn: Any, prepare_lsn: LSN) -> None:
        self._record(ctx, "prepare", txn, prepare_lsn,
                     prepare_time=txn.prepare_time.isoformat(), **self._summary(txn))

    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        self._record(ctx, "commit_prepared", txn, commit_lsn)

    def rollback_prepared(self, ctx: Any, txn: Any, prepare_end_lsn: LSN,
                          prepare_time: Any) -> None:
        self._record(ctx, "rollback_prepared", txn, prepare_end_lsn)
