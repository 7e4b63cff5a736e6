"""The server's case mapping for one collation, read from the server itself.

``lower``, ``upper``, ``initcap`` and ``ILIKE`` (which is ``lower(s) LIKE lower(p)`` in a UTF-8
database) depend on the collation's character classification. Python's ``str.lower`` is not
glibc's ``towlower`` nor ICU's, so nothing is assumed: one query asks the server for the
lower, upper and initcap of every code point (surrogates excepted) and for which characters
``initcap`` treats as letters or digits, and pgdecode's functions use that table.

What a table of single code points can and cannot say, per provider (PostgreSQL's
pg_locale_libc.c, pg_locale_builtin.c, pg_locale_icu.c, formatting.c):

* libc (``C.UTF-8``, ``en_US.UTF-8``...): ``towlower``/``towupper`` one wide character at a
  time, ``initcap`` upper-casing after a character that is not ``iswalnum`` and lower-casing
  after one that is (tested on the converted character). Context-free: the table is exact.
* builtin (PostgreSQL 17+): ``C.UTF-8`` maps simply and context-free, ``initcap``
  title-cases the first character of each run of alphanumerics or non-alphanumerics.
  ``PG_UNICODE_FAST`` maps fully, with one context: a capital sigma lower-cases to a final
  sigma at the end of a word. A string with a capital sigma is then mapped by the server.
* ICU: full mappings (``ß`` upper-cases to ``SS``), context-free except for the conditions
  of Unicode's SpecialCasing (final sigma; Lithuanian dots; Turkish and Azeri dotted I) and
  ICU's Greek upper-casing for ``el``: strings with one of those characters are mapped by the
  server, through the catalog connection. ``initcap`` uses ICU's word break iterator
  (Unicode's UAX #29), which pgdecode does not reproduce: refused.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from plugin_framework.rowfilter.errors import NotSupportedError

# One row per code point whose case mapping is not the identity (i, lower, upper, initcap,
# a1, a2), then one row per change of the "alphanumeric" flag (i, NULL.., flag). a1 tells
# whether initcap treats the character before a trailing 'A' as alphanumeric (libc: the
# upper-cased character; builtin: the character itself), a2 the same after a leading 'A'
# (libc: the lower-cased character; builtin: the character itself).
_TABLE_SQL = """
WITH m AS MATERIALIZED (
  SELECT i, c COLLATE "C" AS cc, lower(c) COLLATE "C" AS lo, upper(c) COLLATE "C" AS up,
         initcap(c) COLLATE "C" AS ti,
         right(initcap(c || 'A'), 1) COLLATE "C" = 'a' AS a1,
         right(initcap('A' || c || 'A'), 1) COLLATE "C" = 'a' AS a2
  FROM (SELECT i, chr(i) {collate} AS c FROM generate_series(1, 1114111) i
        WHERE i < 55296 OR i > 57343) cp)
SELECT i, lo, up, ti, a1, a2 FROM m WHERE lo <> cc OR up <> cc OR ti <> up
UNION ALL
SELECT i, NULL, NULL, NULL, NULL, a2 FROM (
  SELECT i, a2, lag(a2) OVER (ORDER BY i) AS prev FROM m) r WHERE a2 IS DISTINCT FROM prev
