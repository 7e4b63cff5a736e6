"""Parse analysis of a row filter: PostgreSQL's transformWhereClause for a publication WHERE
clause (parse_expr.c, parse_oper.c, parse_func.c, parse_coerce.c, parse_collate.c), over the
raw parse tree pglast gives, with the server's catalogs.

Then the same validity check as publicationcmds.c's check_simple_rowfilter_expr_walker, with
PostgreSQL's messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pglast import ast
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.enums.primnodes import BoolExprType, BoolTestType, MinMaxOp, NullTestType
from pglast.stream import RawStream

from plugin_framework.framework.rowfilter import nodes as n
from plugin_framework.framework.rowfilter.errors import NotSupportedError, RowFilterError
from plugin_framework.framework.rowfilter.pgcatalog import (
    DEFAULT_COLLATION,
    FIRST_NORMAL_OBJECT_ID,
    POLYMORPHIC,
    STRING_CATEGORY,
    OperInfo,
    ProcInfo,
    TypeCatalog,
)
from plugin_framework.pgtypes import quote_ident_always as _quote_ident
from plugin_framework.pgtypes.oids import (
    ANY,
    ANYARRAY,
    ANYCOMPATIBLE,
    ANYCOMPATIBLEARRAY,
    ANYCOMPATIBLEMULTIRANGE,
    ANYCOMPATIBLENONARRAY,
    ANYCOMPATIBLERANGE,
    ANYELEMENT,
    ANYENUM,
    ANYMULTIRANGE,
    ANYNONARRAY,
    ANYRANGE,
    BOOL,
    INT4,
    INT8,
    NUMERIC,
    RECORD,
    TEXT,
    UNKNOWN,
)

# Coercion contexts (CoercionContext) and paths (CoercionPathType).
IMPLICIT, ASSIGNMENT, EXPLICIT = 0, 1, 2
PATH_NONE, PATH_FUNC, PATH_RELABEL, PATH_ARRAYCOERCE, PATH_COERCEVIAIO = range(5)

SYSTEM_COLUMNS = {"ctid": (-1, 27), "xmin": (-2, 28), "cmin": (-3, 29), "xmax": (-4, 28),
                  "cmax": (-5, 29), "tableoid": (-6, 26)}

ONLY_SIMPLE = ("Only columns, constants, built-in operators, built-in data types, built-in "
               "collations, and immutable built-in functions are allowed.")
INVALID_WHERE = "invalid publication WHERE expression"

# Collation strengths (CollateStrength).
C_NONE, C_IMPLICIT, C_CONFLICT, C_EXPLICIT = range(4)


@dataclass(frozen=True)
class ColumnInfo:
    """A table column as the analyzer sees it."""

    name: str
    type_oid: int
    typmod: int = -1
    collation: int = 0
    attnum: int = 0


@dataclass(frozen=True)
class TableShape:
    schema: str
    name: str
    columns: tuple[ColumnInfo, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> ColumnInfo | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None


def render(node: Any) -> str:
    """SQL text of a raw parse tree node (pglast's printer)."""
    return str(RawStream()(node))


class Analyzer:
    """Analyzes one filter expression of one table."""

    def __init__(self, catalog: TypeCatalog, table: TableShape,
                 const_input: Callable[[int, str], Any], offset: int = 0) -> None:
        self.cat = catalog
        self.table = table
        self.const_input = const_input  # (type OID, literal text) -> Python value
        self.offset = offset  # where the filter's text starts in the parsed statement

    # --- errors --------------------------------------------------------------------------------

    def error(self, message: str, detail: str | None = None, hint: str | None = None,
              location: int = -1) -> RowFilterError:
        err = RowFilterError(message, detail=detail, hint=hint)
        err.position = location - self.offset + 1 if location >= 0 else None
        return err

    def tname(self, oid: int) -> str:
        return self.cat.type_name(oid)

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
            return n.OtherExpr(0, what=type(raw).__name__, location=_loc(raw))
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
                    location=_loc(raw))
        if colname in SYSTEM_COLUMNS:
            attnum, typ = SYSTEM_COLUMNS[colname]
            return n.Var(typ, name=colname, attnum=attnum, location=_loc(raw))
        col = self.table.column(colname)
        if col is None:
            if qualifier:
                raise self.error(
                    f'column {qualifier[-1]}.{colname} does not exist', location=_loc(raw))
            raise self.error(f'column "{colname}" does not exist', location=_loc(raw))
        self.cat.load_types([col.type_oid])
        return n.Var(col.type_oid, typmod=col.typmod, collation=col.collation, name=col.name,
                     attnum=col.attnum, location=_loc(raw))

    def t_A_Const(self, raw: ast.A_Const) -> n.Expr:
        loc = _loc(raw)
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
            return n.Const(NUMERIC, value=Decimal((text or "0").replace("_", "")), location=loc)
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
                location=_loc(raw))
        return result

    def t_CollateClause(self, raw: ast.CollateClause) -> n.Expr:
        arg = self.transform(raw.arg)
        names = [s.sval for s in _items(raw.collname)]
        oid = self.cat.collation_by_name(names)
        if oid is None:
            raise self.error(
                f'collation "{".".join(names)}" for encoding "UTF8" does not exist',
                location=_loc(raw))
        if not self.cat.type(arg.rtype).collation and not self.collatable(arg.rtype):
            raise self.error(
                f"collations are not supported by type {self.tname(arg.rtype)}",
                location=_loc(raw))
        return n.CollateExpr(arg.rtype, typmod=arg.typmod, arg=arg, collation=oid,
                             location=_loc(raw))

    def t_BoolExpr(self, raw: ast.BoolExpr) -> n.Expr:
        op = {BoolExprType.AND_EXPR: "and", BoolExprType.OR_EXPR: "or",
              BoolExprType.NOT_EXPR: "not"}[BoolExprType(raw.boolop or 0)]
        args = [self.coerce_to_boolean(self.transform(a), op.upper()) for a in _items(raw.args)]
        return n.BoolExpr(BOOL, boolop=op, args=args, location=_loc(raw))

    def t_NullTest(self, raw: ast.NullTest) -> n.Expr:
        arg = self.transform(raw.arg)
        if arg.rtype == UNKNOWN:  # an unknown literal is taken as text
            arg = self.coerce_type(arg, UNKNOWN, TEXT, -1, IMPLICIT, "implicit")
        return n.NullTest(BOOL, arg=arg, is_null=raw.nulltesttype == NullTestType.IS_NULL,
                          location=_loc(raw))

    def t_BooleanTest(self, raw: ast.BooleanTest) -> n.Expr:
        names = {BoolTestType.IS_TRUE: "IS TRUE", BoolTestType.IS_NOT_TRUE: "IS NOT TRUE",
                 BoolTestType.IS_FALSE: "IS FALSE", BoolTestType.IS_NOT_FALSE: "IS NOT FALSE",
                 BoolTestType.IS_UNKNOWN: "IS UNKNOWN",
                 BoolTestType.IS_NOT_UNKNOWN: "IS NOT UNKNOWN"}
        test = BoolTestType(raw.booltesttype or 0)
        arg = self.coerce_to_boolean(self.transform(raw.arg), names[test])
        return n.BooleanTest(BOOL, arg=arg, test=test.name,
                             location=_loc(raw))

    def t_A_Expr(self, raw: ast.A_Expr) -> n.Expr:
        kind = raw.kind
        names = [s.sval for s in raw.name] if raw.name else []
        loc = _loc(raw)
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
        loc = _loc(raw)
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
        loc = _loc(raw)
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
                                            _loc(w))
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
        return n.CoalesceExpr(ptype, args=args, location=_loc(raw))

    def t_MinMaxExpr(self, raw: ast.MinMaxExpr) -> n.Expr:
        greatest = raw.op == MinMaxOp.IS_GREATEST
        what = "GREATEST" if greatest else "LEAST"
        args = [self.transform(a) for a in _items(raw.args)]
        ptype = self.select_common_type(args, what)
        args = [self.coerce_to_common_type(a, ptype, what) for a in args]
        # The type's btree comparison (lookup_type_cache finds the opclass of a binary
        # compatible type too: varchar sorts with text's).
        try:
            lt = self.oper(["<"], ptype, ptype, _loc(raw))
        except RowFilterError:
            raise self.error(f"could not identify a comparison function for type "
                             f"{self.tname(ptype)}", location=_loc(raw)) from None
        return n.MinMaxExpr(ptype, greatest=greatest, args=args, compare=self.cat.proc(lt.proc),
                            location=_loc(raw))

    def t_A_ArrayExpr(self, raw: ast.A_ArrayExpr) -> n.Expr:
        return self.transform_array(raw, 0, 0)

    def t_RowExpr(self, raw: ast.RowExpr) -> n.Expr:
        raise NotSupportedError("row constructors are not supported in row filters")

    def t_ParamRef(self, raw: ast.ParamRef) -> n.Expr:
        raise self.error(f"there is no parameter ${raw.number}", location=_loc(raw))

    def t_SubLink(self, raw: ast.SubLink) -> n.Expr:
        # PostgreSQL types the subquery, then refuses it as not simple; the type does not
        # matter for the message.
        raise self.error(INVALID_WHERE, detail=ONLY_SIMPLE, location=_loc(raw))

    def t_A_Indirection(self, raw: ast.A_Indirection) -> n.Expr:
        raise self.error(INVALID_WHERE, detail=ONLY_SIMPLE, location=_loc(raw))

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
        return n.OtherExpr(oid, what="SQLValueFunction", location=_loc(raw))

    # --- pieces of transformExpr --------------------------------------------------------------

    def transform_array(self, raw: ast.A_ArrayExpr, array_type: int, elem_type: int) -> n.Expr:
        """transformArrayExpr (one-dimensional arrays)."""
        loc = _loc(raw)
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
        loc = _loc(raw)
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
            target, _ = self.cat.resolve_type_name(".".join(_quote_ident(x) for x in names))
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

    # --- operators ----------------------------------------------------------------------------

    def sig(self, types: Sequence[int]) -> str:
        return ", ".join(self.tname(t) for t in types)

    def exact_operator(self, name: str, left: int, right: int,
                       schema: str | None = None) -> OperInfo | None:
        for o in self.cat.operators(name, "b", schema):
            if o.left == left and o.right == right:
                return o
        return None

    def oper(self, names: list[str], ltype: int, rtype: int, loc: int) -> OperInfo:
        """oper(): the binary operator for these input types."""
        schema = names[-2] if len(names) > 1 else None
        name = names[-1]
        # binary_oper_exact
        a1, a2, was_unknown = ltype, rtype, False
        if a1 == UNKNOWN and a2 != 0:
            a1, was_unknown = a2, True
        elif a2 == UNKNOWN and a1 != 0:
            a2, was_unknown = a1, True
        found = self.exact_operator(name, a1, a2, schema)
        if found is None and was_unknown:
            base = self.cat.base_type(a1)
            if base != a1:
                found = self.exact_operator(name, base, base, schema)
        if found is not None:
            return found
        candidates = self.cat.operators(name, "b", schema)
        inputs = [ltype, rtype]
        matched = [o for o in candidates if self.can_coerce(inputs, [o.left, o.right], IMPLICIT)]
        best: OperInfo | None = None
        if len(matched) == 1:
            best = matched[0]
        elif matched:
            best = self.select_candidate(inputs, matched)
            if best is None:
                raise self.error(
                    f"operator is not unique: {self.tname(ltype)} {name} {self.tname(rtype)}",
                    hint="Could not choose a best candidate operator. You might need to add "
                         "explicit type casts.", location=loc)
        if best is None:
            raise self.error(
                f"operator does not exist: {self.tname(ltype)} {name} {self.tname(rtype)}",
                hint="No operator matches the given name and argument types. You might need "
                     "to add explicit type casts.", location=loc)
        return best

    def make_op(self, names: list[str], left: n.Expr, right: n.Expr, loc: int,
                node_class: type[n.OpExpr] = n.OpExpr) -> n.OpExpr:
        op = self.oper(names, left.rtype, right.rtype, loc)
        declared, rettype = self.enforce_generic([left.rtype, right.rtype],
                                                 [op.left, op.right], op.result)
        args = self.make_fn_arguments([left, right], declared)
        return node_class(rettype, op=op, proc=self.cat.proc(op.proc), args=args, location=loc)

    def make_prefix_op(self, names: list[str], arg: n.Expr, loc: int) -> n.Expr:
        schema = names[-2] if len(names) > 1 else None
        name = names[-1]
        candidates = self.cat.operators(name, "l", schema)
        best = next((o for o in candidates if o.right == arg.rtype), None)
        if best is None:
            matched = [o for o in candidates if self.can_coerce([arg.rtype], [o.right], IMPLICIT)]
            if len(matched) == 1:
                best = matched[0]
            elif matched:
                best = self.select_candidate([arg.rtype], matched)
                if best is None:
                    raise self.error(f"operator is not unique: {name} {self.tname(arg.rtype)}",
                                     location=loc)
        if best is None:
            raise self.error(f"operator does not exist: {name} {self.tname(arg.rtype)}",
                             hint="No operator matches the given name and argument type. You "
                                  "might need to add an explicit type cast.", location=loc)
        declared, rettype = self.enforce_generic([arg.rtype], [best.right], best.result)
        args = self.make_fn_arguments([arg], declared)
        return n.OpExpr(rettype, op=best, proc=self.cat.proc(best.proc), args=args, location=loc)

    def make_scalar_array_op(self, names: list[str], use_or: bool, left: n.Expr,
                             right: n.Expr, loc: int) -> n.Expr:
        ltype = left.rtype
        atype = right.rtype
        rtype = self.cat.element_type(self.cat.base_type(atype)) if atype != UNKNOWN else 0
        if atype == UNKNOWN:
            rtype = UNKNOWN  # an unknown literal on the right: taken as an array of it
        if not rtype:
            raise self.error("op ANY/ALL (array) requires array on right side", location=loc)
        op = self.oper(names, ltype, rtype, loc)
        declared, rettype = self.enforce_generic([ltype, rtype], [op.left, op.right], op.result)
        if rettype != BOOL:
            raise self.error("op ANY/ALL (array) requires operator to yield boolean",
                             location=loc)
        array_declared = self.cat.array_type(declared[1])
        if not array_declared:
            raise self.error(f"could not find array type for data type "
                             f"{self.tname(declared[1])}", location=loc)
        args = self.make_fn_arguments([left, right], [declared[0], array_declared])
        return n.ScalarArrayOpExpr(BOOL, op=op, proc=self.cat.proc(op.proc), args=args,
                                   use_or=use_or, location=loc)

    # --- candidate selection (func_select_candidate) -----------------------------------------

    def select_candidate(self, inputs: list[int], candidates: Sequence[Any]) -> Any:
        nargs = len(inputs)
        args_of: Callable[[Any], list[int]] = (
            (lambda c: [c.left, c.right] if c.kind == "b" else [c.right])
            if isinstance(candidates[0], OperInfo) else (lambda c: list(c.argtypes)))
        base = [self.cat.base_type(t) if t != UNKNOWN else UNKNOWN for t in inputs]
        nunknowns = base.count(UNKNOWN)

        def keep_best(cands: list[Any], score: Callable[[list[int]], int]) -> list[Any]:
            best, out = -1, []
            for c in cands:
                s = score(args_of(c))
                if s > best:
                    best, out = s, [c]
                elif s == best:
                    out.append(c)
            return out

        cands = keep_best(list(candidates), lambda a: sum(
            1 for i in range(nargs) if base[i] != UNKNOWN and a[i] == base[i]))
        if len(cands) == 1:
            return cands[0]
        slot_cat = [self.cat.category(t)[0] for t in base]

        def preferred(i: int, t: int) -> bool:
            c, p = self.cat.category(t)
            return c == slot_cat[i] and p

        cands = keep_best(cands, lambda a: sum(
            1 for i in range(nargs)
            if base[i] != UNKNOWN and (a[i] == base[i] or preferred(i, a[i]))))
        if len(cands) == 1:
            return cands[0]
        if nunknowns == 0:
            return None
        first = cands
        resolved = True
        slot_pref = [False] * nargs
        for i in range(nargs):
            if base[i] != UNKNOWN:
                continue
            cat_i: str | None = None
            conflict = False
            for c in cands:
                ccat, cpref = self.cat.category(args_of(c)[i])
                if cat_i is None:
                    cat_i, slot_pref[i] = ccat, cpref
                elif ccat == cat_i:
                    slot_pref[i] |= cpref
                elif ccat == STRING_CATEGORY:
                    cat_i, slot_pref[i] = ccat, cpref
                else:
                    conflict = True
            if conflict and cat_i != STRING_CATEGORY:
                resolved = False
                break
            slot_cat[i] = cat_i or ""
        if resolved:
            kept = []
            for c in cands:
                ok = True
                for i in range(nargs):
                    if base[i] != UNKNOWN:
                        continue
                    ccat, cpref = self.cat.category(args_of(c)[i])
                    if ccat != slot_cat[i] or (slot_pref[i] and not cpref):
                        ok = False
                        break
                if ok:
                    kept.append(c)
            cands = kept
            if len(cands) == 1:
                return cands[0]
        if nunknowns < nargs:
            known = {t for t in base if t != UNKNOWN}
            if len(known) == 1:
                k = known.pop()
                matches = [c for c in first if self.can_coerce([k] * nargs, args_of(c),
                                                               IMPLICIT)]
                if len(matches) == 1:
                    return matches[0]
        return None

    # --- coercion (parse_coerce.c) ------------------------------------------------------------

    def collatable(self, oid: int) -> bool:
        return bool(oid) and self.cat.type(self.cat.base_type(oid)).collation != 0

    def coercion_pathway(self, target: int, source: int, ccontext: int) -> tuple[int, int]:
        """find_coercion_pathway: (path, cast function OID)."""
        if source == target:
            return PATH_RELABEL, 0
        source = self.cat.base_type(source)
        target = self.cat.base_type(target)
        if source == target:
            return PATH_RELABEL, 0
        cast = self.cat.cast(source, target)
        if cast is not None:
            allowed = (cast.context == "i" or (cast.context == "a" and ccontext >= ASSIGNMENT)
                       or ccontext >= EXPLICIT)
            if not allowed:
                return PATH_NONE, 0
            if cast.method == "f":
                return PATH_FUNC, cast.func
            if cast.method == "b":
                return PATH_RELABEL, 0
            return PATH_COERCEVIAIO, 0
        result = PATH_NONE
        telem = self.cat.element_type(target)
        selem = self.cat.element_type(source)
        if (telem and selem
                and self.cat.type(target).typname not in ("oidvector", "int2vector")
                and self.coercion_pathway(telem, selem, ccontext)[0] != PATH_NONE):
            result = PATH_ARRAYCOERCE
        if result == PATH_NONE and (
                (ccontext >= ASSIGNMENT and self.cat.category(target)[0] == STRING_CATEGORY)
                or (ccontext >= EXPLICIT and self.cat.category(source)[0] == STRING_CATEGORY)):
            result = PATH_COERCEVIAIO
        return result, 0

    def can_coerce(self, inputs: Sequence[int], targets: Sequence[int], ccontext: int) -> bool:
        generics = False
        for inp, tgt in zip(inputs, targets, strict=True):
            if inp == tgt or tgt == ANY:
                continue
            if tgt in POLYMORPHIC:
                generics = True
                continue
            if inp == UNKNOWN:
                continue
            if self.coercion_pathway(tgt, inp, ccontext)[0] != PATH_NONE:
                continue
            if tgt == RECORD and self.cat.type(inp).typtype == "c":
                continue
            return False
        if generics:
            try:
                self.resolve_generic(inputs, targets)
            except _GenericMismatch:
                return False
        return True

    def resolve_generic(self, inputs: Sequence[int], declared: Sequence[int]) -> dict[int, int]:
        """check/enforce_generic_type_consistency: the actual type of each polymorphic
        pseudo-type (anyelement, anyarray, anycompatible...)."""
        elem = 0
        array = 0
        compat: list[int] = []
        compat_nonarray = False
        nonarray = enum = False
        for inp, dec in zip(inputs, declared, strict=True):
            if dec in (ANYELEMENT, ANYNONARRAY, ANYENUM):
                nonarray |= dec == ANYNONARRAY
                enum |= dec == ANYENUM
                if inp == UNKNOWN:
                    continue
                inp = self.cat.base_type(inp)
                if elem and inp != elem:
                    raise _GenericMismatch
                elem = inp
            elif dec == ANYARRAY:
                if inp == UNKNOWN:
                    continue
                inp = self.cat.base_type(inp)
                if array and inp != array:
                    raise _GenericMismatch
                array = inp
            elif dec in (ANYCOMPATIBLE, ANYCOMPATIBLENONARRAY):
                compat_nonarray |= dec == ANYCOMPATIBLENONARRAY
                if inp != UNKNOWN:
                    compat.append(self.cat.base_type(inp))
            elif dec == ANYCOMPATIBLEARRAY:
                if inp == UNKNOWN:
                    continue
                e = self.cat.element_type(self.cat.base_type(inp))
                if not e:
                    raise _GenericMismatch
                compat.append(e)
            elif (dec in (ANYRANGE, ANYMULTIRANGE, ANYCOMPATIBLERANGE, ANYCOMPATIBLEMULTIRANGE)
                  and inp != UNKNOWN):
                raise _GenericMismatch  # ranges are not supported here
        if array:
            ae = self.cat.element_type(array)
            if not ae:
                raise _GenericMismatch
            if not elem:
                elem = ae
            elif ae != elem:
                raise _GenericMismatch
        if elem:
            if nonarray and self.cat.element_type(elem):
                raise _GenericMismatch
            if enum and self.cat.type(elem).typtype != "e":
                raise _GenericMismatch
        out: dict[int, int] = {}
        if elem:
            out[ANYELEMENT] = out[ANYNONARRAY] = out[ANYENUM] = elem
            out[ANYARRAY] = array or self.cat.array_type(elem)
        if compat:
            common = self._common_type_of_oids(compat)
            if not common or (compat_nonarray and self.cat.element_type(common)):
                raise _GenericMismatch
            out[ANYCOMPATIBLE] = out[ANYCOMPATIBLENONARRAY] = common
            out[ANYCOMPATIBLEARRAY] = self.cat.array_type(common)
        return out

    def enforce_generic(self, inputs: list[int], declared: list[int],
                        rettype: int) -> tuple[list[int], int]:
        if not any(d in POLYMORPHIC for d in [*declared, rettype]):
            return declared, rettype
        try:
            actual = self.resolve_generic(inputs, declared)
        except _GenericMismatch:
            raise self.error("arguments declared as polymorphic do not match") from None
        if any(d in POLYMORPHIC and d not in actual for d in [*declared, rettype]):
            if ANYCOMPATIBLE in declared or ANYCOMPATIBLEARRAY in declared:
                actual.setdefault(ANYCOMPATIBLE, TEXT)
                actual.setdefault(ANYCOMPATIBLENONARRAY, TEXT)
                actual.setdefault(ANYCOMPATIBLEARRAY, self.cat.array_type(TEXT))
            else:
                raise self.error("could not determine polymorphic type because input has "
                                 "type unknown")
        return ([actual.get(d, d) for d in declared], actual.get(rettype, rettype))

    def make_fn_arguments(self, args: list[n.Expr], declared: list[int]) -> list[n.Expr]:
        out = []
        for a, d in zip(args, declared, strict=True):
            if a.rtype != d and d != ANY:
                a = self.coerce_type(a, a.rtype, d, -1, IMPLICIT, "implicit")
            out.append(a)
        return out

    def coerce_type(self, node: n.Expr, source: int, target: int, typmod: int, ccontext: int,
                    fmt: str) -> n.Expr:
        """coerce_type (the caller has checked that the coercion is possible)."""
        if source == target or target == ANY or target in POLYMORPHIC:
            return node
        if source == UNKNOWN and isinstance(node, n.Const):
            return self.coerce_unknown_const(node, target)
        path, func = self.coercion_pathway(target, source, ccontext)
        if path == PATH_NONE:
            raise self.error(f"cannot cast type {self.tname(source)} to {self.tname(target)}",
                             location=node.location)
        return self.build_coercion(node, path, func, target, typmod, ccontext, fmt)

    def build_coercion(self, node: n.Expr, path: int, func: int, target: int, typmod: int,
                       ccontext: int, fmt: str) -> n.Expr:
        if path == PATH_FUNC:
            proc = self.cat.proc(func)
            args: list[n.Expr] = [node]
            if len(proc.argtypes) >= 2:
                args.append(n.Const(INT4, value=typmod))
            if len(proc.argtypes) == 3:
                args.append(n.Const(BOOL, value=ccontext == EXPLICIT))
            return n.FuncExpr(target, typmod=typmod if len(proc.argtypes) >= 2 else -1,
                              proc=proc, args=args, fmt=fmt, location=node.location)
        if path == PATH_RELABEL:
            return n.RelabelType(target, typmod=-1, arg=node, location=node.location)
        if path == PATH_ARRAYCOERCE:
            return n.ArrayCoerceExpr(target, arg=node, location=node.location)
        io = [self.io_proc(node.rtype, "out"), self.io_proc(target, "in")]
        return n.CoerceViaIO(target, arg=node, io_procs=[p for p in io if p is not None],
                             location=node.location)

    def io_proc(self, typ: int, which: str) -> ProcInfo | None:
        rows = self.cat._rows(f"SELECT typ{which}put::oid::int FROM pg_type WHERE oid = %s",
                              (typ,))
        return self.cat.proc(rows[0][0]) if rows and rows[0][0] else None

    def coerce_unknown_const(self, node: n.Const, target: int) -> n.Const:
        base = self.cat.base_type(target)
        if node.text is None:  # NULL
            value = None
        elif target >= FIRST_NORMAL_OBJECT_ID:
            value = None  # refused later (user-defined type); not converted
        else:
            value = self.const_input(base, node.text)
        return n.Const(target, value=value, text=node.text, location=node.location,
                       collation=self.cat.type(target).collation)

    def coerce_type_typmod(self, node: n.Expr, target: int, typmod: int, ccontext: int,
                           fmt: str) -> n.Expr:
        if typmod < 0 or typmod == node.typmod:
            return node
        base = self.cat.base_type(target)
        cast = self.cat.cast(base, base)
        if cast is not None and cast.func:
            return self.build_coercion(node, PATH_FUNC, cast.func, target, typmod, ccontext,
                                       fmt)
        return n.RelabelType(target, typmod=typmod, arg=node, location=node.location)

    def coerce_to_target_type(self, node: n.Expr, source: int, target: int, typmod: int,
                              ccontext: int, fmt: str) -> n.Expr | None:
        if not self.can_coerce([source], [target], ccontext):
            return None
        result = self.coerce_type(node, source, target, typmod, ccontext, fmt)
        return self.coerce_type_typmod(result, target, typmod, ccontext, fmt)

    def coerce_to_boolean(self, node: n.Expr, construct: str) -> n.Expr:
        if node.rtype != BOOL:
            coerced = self.coerce_to_target_type(node, node.rtype, BOOL, -1, ASSIGNMENT,
                                                 "implicit")
            if coerced is None:
                raise self.error(f"argument of {construct} must be type boolean, not type "
                                 f"{self.tname(node.rtype)}", location=node.location)
            node = coerced
        return node

    def _common_type_of_oids(self, types: list[int]) -> int:
        return self.select_common_type([n.Expr(t) for t in types], None)

    def select_common_type(self, exprs: list[n.Expr], context: str | None) -> int:
        ptype = exprs[0].rtype
        if ptype != UNKNOWN and all(e.rtype == ptype for e in exprs):
            return ptype
        ptype = self.cat.base_type(ptype) if ptype != UNKNOWN else UNKNOWN
        pcat, ppref = self.cat.category(ptype) if ptype != UNKNOWN else ("X", False)
        for e in exprs[1:]:
            ntype = self.cat.base_type(e.rtype) if e.rtype != UNKNOWN else UNKNOWN
            if ntype == UNKNOWN or ntype == ptype:
                continue
            ncat, npref = self.cat.category(ntype)
            if ptype == UNKNOWN:
                ptype, pcat, ppref = ntype, ncat, npref
            elif ncat != pcat:
                if context is None:
                    return 0
                raise self.error(f"{context} types {self.tname(ptype)} and "
                                 f"{self.tname(ntype)} cannot be matched",
                                 location=e.location)
            elif (not ppref and self.can_coerce([ptype], [ntype], IMPLICIT)
                  and not self.can_coerce([ntype], [ptype], IMPLICIT)):
                ptype, pcat, ppref = ntype, ncat, npref
        return TEXT if ptype == UNKNOWN else ptype

    def verify_common_type(self, common: int, exprs: list[n.Expr]) -> bool:
        return all(self.can_coerce([e.rtype], [common], IMPLICIT) for e in exprs)

    def coerce_to_common_type(self, node: n.Expr, target: int, context: str) -> n.Expr:
        if node.rtype == target:
            return node
        if not self.can_coerce([node.rtype], [target], IMPLICIT):
            raise self.error(f"{context} could not convert type {self.tname(node.rtype)} to "
                             f"{self.tname(target)}", location=node.location)
        return self.coerce_type(node, node.rtype, target, -1, IMPLICIT, "implicit")

    def type_from_name(self, tn: ast.TypeName) -> tuple[int, int]:
        if tn.setof or tn.pct_type:
            raise NotSupportedError(f"type {render(tn)} is not supported in row filters")
        try:
            return self.cat.resolve_type_name(render(tn))
        except Exception as exc:
            raise self.error(str(exc).split("\n")[0], location=_loc(tn)) from None

    # --- collations (parse_collate.c) --------------------------------------------------------

    def assign_collations(self, node: n.Expr) -> tuple[int, int]:
        """assign_expr_collations: sets collation and input_collation bottom-up; returns
        (collation, strength) of the node."""
        if isinstance(node, n.CollateExpr):
            assert node.arg is not None
            self.assign_collations(node.arg)
            return node.collation, C_EXPLICIT
        if isinstance(node, (n.Var, n.Const, n.CaseTestExpr)):
            if not self.collatable(node.rtype):
                node.collation = 0
                return 0, C_NONE
            if isinstance(node, n.Const) and not node.collation:
                node.collation = self.cat.type(self.cat.base_type(node.rtype)).collation
            return node.collation, C_IMPLICIT if node.collation else C_NONE
        children = node.children()
        if isinstance(node, n.CaseExpr):
            for cond, _ in node.whens:
                self.assign_collations(cond)
            if node.arg is not None:
                self.assign_collations(node.arg)
            children = [r for _, r in node.whens] + ([node.default] if node.default else [])
        state = (0, C_NONE)
        conflict: tuple[int, int] | None = None
        for child in children:
            coll, strength = self.assign_collations(child)
            state, conflict = self._merge(state, (coll, strength), conflict, child.location)
        coll, strength = state
        if self.collatable(node.rtype):
            if strength == C_NONE:
                coll = self.cat.type(self.cat.base_type(node.rtype)).collation
                strength = C_IMPLICIT
        else:
            coll, strength = 0, C_NONE
        node.collation = 0 if strength == C_CONFLICT else coll
        node.input_collation = 0 if state[1] == C_CONFLICT else state[0]
        if state[1] == C_CONFLICT and conflict is not None:
            node.conflict = conflict  # type: ignore[attr-defined]
        return node.collation, strength

    def _merge(self, ctx: tuple[int, int], new: tuple[int, int],
               conflict: tuple[int, int] | None,
               location: int) -> tuple[tuple[int, int], tuple[int, int] | None]:
        coll, strength = new
        ccoll, cstrength = ctx
        if strength > cstrength:
            return new, None
        if strength < cstrength or strength == C_NONE:
            return ctx, conflict
        if strength == C_IMPLICIT and coll != ccoll:
            if ccoll == DEFAULT_COLLATION:
                return new, None
            if coll != DEFAULT_COLLATION:
                return (ccoll, C_CONFLICT), (ccoll, coll)
            return ctx, conflict
        if strength == C_CONFLICT:
            return ctx, conflict
        if strength == C_EXPLICIT and coll != ccoll:
            raise self.error(
                f'collation mismatch between explicit collations "{self.coll_name(ccoll)}" '
                f'and "{self.coll_name(coll)}"', location=location)
        return ctx, conflict

    def coll_name(self, oid: int) -> str:
        return self.cat.collation(oid).name

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


class _GenericMismatch(Exception):
    pass


def _items(value: Any) -> tuple[Any, ...]:
    """A pglast list attribute as a tuple (absent: empty)."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _loc(raw: Any) -> int:
    loc = getattr(raw, "location", None)
    return loc if isinstance(loc, int) else -1


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
