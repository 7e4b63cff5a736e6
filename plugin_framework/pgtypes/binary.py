"""Binary-format values (pgoutput's ``binary`` option): the send format -> the text the server
would have sent, for the types that are not dates or times (those are in pgtypes.datetimes).

Each function reproduces the type's output function digit for digit (float4out/float8out,
numeric_out, inet_out, ...), so that a value converts the same whichever format the server
used.
"""

from __future__ import annotations

import contextlib
import re
import struct
from collections.abc import Callable
from ipaddress import IPv4Address
from typing import Final

from plugin_framework.protocol import LSN

__all__ = [
    "b_bits_text",
    "b_box_text",
    "b_char_text",
    "b_circle_text",
    "b_float8_text",
    "b_inet_text",
    "b_int_text",
    "b_line_text",
    "b_lseg_text",
    "b_numeric_text",
    "b_path_text",
    "b_pg_lsn_text",
    "b_point_text",
    "b_polygon_text",
    "b_tid_text",
    "multirange_text",
    "pg_float4_text",
    "pg_float8_text",
    "single_range_text",
]

_i32 = struct.Struct("!i")
_u64 = struct.Struct("!Q")
_f32, _f64 = struct.Struct("!f"), struct.Struct("!d")

# --- numbers ----------------------------------------------------------------------------------


def _float_layout(negative: bool, digits: str, exp: int, fixed_below: int) -> str:
    """Shortest digits and decimal exponent laid out as PostgreSQL's float4out/float8out do
    (fixed notation for exponents -4 .. fixed_below-1, else d.ddde+XX)."""
    sign = "-" if negative else ""
    if -4 <= exp < fixed_below:
        if exp < 0:
            return f"{sign}0.{'0' * (-exp - 1)}{digits}"
        if len(digits) <= exp + 1:
            return sign + digits + "0" * (exp + 1 - len(digits))
        return f"{sign}{digits[:exp + 1]}.{digits[exp + 1:]}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _nonfinite(x: float) -> str | None:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return None


def _shortest(text: str) -> tuple[str, int]:
    """Digits without leading or trailing zeros, and the decimal exponent of the first one,
    of the unsigned number ``text`` (as repr or %e print it)."""
    mantissa, _, e = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    lead = len(whole) - (len(whole + frac) - len(digits)) - 1
    digits = digits.rstrip("0") or "0"
    return digits, (int(e) if e else 0) + lead


def pg_float8_text(x: float) -> str:
    """A float8 as the server prints it (extra_float_digits >= 1, the default since 12)."""
    special = _nonfinite(x)
    if special is not None:
        return special
    text = repr(x)  # the same shortest digits; exponent form below 1e-4 and from 1e16 as well
    if "e" in text:
        return text
    if -1e15 < x < 1e15:
        return text[:-2] if text.endswith(".0") else text
    digits, exp = _shortest(text.lstrip("-"))  # 1e15 <= |x| < 1e16: exponent form for us
    return _float_layout(x < 0, digits, exp, 15)


def pg_float4_text(raw: bytes) -> str:
    (x,) = _f32.unpack(raw)
    special = _nonfinite(x)
    if special is not None:
        return special
    if x == 0:
        return "-0" if raw[0] & 0x80 else "0"
    target = _f32.pack(abs(x))
    for p in range(9):  # the shortest %e that reads back as the same float4
        text = f"{abs(x):.{p}e}"
        with contextlib.suppress(OverflowError):  # rounded up past the largest float4
            if _f32.pack(float(text)) == target:
                break
    digits, exp = _shortest(text)
    return _float_layout(x < 0, digits, exp, 6)


def b_int_text(raw: bytes) -> str:
    return str(int.from_bytes(raw, "big", signed=True))


def b_float8_text(raw: bytes) -> str:
    return pg_float8_text(_f64.unpack(raw)[0])