"""

SIGMA = 0x3A3
# SpecialCasing.txt's conditional mappings for lt, tr and az (and the dot above they test).
_LT_TR_AZ = frozenset({0x49, 0x4A, 0xCC, 0xCD, 0x128, 0x12E, 0x130, 0x307})


def _greek(cp: int) -> bool:
    return 0x300 <= cp <= 0x3FF or 0x1F00 <= cp <= 0x1FFF or cp == 0x2126


ServerMap = Callable[[str, str], str]  # (function name, string) -> the server's result


@dataclass
class CaseMap:
    """One collation's case mapping, as the server does it."""

    provider: str  # c(libc), b(uiltin), i(cu)
    locale: str
    lower_map: dict[int, str] = field(default_factory=dict)
    upper_map: dict[int, str] = field(default_factory=dict)
    title_map: dict[int, str] = field(default_factory=dict)
    alnum_starts: list[int] = field(default_factory=list)
    alnum_flags: list[bool] = field(default_factory=list)
    alnum_exact: dict[int, bool] = field(default_factory=dict)
    # Characters in whose presence a string is mapped by the server (context-dependent).
    lower_context: Callable[[int], bool] | None = None
    upper_context: Callable[[int], bool] | None = None
    server: ServerMap | None = None

    # --- the table -----------------------------------------------------------------------------

    @classmethod
    def from_rows(cls, provider: str, locale: str,
                  rows: list[tuple[int, str | None, str | None, str | None, bool | None,
                                   bool]]) -> CaseMap:
        cm = cls(provider, locale)
        for i, lo, up, ti, a1, a2 in rows:
            if lo is None:
                cm.alnum_starts.append(i)
                cm.alnum_flags.append(bool(a2))
                continue
            assert up is not None and ti is not None
            c = chr(i)
            if lo != c:
                cm.lower_map[i] = lo
            if up != c:
                cm.upper_map[i] = up
            if ti != c:
                cm.title_map[i] = ti
            if provider == "c":  # libc: initcap tests the converted character
                if len(up) == 1:
                    cm.alnum_exact[ord(up)] = bool(a1)
                if len(lo) == 1:
                    cm.alnum_exact[ord(lo)] = bool(a2)
        pairs = sorted(zip(cm.alnum_starts, cm.alnum_flags, strict=True))
        cm.alnum_starts = [p[0] for p in pairs]
        cm.alnum_flags = [p[1] for p in pairs]
        cm._contexts()
        return cm

    def _contexts(self) -> None:
        lang = self.locale.replace("_", "-").split("-")[0].lower()
        if self.provider == "b" and self.locale == "PG_UNICODE_FAST":
            self.lower_context = SIGMA.__eq__
        elif self.provider == "i":
            if lang in ("lt", "tr", "az"):
                self.lower_context = lambda cp: cp == SIGMA or cp in _LT_TR_AZ
            else:
                self.lower_context = SIGMA.__eq__
            if lang == "lt":
                self.upper_context = (0x307).__eq__
            elif lang == "el":
                self.upper_context = _greek

    def bind(self, server: ServerMap | None) -> CaseMap:
        """This table, asking ``server`` for the strings that depend on their context."""
        return replace(self, server=server)

    def isalnum(self, cp: int) -> bool:
        """Whether initcap treats the character as a letter or digit."""
        exact = self.alnum_exact.get(cp)
        if exact is not None:
            return exact
        k = bisect.bisect_right(self.alnum_starts, cp) - 1
        return self.alnum_flags[k] if k >= 0 else False

    # --- the functions -------------------------------------------------------------------------

    def _needs_server(self, s: str, context: Callable[[int], bool] | None) -> bool:
        return context is not None and not s.isascii() and any(context(ord(ch)) for ch in s)

    def _ask(self, function: str, s: str) -> str:
        if self.server is None:
            raise NotSupportedError(f"{function}() of this string depends on its context and "
                                    "needs the server, which is not connected")
        return self.server(function, s)

    def lower(self, s: str) -> str:
        if self._needs_server(s, self.lower_context):
            return self._ask("lower", s)
        return s.translate(self.lower_map)

    def upper(self, s: str) -> str:
        if self._needs_server(s, self.upper_context):
            return self._ask("upper", s)
        return s.translate(self.upper_map)

    def check_initcap(self) -> None:
        if self.provider == "i":
            raise NotSupportedError(
                f'initcap() under the ICU collation "{self.locale}" is not supported by '
                "pgdecode's row filters",
                detail="ICU finds word boundaries with its break iterator (Unicode's UAX "
                       "#29), which pgdecode does not reproduce exactly.",
                hint='Use COLLATE "C" or a libc collation, or upper()/lower().')

    def initcap(self, s: str) -> str:
        if self.provider == "c":
            out = []
            was_alnum = False
            lmap, umap = self.lower_map, self.upper_map
            for ch in s:
                cp = ord(ch)
                conv = lmap.get(cp, ch) if was_alnum else umap.get(cp, ch)
                out.append(conv)
                was_alnum = self.isalnum(ord(conv))
            return "".join(out)
        self.check_initcap()
        if self._needs_server(s, self.lower_context):
            return self._ask("initcap", s)
        out = []
        prev: bool | None = None
        for ch in s:
            cp = ord(ch)
            alnum = self.isalnum(cp)
            if prev is None or alnum != prev:
                out.append(self.title_map.get(cp, ch))
            else:
                out.append(self.lower_map.get(cp, ch))
            prev = alnum
        return "".join(out)


