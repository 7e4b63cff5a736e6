"""How a relation's rows print as test_decoding prints them (tuple_to_stringinfo), computed once
per Relation message, and the name of a type that is not built in, from the stream."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import compress
from typing import Any, Final

from plugin_framework import Column, Relation
from plugin_framework.framework import KIND_NULL, KIND_TEXT, KIND_UNCHANGED_TOAST, TupleData
from plugin_framework.pgtypes import VERSIONED_KEYWORDS, oids, quote_identifier

# --- relations ----------------------------------------------------------------------------------

# How print_literal prints a column's text, by its type OID (the column's own type: a domain
# over integer is quoted, as in C).
QUOTED, BARE, BOOL, BIT = 0, 1, 2, 3
_STYLES: Final[dict[int, int]] = {
    oids.INT2: BARE, oids.INT4: BARE, oids.INT8: BARE, oids.OID: BARE,
    oids.FLOAT4: BARE, oids.FLOAT8: BARE, oids.NUMERIC: BARE,
    oids.BIT: BIT, oids.VARBIT: BIT,
    oids.BOOL: BOOL,
}


_IDENT = r'(?:"(?:[^"]|"")*"|[^".]+)'
_QUALIFIED = re.compile(rf"(?:({_IDENT})\.)?({_IDENT})")


def _unquote(ident: str) -> str:
    return ident[1:-1].replace('""', '"') if ident.startswith('"') else ident


class RelationText:
    """What a relation's lines are made of, computed once per Relation message.

    A row is printed through a ``bytes %`` template made for its pattern of column kinds
    (which columns are null or unchanged TOAST): the headers, the quotes and the null and
    unchanged-toast-datum texts are in the template, only the values are filled in. The
    ``'`` of quoted values are doubled; one test finds whether any value holds one (none
    can hold a NUL), since they rarely do.
    """

    __slots__ = ("columns", "delete", "fast", "insert", "key_patterns", "patterns", "relation",
                 "tuple_columns", "update")

    def __init__(self, relation: Relation, type_names: list[str],
                 quote: Callable[[str], str] = quote_identifier) -> None:
        self.relation = relation
        self.columns = relation.columns
        table = ("table " + quote(relation.namespace) + "." + quote(relation.name)
                 + ":").encode()
        self.insert = table + b" INSERT:"
        self.update = table + b" UPDATE:"
        self.delete = table + b" DELETE:"
        cols = []
        for column, type_name in zip(relation.columns, type_names, strict=True):
            bare = f" {quote(column.name)}[{type_name}]:".encode()
            style = _STYLES.get(column.type_oid, QUOTED)
            head = bare + (b"'" if style == QUOTED else b"B'" if style == BIT else b"")
            cols.append((style, head, bare))
        # (style, header with the value's opening, bare header for null / unchanged TOAST)
        self.tuple_columns: tuple[tuple[int, bytes, bytes], ...] = tuple(cols)
        self.patterns: dict[bytes, _Pattern | None] = {}  # new tuples: nulls printed
        self.key_patterns: dict[bytes, _Pattern | None] = {}  # old tuples: nulls skipped
        # the C formatter made from all this (emitters.text.fast), once it is asked for
        self.fast: Any = None

    def append(self, out: bytearray, data: TupleData, skip_nulls: bool) -> None:
        """tuple_to_stringinfo over pgoutput's raw column texts."""
        patterns = self.key_patterns if skip_nulls else self.patterns
        kinds = data.kinds
        try:
            pattern = patterns[kinds]
        except KeyError:
            pattern = _Pattern.make(self.tuple_columns, kinds, skip_nulls)
            if len(patterns) < _MAX_PATTERNS:
                patterns[kinds] = pattern
        if pattern is None:  # binary values or a column count that does not match
            append_tuple(out, self.tuple_columns, data, skip_nulls)
            return
        values: Any = data.values
        if pattern.mask is not None:
            values = tuple(compress(values, pattern.mask))
        if pattern.bools:
            values = list(values)
            for i in pattern.bools:
                values[i] = b"true" if values[i] == b"t" else b"false"
            values = tuple(values)
        if b"'" in b"\0".join(values):
            values = tuple(v.replace(b"'", b"''") if quoted else v
                           for v, quoted in zip(values, pattern.quoted, strict=True))
        out += pattern.template % values


