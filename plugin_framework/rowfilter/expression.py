"""One row filter of one table: parsed with PostgreSQL's grammar (as the WHERE clause of a
CREATE PUBLICATION), checked by the server's own parse analysis, analyzed and validated like
CREATE PUBLICATION does, and compiled per relation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from pglast import ast, parse_sql
from pglast.parser import ParseError
from psycopg import pq
from psycopg.adapt import Transformer

import plugin_framework.rowfilter.nodes as n
from plugin_framework.pgtypes import quote_ident_always
from plugin_framework.pgtypes.oids import UNKNOWN
from plugin_framework.rowfilter.analyze import Analyzer
from plugin_framework.rowfilter.errors import NotSupportedError, RowFilterError
from plugin_framework.rowfilter.evaluate import Compiled, Compiler
from plugin_framework.rowfilter.functions import Infinity
from plugin_framework.rowfilter.parse_state import render
from plugin_framework.rowfilter.pgcatalog import TypeCatalog
from plugin_framework.rowfilter.tables import CatalogTable

_PREFIX = "CREATE PUBLICATION pgdecode_row_filter FOR TABLE "
_transformer = Transformer()


def qualified(schema: str, name: str) -> str:
    return f"{quote_ident_always(schema)}.{quote_ident_always(name)}"


def parse_filter(text: str, table_sql: str = "t") -> tuple[Any, int]:
    """The raw parse tree of a filter, read as PostgreSQL reads ``WHERE (text)`` in CREATE
    PUBLICATION, and the offset of the text in the parsed statement."""
    head = f"{_PREFIX}{table_sql} WHERE ("
    sql = f"{head}{text})"
    try:
        stmts = parse_sql(sql)
    except ParseError as exc:
        message = str(exc.args[0]) if exc.args else str(exc)
        message = message.split(", at index")[0].split(", at location")[0]
        err = RowFilterError(message)
        loc = getattr(exc, "location", None)
        err.position = (loc - len(head) + 1) if isinstance(loc, int) else None
        raise err from None
    pubtable = _only_table(stmts)
    if pubtable is None or pubtable.whereClause is None or pubtable.columns:
        raise RowFilterError("syntax error: a row filter is one boolean expression")
    return pubtable.whereClause, len(head)


def parse_column_list(text: str) -> list[str]:
    """Column names written as in a publication's column list: ``a, "B", c``."""
    try:
        stmts = parse_sql(f"{_PREFIX}t ({text})")
    except ParseError as exc:
        raise RowFilterError(f"invalid column list {text!r}: {exc.args[0]}") from None
    pubtable = _only_table(stmts)
    if pubtable is None or not pubtable.columns or pubtable.whereClause is not None:
        raise RowFilterError(f"invalid column list {text!r}")
    return [c.sval for c in pubtable.columns]


def parse_table_name(text: str) -> tuple[str | None, str]:
    """(schema or None, table) of a table name written as in SQL."""
    try:
        stmts = parse_sql(f"{_PREFIX}{text}")
    except ParseError:
        raise RowFilterError(f"invalid table name {text!r}") from None
    pubtable = _only_table(stmts)
    rv = pubtable.relation if pubtable is not None else None
    if (pubtable is None or rv is None or rv.catalogname or pubtable.columns
            or pubtable.whereClause is not None or not rv.relname):
        raise RowFilterError(f"invalid table name {text!r}")
    return rv.schemaname, rv.relname


def _only_table(stmts: Any) -> Any:
    """The one table of a parsed CREATE PUBLICATION, None if it is anything else."""
    if len(stmts) != 1:
        return None
    stmt = stmts[0].stmt
    if (not isinstance(stmt, ast.CreatePublicationStmt) or stmt.options
            or not stmt.pubobjects or len(stmt.pubobjects) != 1):
        return None
    return stmt.pubobjects[0].pubtable