# --- loading and caching -------------------------------------------------------------------------

_CACHE: dict[tuple[object, ...], CaseMap] = {}


def table_query(collate_clause: str) -> str:
    """The one query that reads a collation's case mapping (``collate_clause``: empty for
    the database's default collation, else ``COLLATE schema."name"``)."""
    return _TABLE_SQL.format(collate=collate_clause)


# The same table, read a chunk of code points at a time: each function runs once per chunk on
# the code points joined by line feeds, not once per code point (which takes ICU half a
# minute on PostgreSQL 15). A line feed isolates each code point as the one-character
# strings of _TABLE_SQL do: it is not alphanumeric (libc's initcap starts a word after it),
# UAX #29 breaks words at it (ICU's initcap), and neither Unicode's casing contexts nor
# ICU's Greek upper-casing look across it. Not for builtin collations: their initcap
# title-cases a run of non-alphanumerics only at its start.
# tests/rowfilter/test_rowfilter_collation.py holds the two equal.
CHUNK = 16384
_CHUNK_SQL = """
SELECT k, lower(s {collate}) COLLATE "C", upper(s {collate}) COLLATE "C",
       initcap(s {collate}) COLLATE "C", initcap(sa {collate}) COLLATE "C",
       initcap(asa {collate}) COLLATE "C"
FROM (SELECT i / {chunk} AS k, string_agg(chr(i), E'\\n' ORDER BY i) AS s,
             string_agg(chr(i) || 'A', E'\\n' ORDER BY i) AS sa,
             string_agg('A' || chr(i) || 'A', E'\\n' ORDER BY i) AS asa
      FROM generate_series(1, 1114111) i WHERE (i < 55296 OR i > 57343) AND i <> 10
      GROUP BY 1) c
UNION ALL
SELECT -1, lower(E'\\n' {collate}) COLLATE "C", upper(E'\\n' {collate}) COLLATE "C",
       initcap(E'\\n' {collate}) COLLATE "C", initcap(E'\\nA' {collate}) COLLATE "C",
       initcap(E'A\\nA' {collate}) COLLATE "C"
ORDER BY 1
"""


def chunked_query(collate_clause: str) -> str:
    """The query of ``table_rows``: one row per chunk of code points, and one for U+000A."""
    return _CHUNK_SQL.format(collate=collate_clause, chunk=CHUNK)


def table_rows(chunks: list[tuple[int, str, str, str, str, str]]) -> list[
        tuple[int, str | None, str | None, str | None, bool | None, bool]]:
    """``chunked_query``'s answer as the rows of ``table_query``, which CaseMap.from_rows
    reads."""
    mapped: list[tuple[int, str | None, str | None, str | None, bool | None, bool]] = []
    flags: list[tuple[int, bool]] = []
    for k, lows, ups, titles, after, around in chunks:
        if k < 0:
            points = [10]
            columns = [[lows], [ups], [titles], [after], [around]]
        else:
            points = [i for i in range(max(k * CHUNK, 1), (k + 1) * CHUNK)
                      if i <= 1114111 and not 55296 <= i <= 57343 and i != 10]
            columns = [v.split("\n") for v in (lows, ups, titles, after, around)]
        if any(len(c) != len(points) for c in columns):
            raise ValueError(f"the case mapping of code points {points[0]}..{points[-1]} "
                             "does not split at line feeds")
        for i, lo, up, ti, a1, a2 in zip(points, *columns, strict=True):
            alnum_before, alnum_after = a1[-1:] == "a", a2[-1:] == "a"
            c = chr(i)
            if lo != c or up != c or ti != up:
                mapped.append((i, lo, up, ti, alnum_before, alnum_after))
            flags.append((i, alnum_after))
    flags.sort()
    previous: bool | None = None
    for i, flag in flags:
        if flag is not previous:
            mapped.append((i, None, None, None, None, flag))
            previous = flag
    return mapped


def cached(key: tuple[object, ...], load: Callable[[], CaseMap]) -> CaseMap:
    """The case map for ``key`` (server version and start, provider, locale, collation
    version), loaded once per process."""
    cm = _CACHE.get(key)
    if cm is None:
        cm = _CACHE[key] = load()
    return cm
