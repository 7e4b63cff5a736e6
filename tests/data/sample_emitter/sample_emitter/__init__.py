"""A third-party emitter: one line per change, 'TABLE ACTION key=value'."""

from __future__ import annotations

from typing import Any

from plugin_framework import OutputPlugin


class SampleEmitter(OutputPlugin):
    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        self.prefix = ctx.output_plugin_options.get("prefix") or ""

    def begin(self, ctx: Any, txn: Any) -> None:
        pass

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        row = change.new if change.new is not None else change.old
        key = ",".join(f"{c}={row.text(c)}" for c in relation.key_columns)
        ctx.emit(f"{self.prefix}{relation.name} {change.action} {key}")

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        pass