def b_numeric_text(raw: bytes) -> str:
    """numeric_send -> numeric_out, digit for digit."""
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", raw)
    if sign == 0xC000:
        return "NaN"
    if sign == 0xD000:
        return "Infinity"
    if sign == 0xF000:
        return "-Infinity"
    digits = struct.unpack_from(f"!{ndigits}h", raw, 8)

    def group(w: int) -> int:  # the base-10000 digit of weight w
        i = weight - w
        return digits[i] if 0 <= i < ndigits else 0

    if weight >= 0:
        whole = str(group(weight)) + "".join(f"{group(w):04d}" for w in range(weight - 1, -1, -1))
    else:
        whole = "0"
    out = ("-" if sign == 0x4000 else "") + whole
    if dscale > 0:
        frac = "".join(f"{group(-k):04d}" for k in range(1, (dscale + 3) // 4 + 1))
        out += "." + frac[:dscale]
    return out


# --- network addresses, bits, "char", geometry, pg_lsn, tid ------------------------------------


def _ipv6_text(addr: bytes) -> str:
    """An IPv6 address as PostgreSQL prints it (BIND's inet_ntop6): the longest run of two or
    more zero groups as "::", and the last 32 bits dotted after ::, ::ffff: or ::ffff:0:."""
    words = struct.unpack("!8H", addr)
    best_base, best_len, base = -1, 0, -1
    for i in range(9):
        if i < 8 and words[i] == 0:
            if base < 0:
                base = i
        elif base >= 0:
            if i - base > best_len:
                best_base, best_len = base, i - base
            base = -1
    if best_len < 2:
        best_base = -1
    out = []
    for i in range(8):
        if best_base <= i < best_base + best_len:
            if i == best_base:
                out.append(":")
            continue
        if i:
            out.append(":")
        if i == 6 and best_base == 0 and (best_len == 6
                                          or (best_len == 5 and words[5] == 0xFFFF)):
            out.append(str(IPv4Address(addr[12:])))
            break
        out.append(f"{words[i]:x}")
    if best_base >= 0 and best_base + best_len == 8:
        out.append(":")
    return "".join(out)


def b_inet_text(raw: bytes) -> str:
    family, bits, is_cidr, nb = raw[0], raw[1], raw[2], raw[3]
    addr = raw[4:4 + nb]
    if family == 2:
        text, full = str(IPv4Address(addr.ljust(4, b"\0"))), 32
    else:
        text, full = _ipv6_text(addr.ljust(16, b"\0")), 128
    return text if bits == full and not is_cidr else f"{text}/{bits}"


def b_bits_text(raw: bytes) -> str:
    (nbits,) = _i32.unpack_from(raw)
    return "".join(f"{b:08b}" for b in raw[4:])[:nbits]


def b_char_text(raw: bytes) -> str:
    """The "char" type: one byte, printed in octal when not ASCII (charout)."""
    if not raw or raw == b"\0":
        return ""
    return raw.decode() if raw[0] < 128 else f"\\{raw[0]:03o}"


def _points(raw: bytes, pos: int, n: int) -> str:
    values = struct.unpack_from(f"!{2 * n}d", raw, pos)
    return ",".join(f"({pg_float8_text(values[2 * i])},{pg_float8_text(values[2 * i + 1])})"
                    for i in range(n))


def b_point_text(raw: bytes) -> str:
    return _points(raw, 0, 1)


def b_lseg_text(raw: bytes) -> str:
    return f"[{_points(raw, 0, 2)}]"


def b_box_text(raw: bytes) -> str:
    return _points(raw, 0, 2)


def b_line_text(raw: bytes) -> str:
    return "{" + ",".join(pg_float8_text(v) for v in struct.unpack("!3d", raw)) + "}"


def b_path_text(raw: bytes) -> str:
    closed, (n,) = raw[0], _i32.unpack_from(raw, 1)
    inner = _points(raw, 5, n)
    return f"({inner})" if closed else f"[{inner}]"


def b_polygon_text(raw: bytes) -> str:
    return f"({_points(raw, 4, _i32.unpack_from(raw)[0])})"


def b_circle_text(raw: bytes) -> str:
    x, y, r = struct.unpack("!3d", raw)
    return f"<({pg_float8_text(x)},{pg_float8_text(y)}),{pg_float8_text(r)}>"


def b_pg_lsn_text(raw: bytes) -> str:
    return str(LSN(_u64.unpack(raw)[0]))


def b_tid_text(raw: bytes) -> str:
    block, offset = struct.unpack("!IH", raw)
    return f"({block},{offset})"


# --- ranges and multiranges -------------------------------------------------------------------

_RANGE_SPECIAL: Final = re.compile(r'["\\(),\[\]\s]')


def _range_bound(text: str) -> str:
    if text and _RANGE_SPECIAL.search(text) is None:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def _range_text(raw: bytes, bound: Callable[[bytes], str], pos: int = 0) -> tuple[str, int]:
    flags = raw[pos]
    pos += 1
    if flags & 0x01:
        return "empty", pos
    texts = []
    for present in (not flags & 0x08, not flags & 0x10):
        if present:
            (n,) = _i32.unpack_from(raw, pos)
            texts.append(_range_bound(bound(raw[pos + 4:pos + 4 + n])))
            pos += 4 + n
        else:
            texts.append("")
    lower = "[" if flags & 0x02 else "("
    upper = "]" if flags & 0x04 else ")"
    return f"{lower}{texts[0]},{texts[1]}{upper}", pos


def single_range_text(raw: bytes, bound: Callable[[bytes], str]) -> str:
    return _range_text(raw, bound)[0]


def multirange_text(raw: bytes, bound: Callable[[bytes], str]) -> str:
    (count,) = _i32.unpack_from(raw)
    pos, texts = 4, []
    for _ in range(count):
        (n,) = _i32.unpack_from(raw, pos)
        texts.append(_range_text(raw[pos + 4:pos + 4 + n], bound)[0])
        pos += 4 + n
    return "{" + ",".join(texts) + "}"
