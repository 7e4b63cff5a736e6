"""PostgreSQL types as Spark types (``spark_type``: the types of ``split_tables``, the
mirrors and the change feed; ``arrowtyped.py`` gives the Arrow form), and names as Spark SQL
identifiers."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["column", "ident", "spark_type"]

_TYPMOD = re.compile(r"\((\d+)(?:,(\d+))?\)")


def ident(name: str) -> str:
    """A name as one Spark SQL identifier (dots, backticks and all)."""
    return "`" + name.replace("`", "``") + "`"


def column(name: str) -> Any:
    """``F.col`` of a column named ``name`` exactly (dots, backticks and all)."""
    from pyspark.sql import functions as F

    return F.col(ident(name))


def _scalar(name: str) -> Any:
    from pyspark.sql import types as T

    match = _TYPMOD.search(name)
    base = _TYPMOD.sub("", name).strip()
    if base == "numeric":
        if match and match[1] and int(match[1]) <= 38:
            return T.DecimalType(int(match[1]), int(match[2] or 0))
        return T.StringType()
    simple = {
        "smallint": T.ShortType(), "integer": T.IntegerType(), "bigint": T.LongType(),
        "oid": T.LongType(), "real": T.FloatType(), "double precision": T.DoubleType(),
        "boolean": T.BooleanType(), "bytea": T.BinaryType(), "date": T.DateType(),
        "timestamp without time zone": T.TimestampNTZType(),
        "timestamp with time zone": T.TimestampType(),
    }
    return simple.get(base, T.StringType())


def spark_type(pg_type: str) -> Any:
    """The Spark type for a PostgreSQL type as format_type prints it."""
    from pyspark.sql import types as T

    if pg_type.endswith("[]"):
        return T.ArrayType(_scalar(pg_type[:-2]))
    return _scalar(pg_type)
