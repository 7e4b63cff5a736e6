"""Analyzed row-filter expressions: the node kinds PostgreSQL's parse analysis produces for a
publication WHERE clause (primnodes.h), with the types, operators and functions resolved.

The validity check (check_simple_rowfilter_expr_walker) and the compiler work on these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plugin_framework.pgtypes.oids import BOOL
from plugin_framework.rowfilter.pgcatalog import OperInfo, ProcInfo


@dataclass(eq=False)
class Expr:
    """An analyzed expression node: its result type, typmod and collation."""

    rtype: int
    typmod: int = field(default=-1, kw_only=True)
    collation: int = field(default=0, kw_only=True)  # exprCollation
    input_collation: int = field(default=0, kw_only=True)  # exprInputCollation
    location: int = field(default=-1, kw_only=True)  # offset in the filter's text

    tag = "Expr"  # PostgreSQL's node tag

    def children(self) -> list[Expr]:
        return []

    def functions(self) -> list[ProcInfo]:
        """The functions check_functions_in_node looks at for this node."""
        return []


@dataclass(eq=False)
class Var(Expr):
    name: str = ""
    attnum: int = 0  # negative: a system column
    tag = "Var"


@dataclass(eq=False)
class Const(Expr):
    value: Any = None  # None: SQL NULL
    text: str | None = None  # the literal's text while its type is unknown
    tag = "Const"


@dataclass(eq=False)
class OpExpr(Expr):
    op: OperInfo | None = None
    proc: ProcInfo | None = None
    args: list[Expr] = field(default_factory=list)
    tag = "OpExpr"  # or DistinctExpr, NullIfExpr

    def children(self) -> list[Expr]:
        return self.args

    def functions(self) -> list[ProcInfo]:
        return [self.proc] if self.proc is not None else []


@dataclass(eq=False)
class DistinctExpr(OpExpr):
    tag = "DistinctExpr"


@dataclass(eq=False)
class NullIfExpr(OpExpr):
    tag = "NullIfExpr"


@dataclass(eq=False)
class ScalarArrayOpExpr(OpExpr):
    use_or: bool = True
    tag = "ScalarArrayOpExpr"


@dataclass(eq=False)
class FuncExpr(Expr):
    proc: ProcInfo | None = None
    args: list[Expr] = field(default_factory=list)
    fmt: str = "call"  # call, implicit (cast), explicit (cast)
    tag = "FuncExpr"

    def children(self) -> list[Expr]:
        return self.args

    def functions(self) -> list[ProcInfo]:
        return [self.proc] if self.proc is not None else []


@dataclass(eq=False)
class BoolExpr(Expr):
    boolop: str = "and"  # and, or, not
    args: list[Expr] = field(default_factory=list)
    tag = "BoolExpr"

    def children(self) -> list[Expr]:
        return self.args


@dataclass(eq=False)
class NullTest(Expr):
    arg: Expr | None = None
    is_null: bool = True
    tag = "NullTest"

    def children(self) -> list[Expr]:
        return [self.arg] if self.arg is not None else []


@dataclass(eq=False)
class BooleanTest(Expr):
    arg: Expr | None = None
    test: str = "IS_TRUE"  # IS_TRUE, IS_NOT_TRUE, IS_FALSE, IS_NOT_FALSE, IS_UNKNOWN...
    tag = "BooleanTest"

    def children(self) -> list[Expr]:
        return [self.arg] if self.arg is not None else []


@dataclass(eq=False)
class CaseTestExpr(Expr):
    tag = "CaseTestExpr"


@dataclass(eq=False)
class CaseExpr(Expr):
    arg: Expr | None = None
    placeholder: CaseTestExpr | None = None
    whens: list[tuple[Expr, Expr]] = field(default_factory=list)
    default: Expr | None = None
    tag = "CaseExpr"

    def children(self) -> list[Expr]:
        out: list[Expr] = [self.arg] if self.arg is not None else []
        for cond, result in self.whens:
            out += [cond, result]
        if self.default is not None:
            out.append(self.default)
        return out


@dataclass(eq=False)
class CoalesceExpr(Expr):
    args: list[Expr] = field(default_factory=list)
    tag = "CoalesceExpr"

    def children(self) -> list[Expr]:
        return self.args


@dataclass(eq=False)
class MinMaxExpr(Expr):
    greatest: bool = True
    args: list[Expr] = field(default_factory=list)
    compare: ProcInfo | None = None  # the type's "<" (not checked: PostgreSQL uses btree)
    tag = "MinMaxExpr"

    def children(self) -> list[Expr]:
        return self.args


@dataclass(eq=False)
class RelabelType(Expr):
    arg: Expr | None = None
    tag = "RelabelType"

    def children(self) -> list[Expr]:
        return [self.arg] if self.arg is not None else []


@dataclass(eq=False)
class CollateExpr(Expr):
    arg: Expr | None = None
    tag = "CollateExpr"

    def children(self) -> list[Expr]:
        return [self.arg] if self.arg is not None else []


@dataclass(eq=False)
class CoerceViaIO(Expr):
    """An I/O conversion cast (e.g. integer to text): refused in row filters."""

    arg: Expr | None = None
    io_procs: list[ProcInfo] = field(default_factory=list)
    tag = "CoerceViaIO"

    def children(self) -> list[Expr]:
        return [self.arg] if self.arg is not None else []

    def functions(self) -> list[ProcInfo]:
        return self.io_procs


@dataclass(eq=False)
class ArrayCoerceExpr(Expr):
    """An element-wise array cast (e.g. varchar[] to text[]): refused in row filters."""

    arg: Expr | None = None
    tag = "ArrayCoerceExpr"

    def children(self) -> list[Expr]:
        return [self.arg] if self.arg is not None else []


@dataclass(eq=False)
class ArrayExpr(Expr):
    elements: list[Expr] = field(default_factory=list)
    element_type: int = 0
    tag = "ArrayExpr"

    def children(self) -> list[Expr]:
        return self.elements


@dataclass(eq=False)
class RowExpr(Expr):
    args: list[Expr] = field(default_factory=list)
    tag = "RowExpr"

    def children(self) -> list[Expr]:
        return self.args


@dataclass(eq=False)
class OtherExpr(Expr):
    """A node kind no row filter may contain (sublink, SQL value function, subscript...)."""

    what: str = ""
    tag = "Other"


def walk(node: Expr) -> list[Expr]:
    """The node and all its descendants, in pre-order (expression_tree_walker's order)."""
    out = [node]
    for child in node.children():
        out += walk(child)
    return out


def is_bool(node: Expr) -> bool:
    return node.rtype == BOOL
