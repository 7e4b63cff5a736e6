"""test_decoding's options: its names, defaults and (valueless) quirks."""

from __future__ import annotations

from typing import Final

from emitters.options import Option, parse_bool

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
