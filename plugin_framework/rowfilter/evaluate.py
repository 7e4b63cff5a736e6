"""Compile an analyzed row filter into Python closures over column positions, once per
relation: evaluating a row walks no tree, reads only the columns the filter uses, and follows
the executor's rules (strict functions return NULL on NULL input, AND/OR/CASE/COALESCE stop
as soon as the result is known, three-valued logic).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import plugin_framework.rowfilter.nodes as n
from plugin_framework.pgtypes.oids import FLOAT4, INTERVAL
from plugin_framework.rowfilter.errors import (
    EvaluationError,
    NotSupportedError,
    RowFilterError,
)
from plugin_framework.rowfilter.functions import IMPLS, Ctx, to_float4
from plugin_framework.rowfilter.pgcatalog import ProcInfo, TypeCatalog

Getter = Callable[[int], Any]  # column position -> value (None for NULL)

# psycopg reads an interval as a timedelta with 365-day years; PostgreSQL compares intervals
# with 30-day months and 360-day years.
UNSUPPORTED_TYPES = {INTERVAL: "interval"}
Compiled = Callable[[Getter], Any]


class Compiler:
    """Compiles one filter for one relation (its column positions)."""

    def __init__(self, catalog: TypeCatalog, positions: Mapping[str, int]) -> None:
        self.cat = catalog
        self.positions = positions
        self.used: set[int] = set()  # column positions the filter reads
        self._boxes: dict[int, list[Any]] = {}  # CaseTestExpr placeholder -> value cell
        self._known_cases: set[int] = set()  # placeholders of a CASE with a constant arg
        self._folded: dict[int, bool] = {}  # node -> compiled into a constant

    def compile(self, node: n.Expr) -> Compiled:
        """Compile a node. Constant sub-expressions are evaluated now, as the planner's
        eval_const_expressions does when the server prepares the filter: a node whose
        (simplified) arguments are all constant becomes a constant, so an error such as a
        division by zero in a constant part is raised when the filter is first used, not
        only when a row reaches it."""
        if node.rtype in UNSUPPORTED_TYPES:
            raise NotSupportedError(
                f"{UNSUPPORTED_TYPES[node.rtype]} values are not supported by pgdecode's row "
                "filters")
        method: Callable[[Any], Compiled] = getattr(self, f"c_{type(node).__name__}", None) \
            or self.unsupported
        compiled = method(node)
        if not (getattr(compiled, "constant", False)
                or isinstance(node, (n.Var, n.CaseTestExpr, n.CaseExpr, n.CoalesceExpr,
                                     n.BoolExpr))
                or not all(self._folded.get(id(c), False) for c in node.children())):
            compiled = _const(compiled(_no_columns))
        self._folded[id(node)] = bool(getattr(compiled, "constant", False))
        return compiled

    def unsupported(self, node: n.Expr) -> Compiled:
        raise NotSupportedError(f"{node.tag} expressions are not supported by pgdecode's row "
                                "filters")

    def impl(self, proc: ProcInfo, node: n.Expr, args: list[n.Expr]) -> Callable[..., Any]:
        factory = IMPLS.get(proc.key)
        if factory is None:
            argtypes = ", ".join(self.cat.type_name(a.rtype) for a in args)
            raise NotSupportedError(
                f"function {proc.name}({argtypes}) is not supported by pgdecode's row filters"
                f" (its implementation {proc.key!r} is not ported)")
        if not proc.strict:
            raise NotSupportedError(f"non-strict function {proc.name} is not supported by "
                                    "pgdecode's row filters")
        collation = self.cat.collation(node.input_collation) if node.input_collation else None
        return factory(Ctx(proc, [a.rtype for a in args], node.rtype, collation,
                           self.cat.casemap))

    # --- leaves --------------------------------------------------------------------------------

    def c_Var(self, node: n.Var) -> Compiled:
        try:
            i = self.positions[node.name]
        except KeyError:
            raise RowFilterError(f'column "{node.name}" used in the row filter is not in the '
                                 "stream's description of the table") from None
        self.used.add(i)
        if node.rtype == FLOAT4:  # psycopg loads real as a double: round it as stored
            def real(g: Getter) -> Any:
                v = g(i)
                return None if v is None else to_float4(v)
            return real
        return lambda g: g(i)

    def c_Const(self, node: n.Const) -> Compiled:
        value = node.value
        if value is None and node.text is not None:
            value = node.text  # an unknown-type literal (text)
        return _const(value)

    def c_CaseTestExpr(self, node: n.CaseTestExpr) -> Compiled:
        box = self._boxes.setdefault(id(node), [None])
        if id(node) in self._known_cases:
            return _const(box[0])
        return lambda g: box[0]

    # --- functions and operators ---------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], args: list[Compiled]) -> Compiled:
        """A strict function: every argument is evaluated (as the executor does), then NULL
        if one of them is NULL."""
        if len(args) == 1:
            (a,) = args

            def call1(g: Getter) -> Any:
                x = a(g)
                return None if x is None else fn(x)
            return call1
        if len(args) == 2:
            a, b = args

            def call2(g: Getter) -> Any:
                x = a(g)
                y = b(g)
                return None if x is None or y is None else fn(x, y)
            return call2

        def calln(g: Getter) -> Any:
            values = [arg(g) for arg in args]
            if any(v is None for v in values):
                return None
            return fn(*values)
        return calln

    def _strict_call(self, proc: ProcInfo, node: n.Expr, args: list[n.Expr]) -> Compiled:
        fn = self.impl(proc, node, args)
        compiled = [self.compile(a) for a in args]
        # The planner replaces a strict function with a NULL argument by NULL, without
        # evaluating the other arguments (simplify_function).
        if any(_is_null_const(c) for c in compiled):
            return _const(None)
        return self._call(fn, compiled)

    def c_FuncExpr(self, node: n.FuncExpr) -> Compiled:
        assert node.proc is not None
        return self._strict_call(node.proc, node, node.args)

    def c_OpExpr(self, node: n.OpExpr) -> Compiled:
        assert node.proc is not None
        return self._strict_call(node.proc, node, node.args)

    def c_DistinctExpr(self, node: n.DistinctExpr) -> Compiled:
        assert node.proc is not None
        eq = self.impl(node.proc, node, node.args)
        a, b = (self.compile(x) for x in node.args)

        def distinct(g: Getter) -> Any:
            x, y = a(g), b(g)
            if x is None or y is None:
                return (x is None) != (y is None)
            r = eq(x, y)
            return None if r is None else not r
        return distinct

    def c_NullIfExpr(self, node: n.NullIfExpr) -> Compiled:
        assert node.proc is not None
        eq = self.impl(node.proc, node, node.args)
        a, b = (self.compile(x) for x in node.args)
        # The planner replaces NULLIF with a NULL constant argument by its first argument,
        # without evaluating the other one (eval_const_expressions: they cannot be equal).
        if _is_null_const(a) or _is_null_const(b):
            return a

        def nullif(g: Getter) -> Any:
            x = a(g)
            y = b(g)
            if x is None:
                return None
            if y is not None and eq(x, y):
                return None
            return x
        return nullif

    def c_ScalarArrayOpExpr(self, node: n.ScalarArrayOpExpr) -> Compiled:
        assert node.proc is not None
        op = self.impl(node.proc, node, node.args)
        a, arr = (self.compile(x) for x in node.args)
        use_or = node.use_or

        def any_all(g: Getter) -> Any:
            x = a(g)
            items = arr(g)
            if items is None:
                return None
            items = _flatten(items)
            if not items:
                return not use_or
            if x is None:
                return None
            saw_null = False
            for item in items:
                r = None if item is None else op(x, item)
                if r is None:
                    saw_null = True
                elif r == use_or:
                    return use_or
            return None if saw_null else not use_or
        return any_all

    # --- logic ---------------------------------------------------------------------------------

    def c_BoolExpr(self, node: n.BoolExpr) -> Compiled:
        if node.boolop == "not":
            (a,) = [self.compile(x) for x in node.args]
            if getattr(a, "constant", False):
                v = a(_no_columns)
                return _const(None if v is None else not v)

            def not_(g: Getter) -> Any:
                v = a(g)
                return None if v is None else not v
            return not_
        stop = node.boolop == "or"  # OR stops at true, AND at false
        args = []
        for x in node.args:  # as simplify_and_arguments: nothing after a deciding constant
            arg = self.compile(x)
            if getattr(arg, "constant", False) and arg(_no_columns) == stop:
                return _const(stop)
            args.append(arg)
        if all(getattr(a, "constant", False) for a in args):
            values = [a(_no_columns) for a in args]
            return _const(None if None in values else not stop)

        def junction(g: Getter) -> Any:
            saw_null = False
            for arg in args:
                v = arg(g)
                if v is None:
                    saw_null = True
                elif v == stop:
                    return stop
            return None if saw_null else not stop
        return junction

    def c_NullTest(self, node: n.NullTest) -> Compiled:
        assert node.arg is not None
        a = self.compile(node.arg)
        if node.is_null:
            return lambda g: a(g) is None
        return lambda g: a(g) is not None

    def c_BooleanTest(self, node: n.BooleanTest) -> Compiled:
        assert node.arg is not None
        a = self.compile(node.arg)
        test: Callable[[Any], bool] = {
                "IS_TRUE": lambda v: v is True, "IS_NOT_TRUE": lambda v: v is not True,
                "IS_FALSE": lambda v: v is False, "IS_NOT_FALSE": lambda v: v is not False,
                "IS_UNKNOWN": lambda v: v is None,
                "IS_NOT_UNKNOWN": lambda v: v is not None}[node.test]
        return lambda g: test(_bool(a(g)))

    def c_CaseExpr(self, node: n.CaseExpr) -> Compiled:
        arg = self.compile(node.arg) if node.arg is not None else None
        box = self._boxes.setdefault(id(node.placeholder), [None])
        if arg is not None and getattr(arg, "constant", False):
            box[0] = arg(_no_columns)
            self._known_cases.add(id(node.placeholder))
        whens = []
        default: Compiled | None = None
        for c, r in node.whens:  # arms after a constant true test are never compiled
            cond = self.compile(c)
            if getattr(cond, "constant", False):
                if cond(_no_columns) is not True:
                    continue
                default = self.compile(r)
                break
            whens.append((cond, self.compile(r)))
        if default is None:
            default = self.compile(node.default) if node.default is not None else _const(None)
        if all(getattr(f, "constant", False) for w in whens for f in w) and \
                getattr(default, "constant", False):
            for cond, result in whens:
                if cond(_no_columns) is True:
                    return _const(result(_no_columns))
            return _const(default(_no_columns))

        def case(g: Getter) -> Any:
            if arg is not None:
                box[0] = arg(g)
            for cond, result in whens:
                if cond(g) is True:
                    return result(g)
            return default(g)
        return case

    def c_CoalesceExpr(self, node: n.CoalesceExpr) -> Compiled:
        args = []
        for x in node.args:
            arg = self.compile(x)
            if getattr(arg, "constant", False):
                if arg(_no_columns) is None:
                    continue
                args.append(arg)
                break
            args.append(arg)
        if not args:
            return _const(None)
        if getattr(args[0], "constant", False):
            return args[0]

        def coalesce(g: Getter) -> Any:
            for arg in args:
                v = arg(g)
                if v is not None:
                    return v
            return None
        return coalesce

    def c_MinMaxExpr(self, node: n.MinMaxExpr) -> Compiled:
        assert node.compare is not None
        lt = self.impl(node.compare, node, node.args[:2])
        args = [self.compile(a) for a in node.args]
        greatest = node.greatest

        def minmax(g: Getter) -> Any:
            best = None
            for arg in args:
                v = arg(g)
                if v is None:
                    continue
                if best is None or (lt(best, v) if greatest else lt(v, best)):
                    best = v
            return best
        return minmax

    def c_RelabelType(self, node: n.RelabelType) -> Compiled:
        assert node.arg is not None
        return self.compile(node.arg)

    def c_CollateExpr(self, node: n.CollateExpr) -> Compiled:
        assert node.arg is not None
        return self.compile(node.arg)

    def c_ArrayExpr(self, node: n.ArrayExpr) -> Compiled:
        elements = [self.compile(e) for e in node.elements]
        return lambda g: [e(g) for e in elements]


def _flatten(items: Any) -> list[Any]:
    if not isinstance(items, list):
        raise EvaluationError("op ANY/ALL (array) requires array on right side")
    out: list[Any] = []
    for item in items:
        if isinstance(item, list):
            out += _flatten(item)
        else:
            out.append(item)
    return out


def _bool(v: Any) -> bool | None:
    return None if v is None else bool(v)


def _const(value: Any) -> Compiled:
    def constant(g: Getter) -> Any:
        return value
    constant.constant = True  # type: ignore[attr-defined]
    return constant


def _is_null_const(compiled: Compiled) -> bool:
    """A constant NULL: what the planner folds strict functions and NULLIF around."""
    return getattr(compiled, "constant", False) and compiled(_no_columns) is None


def _no_columns(i: int) -> Any:
    raise AssertionError("a constant expression read a column")
