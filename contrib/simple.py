"""The smallest useful output plugin: one line per transaction boundary and per change.

    BEGIN 741
    INSERT public.items id=1 name='one'
    COMMIT 741 at 0/16B3748

Written only against pgdecode's public API, as an example to copy from.
"""

from __future__ import annotations

from typing import Any

from plugin_framework import LSN, UNCHANGED_TOAST, OutputPlugin


class SimplePlugin(OutputPlugin):
    name = "simple"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        for option in ctx.output_plugin_options:
            raise ValueError(f'option "{option}" = "{ctx.output_plugin_options[option]}" is '
                             "unknown")

    def begin(self, ctx: Any, txn: Any) -> None:
        ctx.emit(f"BEGIN {txn.xid}")

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        row = change.new if change.new is not None else change.old
        ctx.emit(f"{change.action} {relation.qualified_name} {_columns(row)}")

    def commit(self, ctx: Any, txn: Any, commit_lsn: LSN) -> None:
        ctx.emit(f"COMMIT {txn.xid} at {commit_lsn}")


def _columns(row: Any) -> str:
    parts = []
    for name, text in row.texts().items():
        if text is None:
            continue  # NULLs (and, in old keys, the non-key columns) are left out
        shown = "(unchanged)" if text is UNCHANGED_TOAST else repr(text)
        parts.append(f"{name}={shown}")
    return " ".join(parts)
