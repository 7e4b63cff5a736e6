"""Emitter options: declared once in a table per emitter, parsed by one parser.

Values come from ``-o name=value`` (or ``-o name`` alone, which is None: for booleans, true,
as in PostgreSQL's plugins). Unknown options and bad values are errors, worded as
PostgreSQL's own plugins word them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class OptionError(ValueError):
    """An emitter option that is unknown or has a value that cannot be parsed."""


def parse_bool(text: str) -> bool | None:
    """PostgreSQL's parse_bool: true/false/yes/no/on/off/1/0, case-insensitive, and any
    unambiguous prefix of them ("t", "of"); None when it is none of these. Like PostgreSQL it
    does not trim blanks: " true" is not a boolean."""
    value = text.lower()
    if not value:
        return None
    if value in ("1", "0"):
        return value == "1"
    if "true".startswith(value) or "yes".startswith(value):
        return True
    if "false".startswith(value) or value == "n" or "no".startswith(value):
        return False
    if value == "on":
        return True
    if len(value) >= 2 and "off".startswith(value):
        return False
    return None


@dataclass(frozen=True)
class Option:
    """One option: its name, how its text becomes a value, and its default."""

    name: str
    default: Any
    parse: Callable[[str | None], Any] | None = None  # None: a boolean
    help: str = ""

    def value(self, text: str | None) -> Any:
        if self.parse is not None:
            return self.parse(text)
        if text is None:
            return True
        parsed = parse_bool(text)
        if parsed is None:
            raise ValueError
        return parsed


def parse_options(table: Sequence[Option], given: Mapping[str, str | None]) -> dict[str, Any]:
    """Values of every option in ``table``: given ones parsed, the others defaulted.

    Raises OptionError: ``option "x" = "y" is unknown`` and ``could not parse value "y" for
    parameter "x"``, as test_decoding words them.
    """
    by_name = {opt.name: opt for opt in table}
    values = {opt.name: opt.default for opt in table}
    for name, text in given.items():
        opt = by_name.get(name)
        if opt is None:
            raise OptionError(f'option "{name}" = "{"(null)" if text is None else text}" '
                              "is unknown")
        try:
            values[name] = opt.value(text)
        except (ValueError, TypeError) as exc:
            detail = f": {exc}" if str(exc) else ""
            raise OptionError(
                f'could not parse value "{text}" for parameter "{name}"{detail}'
            ) from None
    return values


def parse_int(text: str | None) -> int:
    if text is None:
        raise ValueError("a number is required")
    return int(text)


def parse_list(text: str | None) -> list[str]:
    """A comma-separated list (wal2json's add-tables, actions...), backslash escapes a comma
    or a backslash."""
    if text is None:
        raise ValueError("a list is required")
    items, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            items.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    items.append("".join(current).strip())
    return items


def describe(table: Sequence[Option]) -> list[tuple[str, str, str]]:
    """(name, default, help) rows, for documentation and --help."""
    return [(o.name, repr(o.default), o.help) for o in table]
