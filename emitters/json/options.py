"""The json emitter's options, declared once (docs/json-format.md describes them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from emitters.options import Option

__all__ = ["DEBEZIUM_OPTIONS", "JSON_ONLY_OPTIONS", "OPTIONS"]


def _choice(*allowed: str) -> Callable[[str | None], str]:
    def parse(text: str | None) -> str:
        value = (text or "").strip().lower()
        if value not in allowed:
            raise ValueError(f"expected {' or '.join(allowed)}")
        return value

    return parse


def _text(text: str | None) -> str:
    if not text:
        raise ValueError("a value is required")
    return text


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
    Option("envelope", "pgdecode", _choice("pgdecode", "debezium"),
           "pgdecode: this format; debezium: the value of each change event that Debezium's "
           "PostgreSQL connector publishes (docs/json-format.md, \"Debezium envelope\")"),
    Option("topic-prefix", None, _text,
           "debezium: source.name, Debezium's topic.prefix (default: the slot's name)"),
    Option("database", None, _text,
           "debezium: source.db (default: the database the stream reads)"),
    Option("unavailable-value-placeholder", "__debezium_unavailable_value", _text,
           "debezium: what stands for an unchanged TOASTed value"),
    Option("unrepresentable", "error", _choice("error", "null"),
           "debezium: a value Debezium's type cannot hold (numeric NaN, infinite dates): an "
           "error, or null as Debezium sends"),
]

# The options that only the Debezium envelope reads, and the json format's that it does not
DEBEZIUM_OPTIONS: Final = frozenset({"topic-prefix", "database",
                                     "unavailable-value-placeholder", "unrepresentable"})
JSON_ONLY_OPTIONS: Final = frozenset({"numeric-as", "bytea", "two-phase",
                                      "include-transaction-events"})
