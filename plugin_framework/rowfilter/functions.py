"""The immutable built-in functions a row filter may call, with PostgreSQL's semantics, keyed
by the function's C symbol (pg_proc.prosrc) — or ``sql:name/nargs`` for the SQL-language
ones — so that every operator and cast that shares an implementation shares this one.

Values are what psycopg's loaders give: int, Decimal, float, str, bool, bytes, date,
datetime, time, timedelta, UUID. Errors are raised as PostgreSQL raises them (integer out of
range, division by zero...).
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_DOWN, ROUND_HALF_UP, Context, Decimal, localcontext
from typing import Any

from plugin_framework.pgtypes.oids import (
    BOOL,
    BPCHAR,
    BYTEA,
    CHAR,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    NAME,
    NUMERIC,
    OID,
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    UUID,
    VARCHAR,
)
from plugin_framework.rowfilter.casemap import CaseMap
from plugin_framework.rowfilter.errors import EvaluationError, NotSupportedError
from plugin_framework.rowfilter.pgcatalog import CollationInfo, ProcInfo

Fn = Callable[..., Any]


@dataclass
class Ctx:
    """What an implementation may need to know about its call."""

    proc: ProcInfo
    argtypes: list[int]
    rettype: int
    collation: CollationInfo | None  # the input collation; None: not determinable
    casemap: Callable[[CollationInfo], CaseMap] | None = None  # the server's, for a collation


Factory = Callable[[Ctx], Fn]
IMPLS: dict[str, Factory] = {}


def impl(*keys: str) -> Callable[[Factory], Factory]:
    def register(factory: Factory) -> Factory:
        for k in keys:
            IMPLS[k] = factory
        return factory
    return register


def fixed(fn: Fn) -> Factory:
    """A factory for a function whose behaviour does not depend on the call."""
    def factory(ctx: Ctx) -> Fn:
        return fn
    return factory


def simple(*keys: str) -> Callable[[Fn], Fn]:
    """Register a plain function (its behaviour does not depend on the call)."""
    def register(fn: Fn) -> Fn:
        for k in keys:
            IMPLS[k] = fixed(fn)
        return fn
    return register


def error(message: str, detail: str | None = None) -> EvaluationError:
    return EvaluationError(message, detail=detail)


# --- integers ----------------------------------------------------------------------------------

INT_RANGE = {INT2: (-2**15, 2**15 - 1, "smallint"), INT4: (-2**31, 2**31 - 1, "integer"),
             INT8: (-2**63, 2**63 - 1, "bigint"), OID: (0, 2**32 - 1, "oid")}


def int_range(typ: int) -> Callable[[int], int]:
    lo, hi, name = INT_RANGE[typ]

    def check(v: int) -> int:
        if v < lo or v > hi:
            raise error(f"{name} out of range")
        return v
    return check


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _trunc_mod(a: int, b: int) -> int:
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


_INT_PREFIXES = {"int2": (INT2, INT2), "int4": (INT4, INT4), "int8": (INT8, INT8),
                 "int24": (INT2, INT4), "int42": (INT4, INT2), "int28": (INT2, INT8),
                 "int82": (INT8, INT2), "int48": (INT4, INT8), "int84": (INT8, INT4)}
_CMP = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
        "gt": operator.gt, "ge": operator.ge}

for _p in _INT_PREFIXES:
    for _s, _f in _CMP.items():
        IMPLS[_p + _s] = fixed(_f)
for _s, _f in _CMP.items():
    for _p in ("oid", "bool", "char", "date_", "time_", "timestamp_", "interval_", "uuid_",
               "bytea"):
        IMPLS[_p + _s] = fixed(_f)


@impl(*[p + op for p in _INT_PREFIXES for op in ("pl", "mi", "mul", "div")],
      "int2mod", "int4mod", "int8mod")
def _int_arith(ctx: Ctx) -> Fn:
    check = int_range(ctx.rettype)
    key = ctx.proc.prosrc
    if key.endswith("pl"):
        return lambda a, b: check(a + b)
    if key.endswith("mi"):
        return lambda a, b: check(a - b)
    if key.endswith("mul"):
        return lambda a, b: check(a * b)

    if key.endswith("div"):
        def div(a: int, b: int) -> int:
            if b == 0:
                raise error("division by zero")
            return check(_trunc_div(a, b))
        return div

    def mod(a: int, b: int) -> int:
        if b == 0:
            raise error("division by zero")
        return _trunc_mod(a, b)
    return mod


@impl("int2um", "int4um", "int8um")
def _int_um(ctx: Ctx) -> Fn:
    check = int_range(ctx.rettype)
    return lambda a: check(-a)


@impl("int2up", "int4up", "int8up", "numeric_uplus", "float4up", "float8up")
def _identity(ctx: Ctx) -> Fn:
    return lambda a: a


@impl("int2abs", "int4abs", "int8abs")
def _int_abs(ctx: Ctx) -> Fn:
    check = int_range(ctx.rettype)
    return lambda a: check(abs(a))


@impl("int2and", "int4and", "int8and")
def _int_and(ctx: Ctx) -> Fn:
    return lambda a, b: a & b


@impl("int2or", "int4or", "int8or")
def _int_or(ctx: Ctx) -> Fn:
    return lambda a, b: a | b


@impl("int2xor", "int4xor", "int8xor")
def _int_xor(ctx: Ctx) -> Fn:
    return lambda a, b: a ^ b


@impl("int2not", "int4not", "int8not")
def _int_not(ctx: Ctx) -> Fn:
    return lambda a: ~a


@impl("int2shl", "int4shl", "int8shl", "int2shr", "int4shr", "int8shr")
def _int_shift(ctx: Ctx) -> Fn:
    bits = {INT2: 16, INT4: 32, INT8: 64}[ctx.rettype]
    left = ctx.proc.prosrc.endswith("shl")

    def wrap(v: int) -> int:
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >= 1 << (bits - 1) else v

    def shift(a: int, n: int) -> int:
        n &= bits - 1 if bits == 64 else 31  # C's shift count, as the hardware takes it
        return wrap(a << n) if left else a >> n
    return shift


# --- numeric -----------------------------------------------------------------------------------

NUMERIC_CTX = Context(prec=2000, rounding=ROUND_HALF_UP, Emax=999999, Emin=-999999, traps=[])
NUMERIC_MIN_SIG_DIGITS = 16
NUMERIC_MAX_DISPLAY_SCALE = 1000


def dscale(d: Decimal) -> int:
    exp = d.as_tuple().exponent
    return max(0, -exp) if isinstance(exp, int) else 0


def _weight_firstdigit(d: Decimal) -> tuple[int, int]:
    """The base-10000 weight and first base-10000 digit of |d| (PostgreSQL's NumericVar)."""
    if d.is_zero():
        return 0, 0
    a = abs(d)
    w = a.adjusted() // 4
    first = int(a.scaleb(-4 * w, NUMERIC_CTX).to_integral_value(ROUND_DOWN))
    return w, first


def select_div_scale(a: Decimal, b: Decimal) -> int:
    w1, f1 = _weight_firstdigit(a)
    w2, f2 = _weight_firstdigit(b)
    qweight = w1 - w2
    if f1 <= f2:
        qweight -= 1
    rscale = NUMERIC_MIN_SIG_DIGITS - qweight * 4
    rscale = max(rscale, dscale(a), dscale(b), 0)
    return min(rscale, NUMERIC_MAX_DISPLAY_SCALE)


def numeric_cmp(a: Decimal, b: Decimal) -> int:
    an, bn = a.is_nan(), b.is_nan()
    if an or bn:
        return int(an) - int(bn)
    return (a > b) - (a < b)


def _numcmp(f: Callable[[int, int], bool]) -> Fn:
    return lambda a, b: f(numeric_cmp(a, b), 0)


for _s, _f in _CMP.items():
    IMPLS["numeric_" + _s] = fixed(_numcmp(_f))


def _nan_inf(*values: Decimal) -> bool:
    return any(not v.is_finite() for v in values)


@simple("numeric_add")
def numeric_add(a: Decimal, b: Decimal) -> Decimal:
    return NUMERIC_CTX.add(a, b)


@simple("numeric_sub")
def numeric_sub(a: Decimal, b: Decimal) -> Decimal:
    return NUMERIC_CTX.subtract(a, b)


@simple("numeric_mul")
def numeric_mul(a: Decimal, b: Decimal) -> Decimal:
    return NUMERIC_CTX.multiply(a, b)


def numeric_from_text(text: str) -> Decimal:
    """A finite numeric's text (digits, an optional point and exponent, ``_`` separators) as
    numeric_in reads it: its display scale is the digits after the point less the exponent,
    never below 0, so ``1e3`` is 1000 (scale 0), as ``2.5 * 1e3`` then prints 2500.0."""
    d = Decimal(text.replace("_", ""))
    exponent = d.as_tuple().exponent
    if isinstance(exponent, int) and exponent > 0:
        return d.quantize(Decimal(1), context=NUMERIC_CTX)
    return d


def round_scale(d: Decimal, scale: int, rounding: str = ROUND_HALF_UP) -> Decimal:
    if not d.is_finite():
        return d
    return d.quantize(Decimal(1).scaleb(-scale), rounding=rounding, context=NUMERIC_CTX)


def _div_special(a: Decimal, b: Decimal) -> Decimal | None:
    """numeric_div_opt_error's handling of NaN and infinities (None: both finite)."""
    if a.is_finite() and b.is_finite():
        return None
    if a.is_nan() or b.is_nan():
        return Decimal("NaN")
    if a.is_infinite():
        if not b.is_finite():
            return Decimal("NaN")
        if b.is_zero():
            raise error("division by zero")
        return a if b > 0 else -a
    return Decimal(0)  # finite / infinite


@simple("numeric_div")
def numeric_div(a: Decimal, b: Decimal) -> Decimal:
    special = _div_special(a, b)
    if special is not None:
        return special
    if b.is_zero():
        raise error("division by zero")
    scale = select_div_scale(a, b)
    if a.is_zero():
        return round_scale(Decimal(0), scale)
    with localcontext(NUMERIC_CTX) as c:
        c.prec = max(a.adjusted() - b.adjusted(), 0) + scale + 10
        return round_scale(a / b, scale)


@simple("numeric_div_trunc")
def numeric_div_trunc(a: Decimal, b: Decimal) -> Decimal:
    special = _div_special(a, b)
    if special is not None:
        return special
    if b.is_zero():
        raise error("division by zero")
    return NUMERIC_CTX.divide_int(a, b)


@simple("numeric_mod")
def numeric_mod(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan():
        return Decimal("NaN")
    if a.is_infinite():
        if b.is_zero():
            raise error("division by zero")
        return Decimal("NaN")
    if b.is_infinite():
        return a
    if b.is_zero():
        raise error("division by zero")
    return NUMERIC_CTX.remainder(a, b)


@simple("numeric_uminus")
def numeric_uminus(a: Decimal) -> Decimal:
    return NUMERIC_CTX.minus(a) if not a.is_nan() else a


@simple("numeric_abs")
def numeric_abs(a: Decimal) -> Decimal:
    return NUMERIC_CTX.abs(a) if not a.is_nan() else a


@simple("numeric_sign")
def numeric_sign(a: Decimal) -> Decimal:
    if a.is_nan():
        return a
    return Decimal(0) if a.is_zero() else Decimal(1 if a > 0 else -1)


@simple("numeric_round")
def numeric_round(a: Decimal, scale: int) -> Decimal:
    return _round_at(a, scale, ROUND_HALF_UP)


@simple("numeric_trunc")
def numeric_trunc(a: Decimal, scale: int) -> Decimal:
    return _round_at(a, scale, ROUND_DOWN)


def _round_at(a: Decimal, scale: int, rounding: str) -> Decimal:
    if not a.is_finite():
        return a
    scale = max(min(scale, NUMERIC_MAX_DISPLAY_SCALE), -NUMERIC_MAX_DISPLAY_SCALE)
    r = a.quantize(Decimal(1).scaleb(-scale), rounding=rounding, context=NUMERIC_CTX)
    return r if scale >= 0 else r.quantize(Decimal(1), context=NUMERIC_CTX)


IMPLS["sql:round/1"] = lambda ctx: (lambda a: numeric_round(a, 0))
IMPLS["sql:trunc/1"] = lambda ctx: (lambda a: numeric_trunc(a, 0))


@simple("numeric_ceil")
def numeric_ceil(a: Decimal) -> Decimal:
    return a if not a.is_finite() else a.to_integral_value("ROUND_CEILING")


@simple("numeric_floor")
def numeric_floor(a: Decimal) -> Decimal:
    return a if not a.is_finite() else a.to_integral_value("ROUND_FLOOR")


@impl("numeric")
def _numeric_typmod(ctx: Ctx) -> Fn:
    def apply(a: Decimal, typmod: int) -> Decimal:
        return numeric_apply_typmod(a, typmod)
    return apply


def numeric_apply_typmod(a: Decimal, typmod: int) -> Decimal:
    """apply_typmod: round to the scale, check the precision."""
    if typmod < 4 or a.is_nan():
        return a
    tm = typmod - 4
    precision = (tm >> 16) & 0xFFFF
    scale = ((tm & 0x7FF) ^ 1024) - 1024
    if a.is_infinite():
        raise error("numeric field overflow",
                    f"A field with precision {precision}, scale {scale} cannot hold an "
                    "infinite value.")
    r = a.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=NUMERIC_CTX)
    maxdigits = precision - scale
    if not r.is_zero() and r.adjusted() >= maxdigits:
        raise error("numeric field overflow",
                    f"A field with precision {precision}, scale {scale} must round to an "
                    f"absolute value less than {'10^' + str(maxdigits) if maxdigits else '1'}.")
    return r


def _numeric_to_int(ctx: Ctx) -> Fn:
    check = int_range(ctx.rettype)
    name = INT_RANGE[ctx.rettype][2]

    def conv(a: Decimal) -> int:
        if a.is_nan():
            raise error(f"cannot convert NaN to {name}")
        if a.is_infinite():
            raise error(f"cannot convert infinity to {name}")
        return check(int(a.to_integral_value(ROUND_HALF_UP)))
    return conv


IMPLS["numeric_int2"] = IMPLS["numeric_int4"] = IMPLS["numeric_int8"] = _numeric_to_int


@simple("int2_numeric", "int4_numeric", "int8_numeric")
def int_numeric(a: int) -> Decimal:
    return Decimal(a)


@impl("numeric_float8", "numeric_float4")
def _numeric_float(ctx: Ctx) -> Fn:
    f4 = ctx.rettype == FLOAT4

    def conv(a: Decimal) -> float:
        if a.is_nan():
            return math.nan
        v = float(a)
        if math.isinf(v) and a.is_finite():
            raise error(f'"{a}" is out of range for type '
                        f'{"real" if f4 else "double precision"}')
        return to_float4(v) if f4 else v
    return conv


@simple("float8_numeric")
def float8_numeric(a: float) -> Decimal:
    return _float_to_numeric(a, 15)


@simple("float4_numeric")
def float4_numeric(a: float) -> Decimal:
    return _float_to_numeric(a, 6)


def _float_to_numeric(a: float, digits: int) -> Decimal:
    if math.isnan(a):
        return Decimal("NaN")
    if math.isinf(a):
        return Decimal("Infinity") if a > 0 else Decimal("-Infinity")
    d = Decimal(f"{a:.{digits}g}")
    return d if d.as_tuple().exponent <= 0 else Decimal(int(d))  # type: ignore[operator]


# --- floats ------------------------------------------------------------------------------------

def to_float4(v: float) -> float:
    try:
        return float(struct.unpack("f", struct.pack("f", v))[0])
    except OverflowError:
        return math.copysign(math.inf, v)


def _floatcmp(f: Callable[[int, int], bool]) -> Fn:
    return lambda a, b: f(float_cmp(a, b), 0)


def float_cmp(a: float, b: float) -> int:
    an, bn = math.isnan(a), math.isnan(b)
    if an or bn:
        return int(an) - int(bn)
    return (a > b) - (a < b)


for _p in ("float4", "float8", "float48", "float84"):
    for _s, _f in _CMP.items():
        IMPLS[_p + _s] = fixed(_floatcmp(_f))


def _float_result(f4: bool) -> Callable[[float, float, float, bool], float]:
    def check(result: float, a: float, b: float, zero_ok: bool) -> float:
        if f4:
            result = to_float4(result)
        if math.isinf(result) and not math.isinf(a) and not math.isinf(b):
            raise error("value out of range: overflow")
        if result == 0.0 and not zero_ok:
            raise error("value out of range: underflow")
        return result
    return check


@impl(*[p + op for p in ("float4", "float8", "float48", "float84")
        for op in ("pl", "mi", "mul", "div")])
def _float_arith(ctx: Ctx) -> Fn:
    check = _float_result(ctx.rettype == FLOAT4)
    key = ctx.proc.prosrc
    if key.endswith("pl"):
        return lambda a, b: check(a + b, a, b, True)
    if key.endswith("mi"):
        return lambda a, b: check(a - b, a, b, True)
    if key.endswith("mul"):
        return lambda a, b: check(a * b, a, b, a == 0.0 or b == 0.0)

    def div(a: float, b: float) -> float:
        if b == 0.0:
            if not math.isnan(a):
                raise error("division by zero")
            return math.nan
        if math.isnan(b):
            return math.nan
        return check(a / b, a, 0.0, a == 0.0 or math.isinf(b))
    return div


@simple("float4um", "float8um")
def float_um(a: float) -> float:
    return -a


@simple("float4abs", "float8abs")
def float_abs(a: float) -> float:
    return abs(a)


@simple("dround")
def dround(a: float) -> float:
    return a if math.isinf(a) or math.isnan(a) else float(round(a))  # rint: half to even


@simple("dtrunc")
def dtrunc(a: float) -> float:
    return a if math.isinf(a) or math.isnan(a) else float(math.trunc(a))


@simple("dceil")
def dceil(a: float) -> float:
    return a if math.isinf(a) or math.isnan(a) else float(math.ceil(a))


@simple("dfloor")
def dfloor(a: float) -> float:
    return a if math.isinf(a) or math.isnan(a) else float(math.floor(a))


@simple("dsign")
def dsign(a: float) -> float:
    return 1.0 if a > 0 else -1.0 if a < 0 else 0.0  # NaN: 0, as in C


@simple("dsqrt")
def dsqrt(a: float) -> float:
    if a < 0:
        raise error("cannot take square root of a negative number")
    return math.sqrt(a)


@impl("i2tod", "i4tod", "i8tod", "i2tof", "i4tof", "i8tof", "ftod")
def _to_float(ctx: Ctx) -> Fn:
    if ctx.rettype == FLOAT4:
        return lambda a: to_float4(float(a))
    return float


@simple("dtof")
def dtof(a: float) -> float:
    r = to_float4(a)
    if math.isinf(r) and not math.isinf(a):
        raise error("value out of range: overflow")
    if r == 0.0 and a != 0.0:
        raise error("value out of range: underflow")
    return r


@impl("dtoi2", "dtoi4", "dtoi8", "ftoi2", "ftoi4", "ftoi8")
def _float_to_int(ctx: Ctx) -> Fn:
    lo, hi, name = INT_RANGE[ctx.rettype]

    def conv(a: float) -> int:
        if math.isnan(a) or math.isinf(a):
            raise error(f"{name} out of range")
        v = round(a)  # rint(): half to even
        if v < lo or v > hi:
            raise error(f"{name} out of range")
        return v
    return conv


@impl("i4toi2", "i2toi4", "int28", "int82", "int48", "int84", "i8tooid", "oidtoi8")
def _int_to_int(ctx: Ctx) -> Fn:
    return int_range(ctx.rettype)


@simple("booltext")
def booltext(a: bool) -> str:
    return "true" if a else "false"


@simple("chartoi4")
def chartoi4(a: str) -> int:
    b = a.encode()[:1]
    return int.from_bytes(b, "big", signed=True)


@simple("i4tochar")
def i4tochar(a: int) -> str:
    if a < -128 or a > 127:
        raise error('"char" out of range')
    return bytes([a & 0xFF]).decode("latin-1") if a else ""


@simple("int4_bool")
def int4_bool(a: int) -> bool:
    return a != 0


@simple("bool_int4")
def bool_int4(a: bool) -> int:
    return int(a)


# --- text --------------------------------------------------------------------------------------

def _needs_code_point_order(ctx: Ctx) -> None:
    coll = ctx.collation
    if coll is None:
        raise EvaluationError("could not determine which collation to use for string "
                              "comparison",
                              hint="Use the COLLATE clause to set the collation explicitly.")
    if not coll.code_point_order:
        source = {"c": "the C library's strcoll", "i": "ICU's collator"}.get(
            coll.provider, "the collation provider")
        raise NotSupportedError(
            f'pgdecode compares strings in code point order only, not in collation '
            f'"{coll.name}" ({coll.collate or coll.locale})',
            detail=f"That collation's order comes from {source}, which pgdecode does not "
                   "reproduce.",
            hint='Use COLLATE "C" in the filter, or a column whose collation is "C".')


def _needs_deterministic(ctx: Ctx) -> None:
    coll = ctx.collation
    if coll is None:
        raise EvaluationError("could not determine which collation to use for string "
                              "comparison",
                              hint="Use the COLLATE clause to set the collation explicitly.")
    if not coll.deterministic:
        raise NotSupportedError(f'nondeterministic collation "{coll.name}" is not supported '
                                "by pgdecode's row filters")


def _case_mapping(ctx: Ctx, what: str) -> CaseMap | None:
    """The server's case mapping under the call's collation; None for the "C" character
    classification (ASCII letters only)."""
    coll = ctx.collation
    if coll is None:
        raise EvaluationError(f"could not determine which collation to use for {what}",
                              hint="Use the COLLATE clause to set the collation explicitly.")
    if coll.ascii_ctype:
        return None
    if ctx.casemap is None:
        raise NotSupportedError(
            f'{what} under collation "{coll.name}" ({coll.ctype or coll.locale}) needs the '
            "server's case mapping, and no catalog connection was given")
    return ctx.casemap(coll)


def _text_cmp(f: Callable[[Any, Any], bool], transform: Callable[[str], str] | None = None,
              ordering: bool = True) -> Factory:
    def factory(ctx: Ctx) -> Fn:
        if ordering:
            _needs_code_point_order(ctx)
        else:
            _needs_deterministic(ctx)
        if transform is None:
            return f
        return lambda a, b: f(transform(a), transform(b))
    return factory


def bpchar_trim(s: str) -> str:
    return s.rstrip(" ")


def _trimmed(f: Callable[[Any, Any], bool]) -> Fn:
    return lambda a, b: f(bpchar_trim(a), bpchar_trim(b))


for _s, _f in _CMP.items():
    _ord = _s not in ("eq", "ne")
    IMPLS[{"eq": "texteq", "ne": "textne"}.get(_s, "text_" + _s)] = _text_cmp(_f, None, _ord)
    IMPLS["bpchar" + _s] = _text_cmp(_f, bpchar_trim, _ord)
    IMPLS["name" + _s] = fixed(_f)  # name: always collation "C"
    IMPLS["name" + _s + "text"] = _text_cmp(_f, None, _ord)
    IMPLS["text" + {"eq": "eq", "ne": "ne"}.get(_s, _s) + "name"] = _text_cmp(_f, None, _ord)
for _s in ("lt", "le", "gt", "ge"):
    IMPLS["text_pattern_" + _s] = fixed(_CMP[_s])
    IMPLS["bpchar_pattern_" + _s] = fixed(_trimmed(_CMP[_s]))


@simple("textcat")
def textcat(a: str, b: str) -> str:
    return a + b


@simple("byteacat")
def byteacat(a: bytes, b: bytes) -> bytes:
    return a + b


def ascii_lower(s: str) -> str:
    return s.translate(_LOWER)


def ascii_upper(s: str) -> str:
    return s.translate(_UPPER)


_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_UPPER = {c: c - 32 for c in range(ord("a"), ord("z") + 1)}


def ascii_initcap(s: str) -> str:
    """initcap under the "C" character classification: ASCII letters and digits make words."""
    out = []
    was_alnum = False
    for ch in s:
        out.append((ch.lower() if was_alnum else ch.upper()) if ch.isascii() else ch)
        was_alnum = ch.isascii() and ch.isalnum()
    return "".join(out)


@impl("lower")
def _lower(ctx: Ctx) -> Fn:
    cm = _case_mapping(ctx, "lower() function")
    return ascii_lower if cm is None else cm.lower


@impl("upper")
def _upper(ctx: Ctx) -> Fn:
    cm = _case_mapping(ctx, "upper() function")
    return ascii_upper if cm is None else cm.upper


@impl("initcap")
def _initcap(ctx: Ctx) -> Fn:
    cm = _case_mapping(ctx, "initcap() function")
    if cm is None:
        return ascii_initcap
    cm.check_initcap()
    return cm.initcap


@simple("textlen")
def textlen(a: str) -> int:
    return len(a)


@simple("bpcharlen")
def bpcharlen(a: str) -> int:
    return len(bpchar_trim(a))


@simple("textoctetlen", "bpcharoctetlen")
def octet_len(a: str) -> int:
    return len(a.encode())


@simple("byteaoctetlen")
def bytea_len(a: bytes) -> int:
    return len(a)


def _substr(s: str, start: int, count: int | None) -> str:
    if count is not None and count < 0:
        raise error("negative substring length not allowed")
    begin = max(start, 1)
    if count is None:
        return s[begin - 1:]
    end = start + count  # exclusive, 1-based
    if end <= begin:
        return ""
    return s[begin - 1:end - 1]


@simple("text_substr")
def text_substr(s: str, start: int, count: int) -> str:
    return _substr(s, start, count)


@simple("text_substr_no_len")
def text_substr_no_len(s: str, start: int) -> str:
    return _substr(s, start, None)


@simple("textpos")
def textpos(s: str, sub: str) -> int:
    return s.find(sub) + 1 if sub else 1


@simple("replace_text")
def replace_text(s: str, old: str, new: str) -> str:
    return s.replace(old, new) if old else s


@simple("text_left")
def text_left(s: str, k: int) -> str:
    return s[:k] if k >= 0 else s[:max(len(s) + k, 0)]


@simple("text_right")
def text_right(s: str, k: int) -> str:
    return (s[-k:] if k > 0 else "") if k >= 0 else s[min(-k, len(s)):]


@simple("text_reverse")
def text_reverse(s: str) -> str:
    return s[::-1]


@simple("repeat")
def repeat(s: str, k: int) -> str:
    return s * max(k, 0)


def _pad(s: str, length: int, fill: str, left: bool) -> str:
    length = max(length, 0)
    if len(s) >= length or not fill:
        return s[:length]
    need = length - len(s)
    padding = (fill * (need // len(fill) + 1))[:need]
    return padding + s if left else s + padding


@simple("lpad")
def lpad(s: str, length: int, fill: str) -> str:
    return _pad(s, length, fill, True)


@simple("rpad")
def rpad(s: str, length: int, fill: str) -> str:
    return _pad(s, length, fill, False)


IMPLS["sql:lpad/2"] = lambda ctx: (lambda s, n: _pad(s, n, " ", True))
IMPLS["sql:rpad/2"] = lambda ctx: (lambda s, n: _pad(s, n, " ", False))


@simple("btrim")
def btrim(s: str, chars: str) -> str:
    return s.strip(chars) if chars else s


@simple("btrim1")
def btrim1(s: str) -> str:
    return s.strip(" ")


@simple("ltrim")
def ltrim(s: str, chars: str) -> str:
    return s.lstrip(chars) if chars else s


@simple("ltrim1")
def ltrim1(s: str) -> str:
    return s.lstrip(" ")


@simple("rtrim")
def rtrim(s: str, chars: str) -> str:
    return s.rstrip(chars) if chars else s


@simple("rtrim1")
def rtrim1(s: str) -> str:
    return s.rstrip(" ")


@simple("text_starts_with")
def text_starts_with(s: str, prefix: str) -> bool:
    return s.startswith(prefix)


@simple("split_part")
def split_part(s: str, sep: str, field: int) -> str:
    if field == 0:
        raise error("field position must not be zero")
    parts = s.split(sep) if sep else [s]
    if field < 0:
        field = len(parts) + field + 1
        if field <= 0:
            return ""
    return parts[field - 1] if field <= len(parts) else ""


@simple("ascii")
def ascii_fn(s: str) -> int:
    return ord(s[0]) if s else 0


@simple("md5_text")
def md5_text(s: str) -> str:
    return hashlib.md5(s.encode()).hexdigest()


@simple("md5_bytea")
def md5_bytea(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


@simple("name_text", "text_name")
def name_text(s: str) -> str:
    return _truncate_bytes(s, 63)


def _truncate_bytes(s: str, limit: int) -> str:
    data = s.encode()
    if len(data) <= limit:
        return s
    return data[:limit].decode(errors="ignore")


@simple("bpchar_name")
def bpchar_name(s: str) -> str:
    return _truncate_bytes(bpchar_trim(s), 63)


@simple("name_bpchar", "char_text", "text_char", "char_bpchar")
def plain(s: str) -> str:
    return s


@impl("varchar")
def _varchar_typmod(ctx: Ctx) -> Fn:
    def apply(s: str, typmod: int, explicit: bool) -> str:
        maxlen = typmod - 4
        if typmod < 4 or len(s) <= maxlen:
            return s
        if not explicit and s[maxlen:].strip(" "):
            raise error(f"value too long for type character varying({maxlen})")
        return s[:maxlen]
    return apply


@impl("bpchar")
def _bpchar_typmod(ctx: Ctx) -> Fn:
    def apply(s: str, typmod: int, explicit: bool) -> str:
        maxlen = typmod - 4
        if typmod < 4:
            return s
        if len(s) > maxlen:
            if not explicit and s[maxlen:].strip(" "):
                raise error(f"value too long for type character({maxlen})")
            return s[:maxlen]
        return s.ljust(maxlen)
    return apply


# --- LIKE --------------------------------------------------------------------------------------

def like_regex(pattern: str) -> re.Pattern[str]:
    """A LIKE pattern (backslash escapes) as a Python regular expression."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
            if i >= len(pattern):
                raise error("LIKE pattern must not end with escape character")
            out.append(re.escape(pattern[i]))
        elif c == "%":
            out.append(".*")
        elif c == "_":
            out.append(".")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _like(fold: Callable[[str], str] | None, negate: bool, bytes_: bool = False) -> Fn:
    cache: dict[Any, re.Pattern[Any]] = {}

    def like(s: Any, pattern: Any) -> bool:
        rx = cache.get(pattern)
        if rx is None:
            if bytes_:
                text_rx = like_regex(pattern.decode("latin-1"))
                rx = re.compile(text_rx.pattern.encode("latin-1"), re.DOTALL)
            else:
                rx = like_regex(fold(pattern) if fold else pattern)
            if len(cache) < 256:
                cache[pattern] = rx
        subject = fold(s) if fold else s
        return (rx.fullmatch(subject) is None) if negate else (rx.fullmatch(subject) is not None)
    return like


@impl("textlike", "namelike")
def _textlike(ctx: Ctx) -> Fn:
    _needs_deterministic(ctx)
    return _like(None, False)


@impl("textnlike", "namenlike")
def _textnlike(ctx: Ctx) -> Fn:
    _needs_deterministic(ctx)
    return _like(None, True)


def _ilike_fold(ctx: Ctx) -> Callable[[str], str]:
    """ILIKE in a UTF-8 database is LIKE over lower() of both sides (like.c)."""
    cm = _case_mapping(ctx, "ILIKE")
    if cm is None:
        return ascii_lower
    _needs_deterministic(ctx)
    return cm.lower


@impl("texticlike", "nameiclike")
def _texticlike(ctx: Ctx) -> Fn:
    return _like(_ilike_fold(ctx), False)


@impl("texticnlike", "nameicnlike")
def _texticnlike(ctx: Ctx) -> Fn:
    return _like(_ilike_fold(ctx), True)


@simple("bytealike")
def _bytealike(s: bytes, p: bytes) -> bool:
    return bool(_like(None, False, True)(s, p))


@simple("byteanlike")
def _byteanlike(s: bytes, p: bytes) -> bool:
    return bool(_like(None, True, True)(s, p))


@simple("like_escape")
def like_escape(pattern: str, escape: str) -> str:
    """Rewrite a pattern written with another escape character to backslash escapes."""
    if escape == "\\":
        return pattern
    if len(escape) > 1:
        raise error("invalid escape string",
                    "Escape string must be empty or one character.")
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape and c == escape:
            i += 1
            if i >= len(pattern):
                raise error("LIKE pattern must not end with escape character")
            out.append("\\" + pattern[i])
        elif c == "\\":
            out.append("\\\\")
        else:
            out.append(c)
        i += 1
    return "".join(out)


# --- dates and times ---------------------------------------------------------------------------

class Infinity:
    """'infinity' or '-infinity' of a date or timestamp type: compares beyond every value."""

    __slots__ = ("sign",)

    def __init__(self, sign: int) -> None:
        self.sign = sign

    def _cmp(self, other: Any) -> int:
        if isinstance(other, Infinity):
            return (self.sign > other.sign) - (self.sign < other.sign)
        return self.sign

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Infinity) and other.sign == self.sign

    def __hash__(self) -> int:
        return hash(("infinity", self.sign))

    def __lt__(self, other: Any) -> bool:
        return self._cmp(other) < 0

    def __le__(self, other: Any) -> bool:
        return self._cmp(other) <= 0

    def __gt__(self, other: Any) -> bool:
        return self._cmp(other) > 0

    def __ge__(self, other: Any) -> bool:
        return self._cmp(other) >= 0

    def __repr__(self) -> str:
        return "infinity" if self.sign > 0 else "-infinity"


def _date_ts(d: Any) -> Any:
    return datetime.combine(d, time()) if isinstance(d, date) else d


def _date_left(f: Callable[[Any, Any], bool]) -> Fn:
    return lambda a, b: f(_date_ts(a), b)


def _date_right(f: Callable[[Any, Any], bool]) -> Fn:
    return lambda a, b: f(a, _date_ts(b))


for _s, _f in _CMP.items():
    IMPLS[f"date_{_s}_timestamp"] = fixed(_date_left(_f))
    IMPLS[f"timestamp_{_s}_date"] = fixed(_date_right(_f))


@simple("date_timestamp")
def date_timestamp(d: Any) -> Any:
    return _date_ts(d)


_PG_EPOCH = datetime(2000, 1, 1)


def _round_micros(t: int, typmod: int) -> int:
    """AdjustTimestampForTypmod: round to ``typmod`` fractional digits, half away from 0."""
    scale = 10 ** (6 - typmod)
    half = scale // 2
    if t >= 0:
        return int((t + half) // scale * scale)
    return -int((-t + half) // scale * scale)


@impl("timestamp_scale", "timestamptz_scale")
def _timestamp_scale(ctx: Ctx) -> Fn:
    def scale(t: Any, typmod: int) -> Any:
        if isinstance(t, Infinity) or typmod < 0 or typmod >= 6:
            return t
        base = _PG_EPOCH.replace(tzinfo=t.tzinfo)
        micros = (t - base) // timedelta(microseconds=1)
        try:
            return base + timedelta(microseconds=_round_micros(micros, typmod))
        except OverflowError:
            raise error("timestamp out of range") from None
    return scale


@impl("time_scale")
def _time_scale(ctx: Ctx) -> Fn:
    def scale(t: time, typmod: int) -> time:
        if typmod < 0 or typmod >= 6:
            return t
        micros = ((t.hour * 60 + t.minute) * 60 + t.second) * 1000000 + t.microsecond
        micros = _round_micros(micros, typmod)
        if micros >= 86400 * 1000000:
            micros = 86400 * 1000000 - 1  # 24:00:00 is not representable here
            raise NotSupportedError("time 24:00:00 is not supported by pgdecode")
        secs, us = divmod(micros, 1000000)
        return time(secs // 3600, secs // 60 % 60, secs % 60, us)
    return scale


@simple("timestamp_time")
def timestamp_time(t: Any) -> Any:
    return t.time() if isinstance(t, datetime) else None


@simple("timestamp_date")
def timestamp_date(t: Any) -> Any:
    return t.date() if isinstance(t, datetime) else t


@simple("date_mi")
def date_mi(a: Any, b: Any) -> int:
    if isinstance(a, Infinity) or isinstance(b, Infinity):
        raise error("cannot subtract infinite dates")
    return int((a - b).days)


@simple("date_pli")
def date_pli(d: Any, k: int) -> Any:
    return d if isinstance(d, Infinity) else _date_shift(d, k)


@simple("date_mii")
def date_mii(d: Any, k: int) -> Any:
    return d if isinstance(d, Infinity) else _date_shift(d, -k)


def _date_shift(d: date, k: int) -> date:
    try:
        return d + timedelta(days=k)
    except OverflowError:
        raise error("date out of range") from None


@simple("timestamp_mi")
def timestamp_mi(a: Any, b: Any) -> timedelta:
    if isinstance(a, Infinity) or isinstance(b, Infinity):
        raise error("cannot subtract infinite timestamps")
    result: timedelta = a - b
    return result


@simple("interval_um")
def interval_um(a: timedelta) -> timedelta:
    return -a


@simple("interval_pl")
def interval_pl(a: timedelta, b: timedelta) -> timedelta:
    return a + b


@simple("interval_mi")
def interval_mi(a: timedelta, b: timedelta) -> timedelta:
    return a - b


_EXTRACT_FIELDS: dict[str, Callable[[Any], int]] = {
    "year": lambda t: t.year, "month": lambda t: t.month, "day": lambda t: t.day,
    "hour": lambda t: getattr(t, "hour", 0), "minute": lambda t: getattr(t, "minute", 0),
    "dow": lambda t: (t.weekday() + 1) % 7, "isodow": lambda t: t.isoweekday(),
    "doy": lambda t: t.timetuple().tm_yday, "quarter": lambda t: (t.month - 1) // 3 + 1,
}


def _extract(field: str, t: Any, as_float: bool) -> Any:
    f = field.lower()
    if isinstance(t, Infinity):
        if f in ("year", "epoch", "decade", "century", "millennium", "julian", "isoyear"):
            return (math.inf if as_float else Decimal("Infinity")) * t.sign
        return None
    if f == "second":
        secs = Decimal(getattr(t, "second", 0)) + Decimal(getattr(t, "microsecond", 0)) / \
            Decimal(1000000)
        value = secs.quantize(Decimal("0.000001")) if not as_float else secs
    elif f == "epoch":
        dt = _date_ts(t)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        micro = int((dt - datetime(1970, 1, 1, tzinfo=dt.tzinfo)) / timedelta(microseconds=1))
        value = Decimal(micro).scaleb(-6).quantize(Decimal("0.000001"))
        if isinstance(t, date) and not isinstance(t, datetime):
            value = Decimal(micro // 1000000)
    elif f in _EXTRACT_FIELDS:
        if isinstance(t, date) and not isinstance(t, datetime) and f in ("hour", "minute"):
            raise error(f'unit "{f}" not supported for type date')
        value = Decimal(_EXTRACT_FIELDS[f](t))
    else:
        raise NotSupportedError(f'extract field "{field}" is not supported by pgdecode')
    return float(value) if as_float else value


@simple("extract_date")
def extract_date(field: str, d: Any) -> Any:
    return _extract(field, d, False)


@simple("extract_timestamp")
def extract_timestamp(field: str, t: Any) -> Any:
    return _extract(field, t, False)


@simple("timestamp_part")
def timestamp_part(field: str, t: Any) -> Any:
    return _extract(field, t, True)


# --- type input (the text of a literal, as the type's input function reads it) ---------------

_INT_RE = re.compile(r"\s*([+-]?)\s*(0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9_]+)\s*")
_BOOL_TRUE = ("t", "true", "y", "yes", "on", "1")
_BOOL_FALSE = ("f", "false", "n", "no", "off", "0")


def input_value(typ: int, text: str) -> Any:
    """The value of a literal of a built-in type, parsed locally (used when no server is at
    hand; with a server, the server's input function is used)."""
    name = _TYPE_NAMES.get(typ, str(typ))
    bad = error(f'invalid input syntax for type {name}: "{text}"')
    if typ in (INT2, INT4, INT8, OID):
        m = _INT_RE.fullmatch(text)
        if not m:
            raise bad
        digits = m.group(2).replace("_", "")
        base = {"x": 16, "o": 8, "b": 2}.get(digits[1:2].lower(), 10) if len(digits) > 1 else 10
        v = int(digits[2:] if base != 10 else digits, base)
        v = -v if m.group(1) == "-" else v
        lo, hi, _ = INT_RANGE[typ]
        if v < lo or v > hi:
            raise error(f'value "{text}" is out of range for type {name}')
        return v
    if typ == NUMERIC:
        t = text.strip()
        special = {"nan": "NaN", "infinity": "Infinity", "+infinity": "Infinity",
                   "-infinity": "-Infinity", "inf": "Infinity", "+inf": "Infinity",
                   "-inf": "-Infinity"}
        if t.lower() in special:
            return Decimal(special[t.lower()])
        try:
            if not re.fullmatch(r"[+-]?(\d[\d_]*\.?\d*|\.\d+)([eE][+-]?\d+)?", t):
                raise ValueError
            return numeric_from_text(t)
        except ValueError:
            raise bad from None
    if typ in (FLOAT4, FLOAT8):
        t = text.strip().lower()
        try:
            fv = float({"infinity": "inf", "+infinity": "inf", "-infinity": "-inf"}.get(t, t))
        except ValueError:
            raise bad from None
        return to_float4(fv) if typ == FLOAT4 else fv
    if typ == BOOL:
        t = text.strip().lower()
        is_true = bool(t) and any(w.startswith(t) for w in _BOOL_TRUE)
        is_false = bool(t) and any(w.startswith(t) for w in _BOOL_FALSE)
        if is_true != is_false:  # "o" is both "on" and "off": neither
            return is_true
        raise bad
    if typ in (TEXT, VARCHAR, NAME, BPCHAR, CHAR):
        return text if typ != NAME else _truncate_bytes(text, 63)
    if typ == BYTEA:
        if text.startswith("\\x"):
            try:
                return bytes.fromhex(text[2:])
            except ValueError:
                raise bad from None
        return text.encode()
    if typ == UUID:
        try:
            return uuid.UUID(text.strip())
        except ValueError:
            raise bad from None
    if typ in (DATE, TIMESTAMP, TIMESTAMPTZ):
        t = text.strip().lower()
        if t in ("infinity", "+infinity", "-infinity"):
            return Infinity(-1 if t.startswith("-") else 1)
        try:
            if typ == DATE:
                return date.fromisoformat(text.strip())
            dt = datetime.fromisoformat(text.strip())
            if typ == TIMESTAMP:
                return dt.replace(tzinfo=None)
            if dt.tzinfo is None:
                raise NotSupportedError(
                    f'pgdecode needs a connection to read the timestamp "{text}" (its time '
                    "zone is the server's TimeZone)")
            return dt
        except ValueError:
            raise bad from None
    raise NotSupportedError(f"pgdecode cannot read constants of type {name} without a server "
                            "connection")


_TYPE_NAMES = {INT2: "smallint", INT4: "integer", INT8: "bigint", OID: "oid",
               NUMERIC: "numeric", FLOAT4: "real", FLOAT8: "double precision", BOOL: "boolean",
               TEXT: "text", VARCHAR: "character varying", BPCHAR: "character", NAME: "name",
               BYTEA: "bytea", UUID: "uuid", DATE: "date", TIMESTAMP: "timestamp without "
               "time zone", TIMESTAMPTZ: "timestamp with time zone", TIME: "time without time "
               "zone", INTERVAL: "interval", CHAR: '"char"'}
