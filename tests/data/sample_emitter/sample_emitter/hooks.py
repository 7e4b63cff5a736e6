"""The same emitter as pluggy hook implementations in a module."""

from __future__ import annotations

from typing import Any

from plugin_framework import hookimpl


@hookimpl
def begin(ctx: Any, txn: Any) -> None:
    ctx.emit(f"begin {txn.xid}")


@hookimpl
def change(ctx: Any, relation: Any, change: Any) -> None:
    ctx.emit(f"{relation.name} {change.action}")


@hookimpl
def commit(ctx: Any, txn: Any) -> None:
    ctx.emit(f"commit {txn.xid}")
