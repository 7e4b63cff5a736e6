"""The state of one filter's parse analysis (PostgreSQL's ParseState, parse_node.c): the
catalog, the table the filter belongs to, error positions; the table shape the analyzer sees
and the constants the analysis modules share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pglast.stream import RawStream

from plugin_framework.rowfilter.errors import RowFilterError
from plugin_framework.rowfilter.pgcatalog import TypeCatalog

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


def raw_location(raw: Any) -> int:
    """Where a raw parse tree node starts in the statement text (-1: unknown)."""
    loc = getattr(raw, "location", None)
    return loc if isinstance(loc, int) else -1


class ParseState:
    """The catalog, the table and the statement offset one filter is analyzed against."""

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
