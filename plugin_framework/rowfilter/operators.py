"""Operator lookup (parse_oper.c) and the choice among candidate functions and operators
(func_select_candidate, parse_func.c) for a row filter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import plugin_framework.rowfilter.nodes as n
from plugin_framework.pgtypes.oids import BOOL, UNKNOWN
from plugin_framework.rowfilter.coerce import Coercion
from plugin_framework.rowfilter.parse_state import IMPLICIT
from plugin_framework.rowfilter.pgcatalog import STRING_CATEGORY, OperInfo


class OperatorLookup(Coercion):
    """Finding the operator or function a name and argument types denote."""

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
