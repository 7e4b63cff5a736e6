"""The json emitter's options, declared once (docs/json-format.md describes them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from emitters.options import Option

__all__ = ["OPTIONS"]


def _choice(*allowed: str) -> Callable[[str | None], str]:
    def parse(text: str | None) -> str:
        value = (text or "").strip().lower()
        if value not in allowed:
            raise ValueError(f"expected {' or '.join(allowed)}")
        return value

    return parse


OPTIONS: Final = [
    Option("numeric-as", "string", _choice("string", "number"),
           "numeric values as JSON strings (exact, default) or as JSON numbers (the server's "
           "digits verbatim; NaN and infinities stay strings)"),
    Option("bytea", "hex", _choice("hex", "base64"), "bytea values as hex or base64 strings"),
    Option("two-phase", False, None,
           "emit prepared transactions at PREPARE TRANSACTION (phase \"prepare\"), then a "
           "commit_prepared or rollback_prepared line; off: at COMMIT PREPARED only"),
    Option("include-transaction-events", False, None,
           "also emit begin, commit and prepare lines"),
]
