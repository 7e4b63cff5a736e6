"""``tables.typed_values``' conversions in Python, to Arrow: the sinks type a batch's net
changes with these instead of a Spark job per table and batch.

tables.py's Spark expressions are the reference: each conversion here gives, for the text the
server writes (the change rows' ``row`` map of the server's text, and the json emitter's typed
JSON for arrays), the value Spark's gives. A text in a form this module does not know to give
the same for (a number with spaces, an odd number of hex digits, a nested JSON object ...)
raises ``Decline``, and the caller types that batch with the Spark expressions.
tests/spark/test_spark_arrowtyped.py proves both equal on values a server writes, type by type.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from plugin_framework.pgtypes.datetimes import civil_days
from plugin_framework.spark.columns.types import spark_type

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Decline", "arrow_type", "typed_arrays", "typed_net", "typed_rows"]


class Decline(Exception):
    """A value this module cannot promise to convert as Spark does: use the Spark path."""


_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DATE = re.compile(r"([0-9]{4,7})-([0-9]{2})-([0-9]{2})", re.ASCII)
_TIMESTAMP = re.compile(
    r"([0-9]{4,7})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
    r"(?:([+-])([0-9]{2})(?::([0-9]{2})(?::([0-9]{2}))?)?)?", re.ASCII)
_DECIMALS = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_NOT_FINITE = ("infinity", "-infinity")  # Spark's casts give NULL for these dates and times


def arrow_type(pg_type: str) -> pa.DataType:
    """The Arrow type of Spark's type for a PostgreSQL type (``types.spark_type``), as
    Spark's ``toArrow`` gives it (timestamps in UTC)."""
    return _arrow(spark_type(pg_type))


def _arrow(dtype: Any) -> pa.DataType:
    import pyarrow as pa
    from pyspark.sql import types as T

    if isinstance(dtype, T.ArrayType):
        return pa.list_(_arrow(dtype.elementType))
    if isinstance(dtype, T.DecimalType):
        return pa.decimal128(dtype.precision, dtype.scale)
    simple = {T.ShortType: pa.int16(), T.IntegerType: pa.int32(), T.LongType: pa.int64(),
              T.FloatType: pa.float32(), T.DoubleType: pa.float64(), T.BooleanType: pa.bool_(),
              T.BinaryType: pa.binary(), T.DateType: pa.date32(),
              T.TimestampType: pa.timestamp("us", "UTC"), T.TimestampNTZType: pa.timestamp("us"),
              T.StringType: pa.string()}
    return simple[type(dtype)]


# --- scalars: the server's text (or an array element's JSON text) to a Python value --------


