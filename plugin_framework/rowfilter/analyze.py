"""Parse analysis of a row filter: PostgreSQL's transformWhereClause for a publication WHERE
clause (parse_expr.c, parse_oper.c, parse_func.c, parse_coerce.c, parse_collate.c), over the
raw parse tree pglast gives, with the server's catalogs.

Then the same validity check as publicationcmds.c's check_simple_rowfilter_expr_walker, with
PostgreSQL's messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pglast import ast
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.enums.primnodes import BoolExprType, BoolTestType, MinMaxOp, NullTestType

import plugin_framework.rowfilter.nodes as n
from plugin_framework.pgtypes import quote_ident_always
from plugin_framework.pgtypes.oids import BOOL, INT4, INT8, NUMERIC, RECORD, TEXT, UNKNOWN
from plugin_framework.rowfilter.errors import NotSupportedError, RowFilterError
from plugin_framework.rowfilter.functions import numeric_from_text
from plugin_framework.rowfilter.operators import OperatorLookup
from plugin_framework.rowfilter.parse_state import (
    EXPLICIT,
    IMPLICIT,
    INVALID_WHERE,
    ONLY_SIMPLE,
    PATH_COERCEVIAIO,
    PATH_RELABEL,
    SYSTEM_COLUMNS,
    ColumnInfo,
    TableShape,
    raw_location,
    render,
)
from plugin_framework.rowfilter.pgcatalog import FIRST_NORMAL_OBJECT_ID


class Analyzer(OperatorLookup):
    """Analyzes one filter expression of one table: transformExpr (parse_expr.c), then
    check_simple_rowfilter_expr_walker (publicationcmds.c)."""

    # --- entry point ---------------------------------------------------------------------------

    def analyze(self, raw: Any) -> n.Expr:
        """transformWhereClause + assign_expr_collations, then the simple-expression check."""
        expr = self.transform(raw)
        expr = self.coerce_to_boolean(expr, "PUBLICATION WHERE")
        self.assign_collations(expr)
        self.check_simple(expr)
        return expr

    # --- transformExpr -------------------------------------------------------------------------

    def transform(self, raw: Any) -> n.Expr:
        method: Callable[[Any], n.Expr] | None = getattr(
            self, f"t_{type(raw).__name__}", None)
        if method is None:
            return n.OtherExpr(0, what=type(raw).__name__, location=raw_location(raw))
        return method(raw)

    def t_ColumnRef(self, raw: ast.ColumnRef) -> n.Expr:
        fields = list(_items(raw.fields))
        if any(isinstance(f, ast.A_Star) for f in fields):
            raise NotSupportedError("whole-row references are not supported in row filters")
        names = [f.sval for f in fields]
        colname = names[-1]
        qualifier = names[:-1]
        if qualifier:
            ok = (qualifier == [self.table.name]
                  or qualifier == [self.table.schema, self.table.name])
            if not ok:
                raise self.error(
                    f'missing FROM-clause entry for table "{qualifier[-1]}"'
                    if len(qualifier) == 1 else
                    f'invalid reference to FROM-clause entry for table "{qualifier[-1]}"',
                    location=raw_location(raw))
        if colname in SYSTEM_COLUMNS:
            attnum, typ = SYSTEM_COLUMNS[colname]
            return n.Var(typ, name=colname, attnum=attnum, location=raw_location(raw))
        col = self.table.column(colname)
        if col is None:
            if qualifier:
                raise self.error(
                    f'column {qualifier[-1]}.{colname} does not exist', location=raw_location(raw))
            raise self.error(f'column "{colname}" does not exist', location=raw_location(raw))
        self.cat.load_types([col.type_oid])
        return n.Var(col.type_oid, typmod=col.typmod, collation=col.collation, name=col.name,
                     attnum=col.attnum, location=raw_location(raw))

    def t_A_Const(self, raw: ast.A_Const) -> n.Expr:
        loc = raw_location(raw)
        if raw.isnull:
            return n.Const(UNKNOWN, value=None, text=None, location=loc)
        val = raw.val
        if isinstance(val, ast.Integer):
            return n.Const(INT4, value=int(val.ival or 0), location=loc)
        if isinstance(val, ast.Float):
            text = val.fval or "0"
            # make_const: an integer too big for int4 is int8 if it fits, numeric otherwise
            if text.lstrip("-").isdigit():
                v = int(text)
                if -2**63 <= v < 2**63:
                    return n.Const(INT8, value=v, location=loc)
            return n.Const(NUMERIC, value=numeric_from_text(text), location=loc)
        if isinstance(val, ast.Boolean):
            return n.Const(BOOL, value=bool(val.boolval), location=loc)
        if isinstance(val, ast.String):
            return n.Const(UNKNOWN, value=None, text=val.sval, location=loc)
        raise NotSupportedError(f"constants like {render(raw)} are not supported in row filters")

    def t_TypeCast(self, raw: ast.TypeCast) -> n.Expr:
        assert raw.typeName is not None
        target, typmod = self.type_from_name(raw.typeName)
        arg = raw.arg
        if isinstance(arg, ast.A_ArrayExpr):
            elem = self.cat.element_type(self.cat.base_type(target))
            expr = self.transform_array(arg, target, elem) if elem else self.transform(arg)
        else:
            expr = self.transform(arg)
        result = self.coerce_to_target_type(expr, expr.rtype, target, typmod, EXPLICIT,
                                            "explicit")
        if result is None:
            raise self.error(
                f"cannot cast type {self.tname(expr.rtype)} to {self.tname(target)}",
                location=raw_location(raw))
        return result

    def t_CollateClause(self, raw: ast.CollateClause) -> n.Expr:
        arg = self.transform(raw.arg)
        names = [s.sval for s in _items(raw.collname)]
        oid = self.cat.collation_by_name(names)
        if oid is None:
            raise self.error(
                f'collation "{".".join(names)}" for encoding "UTF8" does not exist',
                location=raw_location(raw))
        if not self.cat.type(arg.rtype).collation and not self.collatable(arg.rtype):
            raise self.error(
                f"collations are not supported by type {self.tname(arg.rtype)}",
                location=raw_location(raw))
        return n.CollateExpr(arg.rtype, typmod=arg.typmod, arg=arg, collation=oid,
                             location=raw_location(raw))

    def t_BoolExpr(self, raw: ast.BoolExpr) -> n.Expr:
        op = {BoolExprType.AND_EXPR: "and", BoolExprType.OR_EXPR: "or",
              BoolExprType.NOT_EXPR: "not"}[BoolExprType(raw.boolop or 0)]
        args = [self.coerce_to_boolean(self.transform(a), op.upper()) for a in _items(raw.args)]
        return n.BoolExpr(BOOL, boolop=op, args=args, location=raw_location(raw))

    def t_NullTest(self, raw: ast.NullTest) -> n.Expr:
        arg = self.transform(raw.arg)
        if arg.rtype == UNKNOWN:  # an unknown literal is taken as text
            arg = self.coerce_type(arg, UNKNOWN, TEXT, -1, IMPLICIT, "implicit")
        return n.NullTest(BOOL, arg=arg, is_null=raw.nulltesttype == NullTestType.IS_NULL,
                          location=raw_location(raw))

    def t_BooleanTest(self, raw: ast.BooleanTest) -> n.Expr:
        names = {BoolTestType.IS_TRUE: "IS TRUE", BoolTestType.IS_NOT_TRUE: "IS NOT TRUE",
                 BoolTestType.IS_FALSE: "IS FALSE", BoolTestType.IS_NOT_FALSE: "IS NOT FALSE",
                 BoolTestType.IS_UNKNOWN: "IS UNKNOWN",
                 BoolTestType.IS_NOT_UNKNOWN: "IS NOT UNKNOWN"}
        test = BoolTestType(raw.booltesttype or 0)
        arg = self.coerce_to_boolean(self.transform(raw.arg), names[test])
        return n.BooleanTest(BOOL, arg=arg, test=test.name,
                             location=raw_location(raw))

    def t_A_Expr(self, raw: ast.A_Expr) -> n.Expr:
        kind = raw.kind
        names = [s.sval for s in raw.name] if raw.name else []
        loc = raw_location(raw)
        if kind == A_Expr_Kind.AEXPR_OP or kind in (A_Expr_Kind.AEXPR_LIKE,
                                                    A_Expr_Kind.AEXPR_ILIKE,
                                                    A_Expr_Kind.AEXPR_SIMILAR):
            if raw.lexpr is None:
                return self.make_prefix_op(names, self.transform(raw.rexpr), loc)
            if isinstance(raw.lexpr, ast.RowExpr) or isinstance(raw.rexpr, ast.RowExpr):
                raise NotSupportedError("row comparisons are not supported in row filters")
            return self.make_op(names, self.transform(raw.lexpr), self.transform(raw.rexpr),
                                loc)
        if kind in (A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_OP_ALL):
            left = self.transform(raw.lexpr)
            right = self.transform(raw.rexpr)
            return self.make_scalar_array_op(names, kind == A_Expr_Kind.AEXPR_OP_ANY, left,
                                             right, loc)
        if kind in (A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT):
            if isinstance(raw.lexpr, ast.RowExpr) or isinstance(raw.rexpr, ast.RowExpr):
                raise NotSupportedError("row comparisons are not supported in row filters")
            op = self.make_op(names, self.transform(raw.lexpr), self.transform(raw.rexpr), loc,
                              node_class=n.DistinctExpr)
            if op.rtype != BOOL:
                raise self.error("IS DISTINCT FROM requires = operator to yield boolean",
                                 location=loc)
            if kind == A_Expr_Kind.AEXPR_NOT_DISTINCT:
                return n.BoolExpr(BOOL, boolop="not", args=[op], location=loc)
            return op
        if kind == A_Expr_Kind.AEXPR_NULLIF:
            op = self.make_op(names, self.transform(raw.lexpr), self.transform(raw.rexpr), loc,
                              node_class=n.NullIfExpr)
            if op.rtype != BOOL:
                raise self.error("NULLIF requires = operator to yield boolean", location=loc)
            assert isinstance(op, n.OpExpr)
            op.rtype = op.args[0].rtype
            op.typmod = op.args[0].typmod
            return op
        if kind == A_Expr_Kind.AEXPR_IN:
            return self.transform_in(raw, names)
        if kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN,
                    A_Expr_Kind.AEXPR_BETWEEN_SYM, A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM):
            return self.transform(_between_tree(raw))
        raise NotSupportedError(f"{kind!r} expressions are not supported in row filters")

    def t_FuncCall(self, raw: ast.FuncCall) -> n.Expr:
        names = [s.sval for s in _items(raw.funcname)]
        loc = raw_location(raw)
        display = ".".join(names)
        if raw.agg_star or raw.agg_distinct or raw.agg_order or raw.agg_filter or \
                raw.agg_within_group:
            raise self.error("aggregate functions are not allowed in WHERE", location=loc)
        if raw.over is not None:
            raise self.error("window functions are not allowed in WHERE", location=loc)
        if raw.func_variadic:
            raise NotSupportedError("VARIADIC calls are not supported in row filters")
        args = [self.transform(a) for a in (raw.args or ())]
        if any(isinstance(a, ast.NamedArgExpr) for a in (raw.args or ())):
            raise NotSupportedError("named function arguments are not supported in row filters")
        argtypes = [a.rtype for a in args]
        schema = names[-2] if len(names) > 1 else None
        fname = names[-1]
        candidates = [p for p in self.cat.functions(fname, len(args), schema)]
        best = next((p for p in candidates if list(p.argtypes) == argtypes), None)
        if best is None:
            coercion = self.function_as_cast(names, args, loc)
            if coercion is not None:
                return coercion
            matched = [p for p in candidates
                       if self.can_coerce(argtypes, list(p.argtypes), IMPLICIT)]
            if len(matched) == 1:
                best = matched[0]
            elif matched:
                best = self.select_candidate(argtypes, matched)
                if best is None:
                    raise self.error(
                        f"function {display}({self.sig(argtypes)}) is not unique",
                        hint="Could not choose a best candidate function. You might need "
                             "to add explicit type casts.", location=loc)
            else:
                raise self.error(
                    f"function {display}({self.sig(argtypes)}) does not exist",
                    hint="No function matches the given name and argument types. You might "
                         "need to add explicit type casts.", location=loc)
        if best.kind == "a":
            raise self.error("aggregate functions are not allowed in WHERE", location=loc)
        if best.kind == "w":
            raise self.error("window functions are not allowed in WHERE", location=loc)
        if best.kind == "p":
            raise self.error(f"{display}({self.sig(argtypes)}) is a procedure", location=loc)
        if best.retset:
            raise self.error("set-returning functions are not allowed in WHERE", location=loc)
        declared, rettype = self.enforce_generic(argtypes, list(best.argtypes), best.rettype)
        fargs = self.make_fn_arguments(args, declared)
        return n.FuncExpr(rettype, proc=best, args=fargs, fmt="call", location=loc)

    def t_CaseExpr(self, raw: ast.CaseExpr) -> n.Expr:
        loc = raw_location(raw)
        arg = self.transform(raw.arg) if raw.arg is not None else None
        placeholder = None
        if arg is not None:
            if arg.rtype == UNKNOWN:
                arg = self.coerce_to_common_type(arg, TEXT, "CASE")
            self.assign_collations(arg)
            placeholder = n.CaseTestExpr(arg.rtype, typmod=arg.typmod, collation=arg.collation)
        conds: list[n.Expr] = []
        results: list[n.Expr] = []
        for w in _items(raw.args):
            if placeholder is not None:
                cond: n.Expr = self.make_op(["="], placeholder, self.transform(w.expr),
                                            raw_location(w))
            else:
                cond = self.transform(w.expr)
            conds.append(self.coerce_to_boolean(cond, "CASE/WHEN"))
            results.append(self.transform(w.result))
        default = (self.transform(raw.defresult) if raw.defresult is not None
                   else n.Const(UNKNOWN, value=None))
        ptype = self.select_common_type([default, *results], "CASE")
        default = self.coerce_to_common_type(default, ptype, "CASE")
        results = [self.coerce_to_common_type(r, ptype, "CASE") for r in results]
        return n.CaseExpr(ptype, arg=arg, placeholder=placeholder,
                          whens=list(zip(conds, results, strict=True)), default=default,
                          location=loc)

    def t_CoalesceExpr(self, raw: ast.CoalesceExpr) -> n.Expr:
        args = [self.transform(a) for a in _items(raw.args)]
        ptype = self.select_common_type(args, "COALESCE")
        args = [self.coerce_to_common_type(a, ptype, "COALESCE") for a in args]
        return n.CoalesceExpr(ptype, args=args, location=raw_location(raw))

    def t_MinMaxExpr(self, raw: ast.MinMaxExpr) -> n.Expr:
        greatest = raw.op == MinMaxOp.IS_GREATEST
        what = "GREATEST" if greatest else "LEAST"
        args = [self.transform(a) for a in _items(raw.args)]
        ptype = self.select_common_type(args, what)
        args = [self.coerce_to_common_type(a, ptype, what) for a in args]
        # The type's btree comparison (lookup_type_cache finds the opclass of a binary
        # compatible type too: varchar sorts with text's).
        try:
            lt = self.oper(["<"], ptype, ptype, raw_location(raw))
        except RowFilterError:
            raise self.error(f"could not identify a comparison function for type "
                             f"{self.tname(ptype)}", location=raw_location(raw)) from None
        return n.MinMaxExpr(ptype, greatest=greatest, args=args, compare=self.cat.proc(lt.proc),
                            location=raw_location(raw))

    def t_A_ArrayExpr(self, raw: ast.A_ArrayExpr) -> n.Expr:
        return self.transform_array(raw, 0, 0)

    def t_RowExpr(self, raw: ast.RowExpr) -> n.Expr:
        raise NotSupportedError("row constructors are not supported in row filters")

    def t_ParamRef(self, raw: ast.ParamRef) -> n.Expr:
        raise self.error(f"there is no parameter ${raw.number}", location=raw_location(raw))

    def t_SubLink(self, raw: ast.SubLink) -> n.Expr:
        # PostgreSQL types the subquery, then refuses it as not simple; the type does not
        # matter for the message.
        raise self.error(INVALID_WHERE, detail=ONLY_SIMPLE, location=raw_location(raw))

    def t_A_Indirection(self, raw: ast.A_Indirection) -> n.Expr:
        raise self.error(INVALID_WHERE, detail=ONLY_SIMPLE, location=raw_location(raw))

    def t_SQLValueFunction(self, raw: ast.SQLValueFunction) -> n.Expr:
        """CURRENT_DATE and friends: typed, then refused by the simple-expression check."""
        op = str(getattr(raw.op, "name", raw.op))
        typ = {"DATE": "date", "TIME": "timetz", "TIMESTAMP": "timestamptz",
               "LOCALTIME": "time", "LOCALTIMESTAMP": "timestamp"}
        for suffix, name in typ.items():
            if op.endswith("_" + suffix) or op.endswith("_" + suffix + "_N"):
                oid = self.cat.resolve_type_name(name)[0]
                break
        else:
            oid = self.cat.resolve_type_name("name")[0]
        return n.OtherExpr(oid, what="SQLValueFunction", location=raw_location(raw))

    # --- pieces of transformExpr --------------------------------------------------------------

    def transform_array(self, raw: ast.A_ArrayExpr, array_type: int, elem_type: int) -> n.Expr:
        """transformArrayExpr (one-dimensional arrays)."""
        loc = raw_location(raw)
        if any(isinstance(e, ast.A_ArrayExpr) for e in (raw.elements or ())):
            raise NotSupportedError("multidimensional arrays are not supported in row filters")
        elements = [self.transform(e) for e in (raw.elements or ())]
        hard = bool(elem_type)
        if not hard:
            if not elements:
                raise self.error("cannot determine type of empty array",
                                 hint="Explicitly cast to the desired type, for example "
                                      "ARRAY[]::integer[].", location=loc)
            elem_type = self.select_common_type(elements, "ARRAY")
            array_type = self.cat.array_type(elem_type)
            if not array_type:
                raise self.error(
                    f"could not find array type for data type {self.tname(elem_type)}",
                    location=loc)
        out = []
        for e in elements:
            if hard:
                c = self.coerce_to_target_type(e, e.rtype, elem_type, -1, EXPLICIT, "explicit")
                if c is None:
                    raise self.error(f"cannot cast type {self.tname(e.rtype)} to "
                                     f"{self.tname(elem_type)}", location=e.location)
                out.append(c)
            else:
                out.append(self.coerce_to_common_type(e, elem_type, "ARRAY"))
        return n.ArrayExpr(array_type, elements=out, element_type=elem_type, location=loc)

    def transform_in(self, raw: ast.A_Expr, names: list[str]) -> n.Expr:
        """transformAExprIn: a ScalarArrayOpExpr over the constant items, ORed (ANDed for
        NOT IN) with one comparison per item that references columns."""
        use_or = names != ["<>"]
        loc = raw_location(raw)
        left = self.transform(raw.lexpr)
        raw_items = _items(raw.rexpr)
        items = [self.transform(r) for r in raw_items]
        with_vars = [i for i, r in zip(items, raw_items, strict=True) if _has_columns(r)]
        consts = [i for i, r in zip(items, raw_items, strict=True) if not _has_columns(r)]
        result: n.Expr | None = None
        rest = items
        if len(consts) > 1:
            scalar = self.select_common_type([left, *consts], None)
            if scalar and not self.verify_common_type(scalar, [left, *consts]):
                scalar = 0
            array = self.cat.array_type(scalar) if scalar and scalar != RECORD else 0
            if array:
                elems = [self.coerce_to_common_type(c, scalar, "IN") for c in consts]
                arr = n.ArrayExpr(array, elements=elems, element_type=scalar)
                result = self.make_scalar_array_op(names, use_or, left, arr, loc)
                rest = with_vars
        for item in rest:
            cmp = self.coerce_to_boolean(self.make_op(names, left, item, loc), "IN")
            result = cmp if result is None else n.BoolExpr(
                BOOL, boolop="or" if use_or else "and", args=[result, cmp], location=loc)
        assert result is not None
        return result

    def function_as_cast(self, names: list[str], args: list[n.Expr],
                         loc: int) -> n.Expr | None:
        """func_get_detail's "typename(arg)" coercion."""
        if len(args) != 1:
            return None
        try:
            target, _ = self.cat.resolve_type_name(".".join(quote_ident_always(x) for x in names))
        except Exception:
            return None
        source = args[0].rtype
        if source == UNKNOWN and isinstance(args[0], n.Const):
            iscoercion = True
        else:
            path, _ = self.coercion_pathway(target, source, EXPLICIT)
            iscoercion = path == PATH_RELABEL or path == PATH_COERCEVIAIO
        if not iscoercion:
            return None
        return self.coerce_type(args[0], source, target, -1, EXPLICIT, "explicit")

    # --- check_simple_rowfilter_expr_walker --------------------------------------------------

    def check_simple(self, node: n.Expr) -> None:
        detail: str | None = None
        if isinstance(node, n.Var):
            if node.attnum < 0:
                detail = "System columns are not allowed."
        elif isinstance(node, n.OpExpr):  # also DistinctExpr, NullIfExpr, ScalarArrayOpExpr
            assert node.op is not None
            if node.op.oid >= FIRST_NORMAL_OBJECT_ID:
                detail = "User-defined operators are not allowed."
        elif not isinstance(node, (n.Const, n.FuncExpr, n.BoolExpr, n.RelabelType,
                                   n.CollateExpr, n.CaseExpr, n.CaseTestExpr, n.ArrayExpr,
                                   n.RowExpr, n.CoalesceExpr, n.MinMaxExpr, n.NullTest,
                                   n.BooleanTest)):
            detail = ONLY_SIMPLE
        if detail is None:
            if node.rtype >= FIRST_NORMAL_OBJECT_ID:
                detail = "User-defined types are not allowed."
            elif any(p.volatility != "i" or p.oid >= FIRST_NORMAL_OBJECT_ID
                     for p in node.functions()):
                detail = "User-defined or built-in mutable functions are not allowed."
            elif (node.collation >= FIRST_NORMAL_OBJECT_ID
                  or node.input_collation >= FIRST_NORMAL_OBJECT_ID):
                detail = "User-defined collations are not allowed."
        if detail is not None:
            raise self.error(INVALID_WHERE, detail=detail, location=node.location)
        for child in node.children():
            self.check_simple(child)





