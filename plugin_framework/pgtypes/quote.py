"""Identifiers and string literals as PostgreSQL quotes them.

Two identifier quotings, for two jobs: ``quote_identifier`` is the server's own (ruleutils.c),
quoting only where needed, as the plugins whose output pgdecode reproduces print names;
``quote_ident_always`` always quotes, for SQL and replication commands that pgdecode writes
itself, where a name must read back exactly whatever it is. Likewise ``quote_literal`` is
the server's ``quote_literal_cstr`` (an ``E''`` literal when there is a backslash), and
``quote_standard_literal`` the plain literal of the replication command grammar, which has no
``E''`` strings.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

__all__ = [
    "VERSIONED_KEYWORDS",
    "quote_ident_always",
    "quote_identifier",
    "quote_literal",
    "quote_standard_literal",
]

# --- PostgreSQL's quote_identifier (src/backend/utils/adt/ruleutils.c) -------------------------

# Every keyword except the unreserved ones forces quotes, even where the grammar would accept
# it bare (PostgreSQL does not try to tell those cases apart). pglast's lists are those of
# PostgreSQL _NEWEST (tests/pgtypes/test_format_type.py checks that they still are).
@lru_cache(maxsize=1)
def quoted_keywords() -> frozenset[str]:
    """The keywords that force quotes, read from pglast when first needed (importing pglast
    loads PostgreSQL's whole parser, a tenth of a command's start-up)."""
    from pglast.keywords import COL_NAME_KEYWORDS, RESERVED_KEYWORDS, TYPE_FUNC_NAME_KEYWORDS

    return frozenset(RESERVED_KEYWORDS | COL_NAME_KEYWORDS | TYPE_FUNC_NAME_KEYWORDS)


_PLAIN_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]*")

_NEWEST: Final = 18

# The keywords that force quotes in some of the releases 15.._NEWEST only, with the major
# version from which they do (src/include/parser/kwlist.h of each release: these became
# keywords of another category than unreserved, or json moved there from unreserved; no
# keyword left those categories meanwhile). Every other keyword is quoted alike by all of them.
_QUOTED_SINCE: Final[dict[str, int]] = {
    # 16: the SQL/JSON constructors and SYSTEM_USER
    "json_array": 16, "json_arrayagg": 16, "json_object": 16, "json_objectagg": 16,
    "system_user": 16,
    # 17: JSON() (json was unreserved in 16), the SQL/JSON query functions, JSON_TABLE and
    # MERGE's merge_action()
    "json": 17, "json_exists": 17, "json_query": 17, "json_scalar": 17, "json_serialize": 17,
    "json_table": 17, "json_value": 17, "merge_action": 17,
}

VERSIONED_KEYWORDS: Final = frozenset(_QUOTED_SINCE)
"""The names whose quoting depends on the server version: only for these does
``quote_identifier`` need to be given one."""


@lru_cache(maxsize=4096)
def quote_identifier(name: str, server_version: int | None = None) -> str:
    """``name`` double-quoted (quotes doubled) unless it is a plain lower-case identifier.

    Plain means ASCII ``a-z``, ``0-9`` and ``_``, not starting with a digit, and not a keyword
    other than an unreserved one in the release of ``server_version`` (``server_version_num``,
    e.g. 150004). ``None``, or a release newer than the newest known here (18), takes the
    newest's keywords; one older than 15 takes 15's.
    """
    if _PLAIN_IDENTIFIER.fullmatch(name) and (
        name not in quoted_keywords()
        or (server_version is not None and name in _QUOTED_SINCE
            and server_version // 10000 < _QUOTED_SINCE[name])
    ):
        return name
    return '"' + name.replace('"', '""') + '"'


def quote_ident_always(name: str) -> str:
    """``name`` double-quoted, quotes doubled, whatever it is: an identifier that reads back
    exactly in any SQL or replication command, and in any release."""
    return '"' + name.replace('"', '""') + '"'


# --- string literals --------------------------------------------------------------------------


def quote_literal(text: str) -> str:
    """quote_literal_cstr: quotes and backslashes doubled, and an E prefix when there is a
    backslash."""
    quoted = "'" + text.replace("'", "''").replace("\\", "\\\\") + "'"
    return "E" + quoted if "\\" in text else quoted


def quote_standard_literal(value: str) -> str:
    """A single-quoted string literal with quotes doubled and backslashes as they are: what the
    replication command grammar reads (it has no E'' strings), and what SQL reads with
    ``standard_conforming_strings`` on (the default)."""
    return "'" + value.replace("'", "''") + "'"