class ServerConstants:
    """Reads literals with the server's input functions (what CREATE PUBLICATION does), and
    loads them with the loader pgdecode uses for column values."""

    def __init__(self, catalog: TypeCatalog) -> None:
        self.cat = catalog

    def __call__(self, typ: int, text: str) -> Any:
        info = self.cat.type(typ)
        name = qualified(info.namespace, info.typname)  # "character" would mean char(1)
        try:
            # the value's text as its output function writes it (not "::text", which would
            # trim a character(n)), then loaded as column values are
            cur = self.cat.conn.execute(f"SELECT %s::text::{name}", (text,), prepare=False)
        except psycopg.Error as exc:
            raise _server_error(exc) from None
        result = cur.pgresult
        raw = result.get_value(0, 0) if result is not None else None
        if raw is None:
            return None
        canonical = bytes(raw).decode()
        if canonical in ("infinity", "-infinity") and self.cat.category(typ)[0] == "D":
            return Infinity(-1 if canonical.startswith("-") else 1)
        return _transformer.get_loader(typ, pq.Format.TEXT).load(canonical.encode())


def _server_error(exc: psycopg.Error, construct: str = "PUBLICATION WHERE") -> RowFilterError:
    diag = exc.diag
    message = diag.message_primary or str(exc).split("\n")[0]
    message = message.replace("argument of WHERE", f"argument of {construct}")
    err = RowFilterError(message, detail=diag.message_detail, hint=diag.message_hint)
    err.sqlstate = diag.sqlstate  # type: ignore[attr-defined]
    return err


@dataclass
class FilterExpression:
    """A row filter analyzed for a table."""

    text: str
    table: CatalogTable
    tree: n.Expr
    catalog: TypeCatalog

    @property
    def columns(self) -> frozenset[str]:
        return frozenset(x.name for x in n.walk(self.tree) if isinstance(x, n.Var))

    def compile(self, positions: Mapping[str, int]) -> Compiled:
        return Compiler(self.catalog, positions).compile(self.tree)


def analyze_filter(text: str, table: CatalogTable, catalog: TypeCatalog) -> FilterExpression:
    """Parse, check and analyze a filter of a table; RowFilterError if PostgreSQL would
    refuse it (with PostgreSQL's message) or pgdecode cannot evaluate it faithfully."""
    table_sql = qualified(table.schema, table.name)
    raw, offset = parse_filter(text, table_sql)
    where = render(raw)
    # The server's own parse analysis: unknown columns, operators, functions, bad literals,
    # non-boolean results, in its words. The statement is only prepared, never run.
    try:
        catalog.describe(f"SELECT 1 FROM ONLY {table_sql} WHERE ({where})")
    except psycopg.Error as exc:
        raise _server_error(exc) from None
    analyzer = Analyzer(catalog, table.shape, ServerConstants(catalog), offset)
    recorded: list[tuple[Any, n.Expr]] = []
    transform = analyzer.transform

    def recording(node: Any) -> n.Expr:
        expr = transform(node)
        recorded.append((node, expr))
        return expr

    analyzer.transform = recording  # type: ignore[method-assign, assignment]
    try:
        tree = analyzer.analyze(raw)
    except RowFilterError as exc:
        # The server resolved what pgdecode could not: default or variadic arguments...
        if not isinstance(exc, NotSupportedError) and any(
                exc.message.startswith(w) for w in ("function ", "operator ")) and \
                ("does not exist" in exc.message or "is not unique" in exc.message):
            raise NotSupportedError(f"pgdecode cannot resolve this the way the server does: "
                                    f"{exc.message} (default or variadic arguments are not "
                                    "supported)") from None
        raise
    _cross_check(catalog, table_sql, recorded)
    return FilterExpression(text, table, tree, catalog)


def _cross_check(catalog: TypeCatalog, table_sql: str, recorded: list[tuple[Any, n.Expr]]
                 ) -> None:
    """Every sub-expression must have the type the server gives it: pgdecode resolved the
    operators and functions the way the server does."""
    checks = [(raw, expr) for raw, expr in recorded
              if expr.rtype not in (UNKNOWN, 0) and not isinstance(expr, n.OtherExpr)
              and not isinstance(raw, ast.A_Const)]
    if not checks:
        return
    select = ", ".join(f"({render(raw)})" for raw, _ in checks)
    try:
        types = catalog.describe(f"SELECT {select} FROM ONLY {table_sql}")
    except psycopg.Error:
        return  # a piece that only makes sense in context; the whole was checked already
    for (raw, expr), (server_type, _) in zip(checks, types, strict=True):
        if server_type != expr.rtype:
            raise NotSupportedError(
                f"pgdecode resolves {render(raw)!r} as type {catalog.type_name(expr.rtype)} "
                f"but the server as type {catalog.type_name(server_type)}: this filter "
                "cannot be evaluated faithfully")
