"""Type coercion and collations of a row filter: parse_coerce.c and parse_collate.c."""

from __future__ import annotations

from collections.abc import Sequence

from pglast import ast

import plugin_framework.rowfilter.nodes as n
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
    RECORD,
    TEXT,
    UNKNOWN,
)
from plugin_framework.rowfilter.errors import NotSupportedError
from plugin_framework.rowfilter.parse_state import (
    ASSIGNMENT,
    C_CONFLICT,
    C_EXPLICIT,
    C_IMPLICIT,
    C_NONE,
    EXPLICIT,
    IMPLICIT,
    PATH_ARRAYCOERCE,
    PATH_COERCEVIAIO,
    PATH_FUNC,
    PATH_NONE,
    PATH_RELABEL,
    ParseState,
    raw_location,
    render,
)
from plugin_framework.rowfilter.pgcatalog import (
    DEFAULT_COLLATION,
    FIRST_NORMAL_OBJECT_ID,
    POLYMORPHIC,
    STRING_CATEGORY,
    ProcInfo,
)


class Coercion(ParseState):
    """Coercing expressions to types (parse_coerce.c) and assigning collations
    (parse_collate.c)."""

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
            raise self.error(str(exc).split("\n")[0], location=raw_location(tn)) from None

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


class _GenericMismatch(Exception):
    pass

