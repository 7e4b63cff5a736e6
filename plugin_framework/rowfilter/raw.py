"""Row filters decided on raw row changes: the programs of the C module
``native/_rawfilter.c``, compiled from the same analyzed expressions as evaluate.py's
``Compiler``, for the expressions C evaluates as the Python closures do.

That is integers (smallint, integer, bigint: columns, constants, comparisons, + - * / %, the
casts between them), booleans (columns, constants, comparisons), text equality (columns and
constants of text and varchar; ``=`` and ``<>`` under a deterministic collation compare bytes,
which evaluate.py checked when it compiled the same expression), IS [NOT] DISTINCT FROM over
those, AND, OR, NOT, IS [NOT] NULL and the boolean tests. A filter with anything else has no
program, and its relation's changes are decoded and filtered in Python.

``PublicationFilters`` builds a relation's ``RawFilter`` beside its Python predicates
(publication.py); the pipeline asks it before decoding a change (docs/row-filters.md,
"Performance"). tests/rowfilter/test_rowfilter_raw.py holds the verdicts to ``filter_change``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plugin_framework.rowfilter.nodes as n
from plugin_framework._native import load_native
from plugin_framework.pgtypes.oids import BOOL, INT2, INT4, INT8, TEXT, UNKNOWN, VARCHAR

if TYPE_CHECKING:
    from plugin_framework.rowfilter.native import _rawfilter
else:
    _rawfilter = load_native("plugin_framework.rowfilter.native._rawfilter")

__all__ = ["RAW_FILTER_BUILT", "RawFilter", "raw_filter"]

RAW_FILTER_BUILT = _rawfilter is not None
RawFilter = Any  # _rawfilter.RawFilter: verdict(data) -> DROP, PASS or UNSURE
Node = tuple[int, int, int, int, bytes]

_SIZES = {INT2: 2, INT4: 4, INT8: 8}
MAX_NODES = 4096  # what _rawfilter.c takes; a longer filter is evaluated in Python
_TEXTS = {TEXT, VARCHAR}


class _Unsupported(Exception):
    """An expression the C evaluator does not mirror."""


def _ops() -> dict[str, int]:
    return {} if _rawfilter is None else {
        name: getattr(_rawfilter, name) for name in (
            "VAR_INT", "VAR_BOOL", "VAR_TEXT", "CONST_INT", "CONST_BOOL", "CONST_TEXT",
            "CONST_NULL", "ADD", "SUB", "MUL", "DIV", "MOD", "CAST", "EQ", "NE", "LT", "LE",
            "GT", "GE", "TEXT_EQ", "TEXT_NE", "DISTINCT", "AND", "OR", "NOT", "IS_NULL",
            "IS_NOT_NULL", "IS_TRUE", "IS_NOT_TRUE", "IS_FALSE", "IS_NOT_FALSE")}


OPS = _ops()
_INT_PREFIXES = ("int2", "int4", "int8", "int24", "int42", "int28", "int82", "int48", "int84")
_CMP = ("eq", "ne", "lt", "le", "gt", "ge")
# C symbols (pg_proc.prosrc, ProcInfo.key) -> (node, whether it compares text)
_BINARY: dict[str, str] = {
    **{p + s: s.upper() for p in (*_INT_PREFIXES, "bool") for s in _CMP},
    **{p + s: op for p in _INT_PREFIXES
       for s, op in (("pl", "ADD"), ("mi", "SUB"), ("mul", "MUL"), ("div", "DIV"))},
    "int2mod": "MOD", "int4mod": "MOD", "int8mod": "MOD",
    "texteq": "TEXT_EQ", "textne": "TEXT_NE",
}
_CASTS = {"i4toi2", "i2toi4", "int28", "int82", "int48", "int84"}
_TESTS = {"IS_TRUE": "IS_TRUE", "IS_NOT_TRUE": "IS_NOT_TRUE", "IS_FALSE": "IS_FALSE",
          "IS_NOT_FALSE": "IS_NOT_FALSE", "IS_UNKNOWN": "IS_NULL",
          "IS_NOT_UNKNOWN": "IS_NOT_NULL"}


class _Program:
    """Nodes in evaluation order: every node's arguments before it, the root last."""

    def __init__(self, positions: Mapping[str, int]) -> None:
        self.positions = positions
        self.nodes: list[Node] = []

    def add(self, op: str, a: int = -1, b: int = -1, value: int = 0,
            text: bytes = b"") -> int:
        self.nodes.append((OPS[op], a, b, value, text))
        return len(self.nodes) - 1

    def compile(self, node: n.Expr) -> int:
        method = getattr(self, f"c_{type(node).__name__}", None)
        if method is None:
            raise _Unsupported(node.tag)
        index: int = method(node)
        return index

    def c_Var(self, node: n.Var) -> int:
        i = self.positions.get(node.name)
        if i is None:
            raise _Unsupported("a column the stream does not describe")
        if node.rtype in _SIZES:
            return self.add("VAR_INT", i)
        if node.rtype == BOOL:
            return self.add("VAR_BOOL", i)
        if node.rtype in _TEXTS:
            return self.add("VAR_TEXT", i)
        raise _Unsupported(f"a column of type {node.rtype}")

    def c_Const(self, node: n.Const) -> int:
        value = node.value
        if value is None and node.text is not None:
            value = node.text  # an unknown-type literal (text)
        if value is None:
            return self.add("CONST_NULL")
        if node.rtype == BOOL and isinstance(value, bool):
            return self.add("CONST_BOOL", value=int(value))
        if node.rtype in _SIZES and type(value) is int:
            return self.add("CONST_INT", value=value)
        if (node.rtype in _TEXTS or node.rtype == UNKNOWN) and isinstance(value, str):
            return self.add("CONST_TEXT", text=value.encode())
        raise _Unsupported(f"a constant of type {node.rtype}")

    def c_RelabelType(self, node: n.RelabelType) -> int:
        assert node.arg is not None
        return self.compile(node.arg)

    c_CollateExpr = c_RelabelType  # text equality: decided by determinism, checked already

    def _call(self, node: n.OpExpr | n.FuncExpr) -> int:
        key = node.proc.key if node.proc is not None else ""
        args = [self.compile(a) for a in node.args]
        if key in _CASTS and len(args) == 1:
            return self.add("CAST", args[0], value=self._size(node))
        op = _BINARY.get(key)
        if op is None or len(args) != 2:
            raise _Unsupported(f"function {key}")
        size = self._size(node) if op in ("ADD", "SUB", "MUL", "DIV", "MOD") else 0
        return self.add(op, args[0], args[1], value=size)

    @staticmethod
    def _size(node: n.Expr) -> int:
        size = _SIZES.get(node.rtype)
        if size is None:
            raise _Unsupported(f"a result of type {node.rtype}")
        return size

    def c_OpExpr(self, node: n.OpExpr) -> int:
        return self._call(node)

    def c_FuncExpr(self, node: n.FuncExpr) -> int:
        return self._call(node)

    def c_DistinctExpr(self, node: n.DistinctExpr) -> int:
        op = _BINARY.get(node.proc.key if node.proc is not None else "")
        if op not in ("EQ", "TEXT_EQ") or len(node.args) != 2:
            raise _Unsupported("IS DISTINCT FROM of this type")
        a, b = (self.compile(x) for x in node.args)
        return self.add("DISTINCT", a, b, value=int(op == "TEXT_EQ"))

    def c_BoolExpr(self, node: n.BoolExpr) -> int:
        args = [self.compile(x) for x in node.args]
        if node.boolop == "not":
            (a,) = args
            return self.add("NOT", a)
        op = "OR" if node.boolop == "or" else "AND"
        out = args[0]
        for b in args[1:]:  # in order: a AND b AND c evaluates as (a AND b) AND c
            out = self.add(op, out, b)
        return out

    def c_NullTest(self, node: n.NullTest) -> int:
        assert node.arg is not None
        return self.add("IS_NULL" if node.is_null else "IS_NOT_NULL", self.compile(node.arg))

    def c_BooleanTest(self, node: n.BooleanTest) -> int:
        assert node.arg is not None
        return self.add(_TESTS[node.test], self.compile(node.arg))


def raw_program(tree: n.Expr, positions: Mapping[str, int]) -> tuple[Node, ...] | None:
    """A filter's C program for a relation's column positions, or None when C does not
    evaluate it."""
    if _rawfilter is None:
        return None
    program = _Program(positions)
    try:
        program.compile(tree)
    except (_Unsupported, RecursionError, UnicodeEncodeError):
        return None  # the Python evaluator takes it (it raises what is wrong with it)
    if len(program.nodes) > MAX_NODES:
        return None
    return tuple(program.nodes)


def raw_filter(relid: int, ncols: int, actions: Sequence[str],
               programs: Mapping[str, Sequence[tuple[Node, ...]] | None]) -> RawFilter | None:
    """A relation's ``RawFilter``: ``actions`` those published, ``programs`` per action its
    ORed filters' programs (None: no filter). None without the C module."""
    if _rawfilter is None:
        return None
    bits = sum(1 << i for i, a in enumerate(("insert", "update", "delete")) if a in actions)
    return _rawfilter.RawFilter(relid, ncols, bits, tuple(
        None if programs.get(a) is None else tuple(programs[a] or ())
        for a in ("insert", "update", "delete")))