_MAX_PATTERNS: Final = 256  # kinds patterns cached per relation; beyond, the slow loop


class _Pattern:
    """The template for one pattern of column kinds."""

    __slots__ = ("bools", "mask", "quoted", "template")

    def __init__(self, template: bytes, mask: tuple[bool, ...] | None,
                 bools: tuple[int, ...], quoted: tuple[bool, ...]) -> None:
        self.template = template
        self.mask = mask  # which columns have a value; None: all of them
        self.bools = bools  # positions, among the values, of booleans
        self.quoted = quoted  # per value: whether it is quoted (its ' doubled)

    @classmethod
    def make(cls, columns: tuple[tuple[int, bytes, bytes], ...], kinds: bytes,
             skip_nulls: bool) -> _Pattern | None:
        if len(kinds) != len(columns):
            return None
        parts: list[bytes] = []
        mask: list[bool] = []
        bools: list[int] = []
        quoted: list[bool] = []
        for kind, (style, head, bare) in zip(kinds, columns, strict=True):
            if kind == KIND_TEXT:
                if style == BOOL:
                    bools.append(sum(mask))
                mask.append(True)
                quoted.append(style == QUOTED)
                closing = b"'" if style == QUOTED or style == BIT else b""
                parts.append(head.replace(b"%", b"%%") + b"%s" + closing)
                continue
            mask.append(False)
            if kind == KIND_NULL:
                if not skip_nulls:
                    parts.append(bare.replace(b"%", b"%%") + b"null")
            elif kind == KIND_UNCHANGED_TOAST:
                parts.append(bare.replace(b"%", b"%%") + b"unchanged-toast-datum")
            else:
                return None
        return cls(b"".join(parts), None if all(mask) else tuple(mask), tuple(bools),
                   tuple(quoted))


def append_tuple(out: bytearray, columns: tuple[tuple[int, bytes, bytes], ...],
                  data: TupleData, skip_nulls: bool) -> None:
    """tuple_to_stringinfo column by column: for what has no template."""
    for kind, value, (style, head, bare) in zip(data.kinds, data.values, columns, strict=True):
        if kind == KIND_TEXT:
            out += head
            if style == QUOTED:
                out += value.replace(b"'", b"''")  # type: ignore[union-attr]
                out += b"'"
            elif style == BARE:
                out += value  # type: ignore[arg-type]
            elif style == BOOL:
                out += b"true" if value == b"t" else b"false"
            else:
                out += value  # type: ignore[arg-type]
                out += b"'"
        elif kind == KIND_NULL:
            if not skip_nulls:
                out += bare
                out += b"null"
        elif kind == KIND_UNCHANGED_TOAST:
            out += bare
            out += b"unchanged-toast-datum"
        else:
            raise ValueError(
                "the text emitter prints the server's text output of values: start pgoutput "
                "with binary = false"
            )


def type_name_from_stream(column: Column, quote: Callable[[str], str]) -> str:
    """A non-built-in type's name as pgoutput's Type message gave it (Column.type_name,
    format_type with the typmod), without typmod, ``_name`` read as the array ``name[]``,
    and its identifiers quoted by ``quote`` (Column.type_name quotes as the newest release
    does)."""
    name = column.type_name
    suffix = f"({column.type_modifier})"
    if column.type_modifier >= 0 and name.endswith(suffix):
        name = name[: -len(suffix)]
    match = _QUALIFIED.fullmatch(name)
    if match is None:
        return name
    namespace, ident = match.groups()
    if namespace:
        namespace = _requote(namespace, quote)
    plain = _unquote(ident)
    if len(plain) > 1 and plain.startswith("_"):
        element = quote(plain[1:]) + "[]"
        return f"{namespace}.{element}" if namespace else element
    ident = _requote(ident, quote)
    return f"{namespace}.{ident}" if namespace else ident


def _requote(ident: str, quote: Callable[[str], str]) -> str:
    """A quoted identifier whose quoting depends on the release, quoted again by ``quote``.
    Only quoted ones: a bare ``json`` is the built-in type's name, which is never quoted."""
    if ident.startswith('"'):
        plain = _unquote(ident)
        if plain in VERSIONED_KEYWORDS:
            return quote(plain)
    return ident