def _days(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 of an astronomical-year date (proleptic Gregorian)."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        raise Decline(f"no such date: {year}-{month}-{day}")
    return civil_days(year, month, day)


def _year(text: str, digits: str) -> int:
    """A year as Spark counts it: "0044 ... BC" is -43 (tables._astronomical)."""
    return 1 - int(digits) if text.endswith(" BC") else int(digits)


def _date(text: str) -> int | None:
    if text in _NOT_FINITE:
        return None
    match = _DATE.fullmatch(text.removesuffix(" BC"))
    if match is None:
        raise Decline(f"date {text!r}")
    return _days(_year(text, match[1]), int(match[2]), int(match[3]))


def _timestamp(with_zone: bool) -> Callable[[str], int | None]:
    def convert(text: str) -> int | None:
        if text in _NOT_FINITE:
            return None
        match = _TIMESTAMP.fullmatch(text.removesuffix(" BC"))
        if match is None or (match[8] is not None) != with_zone:
            raise Decline(f"timestamp {text!r}")
        days = _days(_year(text, match[1]), int(match[2]), int(match[3]))
        seconds = days * 86400 + int(match[4]) * 3600 + int(match[5]) * 60 + int(match[6])
        if with_zone:
            offset = int(match[9]) * 3600 + int(match[10] or 0) * 60 + int(match[11] or 0)
            seconds -= offset if match[8] == "+" else -offset
        micros = seconds * 1_000_000 + int((match[7] or "").ljust(6, "0"))
        return micros if _INT64[0] <= micros <= _INT64[1] else None  # Spark's overflow

    return convert


def _integer(bits: int) -> Callable[[str], int | None]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def convert(text: str) -> int | None:
        if _INTEGER.fullmatch(text) is None:
            raise Decline(f"integer {text!r}")
        value = int(text)
        return value if low <= value <= high else None

    return convert


def _decimal(precision: int, scale: int) -> Callable[[str], decimal.Decimal | None]:
    quantum = decimal.Decimal(1).scaleb(-scale)
    limit = 10 ** precision

    def convert(text: str) -> decimal.Decimal | None:
        try:
            value = _DECIMALS.create_decimal(text)
        except decimal.InvalidOperation:
            raise Decline(f"numeric {text!r}") from None
        if not value.is_finite():
            return None  # NaN, Infinity: Spark's cast gives NULL
        value = value.quantize(quantum, context=_DECIMALS)
        # copy_abs: exact (abs() rounds to the thread's context, 28 digits)
        return value if value.scaleb(scale, context=_DECIMALS).copy_abs() < limit else None

    return convert


def _boolean(text: str) -> bool:
    if text in ("t", "true"):
        return True
    if text in ("f", "false"):
        return False
    raise Decline(f"boolean {text!r}")


def _bytes(hex_prefix: bool) -> Callable[[str], bytes | None]:
    def convert(text: str) -> bytes | None:
        if hex_prefix:
            if not text.startswith("\\x"):
                return None  # as the Spark expression: only hex output is read
            text = text[2:]
        if len(text) % 2:
            raise Decline(f"bytea of an odd number of hex digits: {text[:40]!r}")
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise Decline(f"bytea {text[:40]!r}") from None

    return convert


def _float(arrow: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    """Floats are parsed by Arrow, a column at a time: straight to single precision, as
    Spark's cast does (a detour through a double could round twice)."""
    def convert(texts: pa.Array) -> pa.Array:
        import pyarrow as pa

        for text in texts.to_pylist():
            if text is not None and (not text or text != text.strip()):
                raise Decline(f"float {text!r}")
        try:
            return texts.cast(arrow)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise Decline(f"float: {exc}") from None

    return convert


def _scalar(dtype: Any, *, hex_prefix: bool) -> Callable[[str], Any] | None:
    """The converter of one value of Spark type ``dtype``; None for strings (kept) and
    floats (a column at a time)."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType | T.FloatType | T.DoubleType):
        return None
    if isinstance(dtype, T.DecimalType):
        return _decimal(dtype.precision, dtype.scale)
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return _timestamp(isinstance(dtype, T.TimestampType))
    bits = {T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}.get(type(dtype))
    if bits is not None:
        return _integer(bits)
    if isinstance(dtype, T.BooleanType):
        return _boolean
    if isinstance(dtype, T.BinaryType):
        return _bytes(hex_prefix)
    if isinstance(dtype, T.DateType):
        return _date
    raise Decline(f"Spark type {dtype.simpleString()}")


def _strict_casts() -> tuple[type, ...]:
    """The types whose Arrow cast from text is as strict as the conversions here."""
    from pyspark.sql import types as T

    return (T.ShortType, T.IntegerType, T.LongType, T.DecimalType, T.DateType,
            T.TimestampType, T.TimestampNTZType)


def _column(texts: Sequence[str | None] | pa.Array, dtype: Any, *,
            hex_prefix: bool) -> pa.Array:
    """One column of values of Spark type ``dtype`` from their text, as an Arrow array."""
    import pyarrow as pa
    from pyspark.sql import types as T

    if not isinstance(texts, pa.Array):
        texts = pa.array(texts, pa.string())
    arrow = _arrow(dtype)
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return _float(arrow)(texts)
    convert = _scalar(dtype, hex_prefix=hex_prefix)
    if convert is None:
        return texts.cast(arrow)
    if isinstance(dtype, _strict_casts()):
        # Arrow's own cast takes the usual forms only (four-digit years, no BC, offsets
        # without seconds, numerics that fit exactly), a column at a time; on anything
        # else it fails and each value is converted below.
        try:
            return texts.cast(arrow)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    values = [None if t is None else convert(t) for t in texts.to_pylist()]
    if isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType):
        storage = pa.int32() if isinstance(dtype, T.DateType) else pa.int64()
        return pa.array(values, storage).cast(arrow)
    return pa.array(values, arrow)


# --- arrays: the json emitter's typed JSON ---------------------------------------------------


def _json_fields(text: str | None) -> dict[str, Any]:
    """A row's typed JSON (``None``: no row)."""
    if text is None:
        return {}
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise Decline("a row's JSON does not parse (or has a number past 64 bits)") from None
    if not isinstance(parsed, dict):
        raise Decline("a row's JSON is not an object")
    return parsed


def _element_text(dtype: Any) -> Callable[[Any], str | None]:
    """An array element (parsed JSON) as the text Spark's from_json to array<string> gives:
    a string as it is, a number as its digits, a boolean as "true" or "false". Parsed, a
    fractional number has lost its digits: taken only where the element type is a float
    (whose value the digits of the parsed double give again)."""
    from pyspark.sql import types as T

    floats = isinstance(dtype, T.FloatType | T.DoubleType)

    def text(element: Any) -> str | None:
        if element is None or isinstance(element, str):
            return element
        if element is True or element is False:
            return "true" if element else "false"
        if isinstance(element, int):
            return str(element)
        if isinstance(element, float) and floats:
            return repr(element)
        raise Decline(f"an array element {type(element).__name__} of a {dtype.simpleString()}"
                      " array")

    return text


def _array_column(values: Sequence[Any], dtype: Any) -> pa.Array:
    """An array column from each row's JSON value of it: NULL for a missing value and for a
    multi-dimensional array (as the Spark expression: it does not fit)."""
    import pyarrow as pa

    lists: list[list[Any] | None] = []
    element = _element_text(dtype.elementType)
    for value in values:
        if value is None or (isinstance(value, list) and value and isinstance(value[0], list)):
            lists.append(None)
        elif isinstance(value, list):
            lists.append([element(e) for e in value])
        else:
            raise Decline("an array column whose JSON is not an array")
    flat = [e for items in lists if items is not None for e in items]
    elements = _column(flat, dtype.elementType, hex_prefix=False)
    ends = [0]
    for items in lists:
        ends.append(ends[-1] + (0 if items is None else len(items)))
    return pa.ListArray.from_arrays(pa.array(ends, pa.int32()), elements, type=_arrow(dtype),
                                    mask=pa.array([items is None for items in lists],
                                                  pa.bool_()))


def typed_arrays(rows: pa.Array | pa.ChunkedArray, row_json: Sequence[str | None],
                 columns: Sequence[tuple[str, str]]) -> list[pa.Array]:
    """``tables.typed_values`` of the rows (a map<string,string> column of the server's
    text, NULL: no row) and their typed JSON: one Arrow array per column (name, PostgreSQL
    type)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import types as T

    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    out = []
    parsed: list[dict[str, Any]] | None = None
    for name, pg in columns:
        dtype = spark_type(pg)
        if isinstance(dtype, T.ArrayType):
            if parsed is None:
                parsed = [_json_fields(text) for text in row_json]
            out.append(_array_column([fields.get(name) for fields in parsed], dtype))
        else:  # a key given twice: the last value (as a dict of the pairs has it)
            texts = pc.map_lookup(rows, pa.scalar(name), "last")
            out.append(_column(texts, dtype, hex_prefix=True))
    return out


def typed_rows(table: pa.Table, columns: Sequence[tuple[str, str]],
               keys: Sequence[str]) -> pa.Table:
    """``mirrors.typed.typed_puts`` without Spark and without its extra columns: the rows of
    netchange's ``put_columns`` (``table``) with the table's columns (name, PostgreSQL type)
    typed, then ``_fill`` and ``_o_<key>`` (the ``keys``)."""
    import pyarrow as pa

    types = dict(columns)
    origin = [(k, types[k]) for k in keys]
    arrays = [*typed_arrays(table.column("row"), table.column("row_json").to_pylist(), columns),
              table.column("fill").combine_chunks(),
              *typed_arrays(table.column("origin"), table.column("origin_json").to_pylist(),
                            origin)]
    return pa.table(arrays, names=[*[name for name, _ in columns], "_fill",
                                   *[f"_o_{k}" for k, _ in origin]])


def typed_net(table: pa.Table, columns: Sequence[tuple[str, str]],
              keys: Sequence[str]) -> pa.Table:
    """``mirrors.typed.net_frame`` without Spark: ``typed_rows`` of netchange's net changes, then
    ``_deleted``, ``_commit_lsn``, ``_lsn`` and ``_copies``."""
    out = typed_rows(table, columns, keys)
    for name, source in (("_deleted", "deleted"), ("_commit_lsn", "commit_lsn"),
                         ("_lsn", "lsn"), ("_copies", "copies")):
        out = out.append_column(name, table.column(source))
    return out