def _items(value: Any) -> tuple[Any, ...]:
    """A pglast list attribute as a tuple (absent: empty)."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)




def _has_columns(raw: Any) -> bool:
    """contain_vars_of_level on the raw tree: whether an IN item references a column."""
    if isinstance(raw, ast.ColumnRef):
        return True
    if isinstance(raw, ast.Node):
        for slot in raw:
            value = getattr(raw, slot, None)
            if isinstance(value, (list, tuple)):
                if any(_has_columns(v) for v in value):
                    return True
            elif isinstance(value, ast.Node) and _has_columns(value):
                return True
    return False


def _between_tree(raw: ast.A_Expr) -> Any:
    """transformAExprBetween's rewriting into comparisons."""
    a = raw.lexpr
    b, c = _items(raw.rexpr)

    def op(name: str, x: Any, y: Any) -> ast.A_Expr:
        return ast.A_Expr(kind=A_Expr_Kind.AEXPR_OP, name=(ast.String(sval=name),), lexpr=x,
                          rexpr=y, location=raw.location)

    def both(kind: BoolExprType, *args: Any) -> ast.BoolExpr:
        return ast.BoolExpr(boolop=kind, args=args, location=raw.location)

    kind = raw.kind
    AND, OR = BoolExprType.AND_EXPR, BoolExprType.OR_EXPR
    if kind == A_Expr_Kind.AEXPR_BETWEEN:
        return both(AND, op(">=", a, b), op("<=", a, c))
    if kind == A_Expr_Kind.AEXPR_NOT_BETWEEN:
        return both(OR, op("<", a, b), op(">", a, c))
    if kind == A_Expr_Kind.AEXPR_BETWEEN_SYM:
        return both(OR, both(AND, op(">=", a, b), op("<=", a, c)),
                    both(AND, op(">=", a, c), op("<=", a, b)))
    return both(AND, both(OR, op("<", a, b), op(">", a, c)),
                both(OR, op("<", a, c), op(">", a, b)))


__all__ = ["Analyzer", "ColumnInfo", "TableShape", "render"]
