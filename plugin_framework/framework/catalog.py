"""Read-only, cached catalog access for plugins (the "Capabilities" of an output plugin):
type names, NOT NULL columns, defaults, anything a single SELECT can tell.

It has a connection of its own to the source database. It can never write: every query must
parse (with PostgreSQL's own parser) as exactly one plain SELECT, and runs in a read-only
transaction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?s")


class CatalogError(Exception):
    pass


class Catalog:
    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.Connection[Any] | None = None
        self._cache: dict[tuple[str, tuple[Any, ...]], list[tuple[Any, ...]]] = {}

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            options = conninfo_to_dict(self._conninfo).get("options") or ""
            self._conn = psycopg.connect(
                self._conninfo, options=f"{options} -c default_transaction_read_only=on"
            )
            self._conn.read_only = True
        return self._conn

    @staticmethod
    def check_read_only(sql: str) -> None:
        # pglast (PostgreSQL's parser) is imported by the first plugin that queries the
        # catalog, not by every command's start-up.
        from pglast import ast, parse_sql
        from pglast.parser import ParseError

        # psycopg's placeholders are not SQL; PostgreSQL's own ($1) parse the same way.
        counter = iter(range(1, 10_000))
        parsable = _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql.replace("%%", "%"))
        try:
            statements = parse_sql(parsable)
        except ParseError as exc:
            raise CatalogError(f"catalog query does not parse: {exc}") from None
        if len(statements) != 1:
            raise CatalogError("a catalog query must be exactly one statement")
        stmt = statements[0].stmt
        if not isinstance(stmt, ast.SelectStmt) or stmt.intoClause or stmt.lockingClause:
            raise CatalogError("a catalog query must be a plain SELECT (no INTO, no FOR UPDATE)")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read-only SELECT, cached for the life of the pipeline."""
        key = (sql, tuple(params))
        rows = self._cache.get(key)
        if rows is None:
            self.check_read_only(sql)
            conn = self._connection()
            with conn.transaction():
                rows = conn.execute(sql, tuple(params), prepare=False).fetchall()
            self._cache[key] = rows
        return rows

    def invalidate(self) -> None:
        """Forget cached answers. The pipeline calls it whenever the server describes a
        relation anew (a Relation message follows DDL), so answers stay current."""
        self._cache.clear()

    def type_name(self, type_oid: int, typmod: int = -1) -> str:
        return str(self.query("SELECT format_type(%s, %s)", (type_oid, typmod))[0][0])

    def not_null_columns(self, relation_id: int) -> set[str]:
        rows = self.query(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
            "AND NOT attisdropped AND attnotnull", (relation_id,))
        return {r[0] for r in rows}

    def column_defaults(self, relation_id: int) -> dict[str, str]:
        rows = self.query(
            "SELECT a.attname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d "
            "JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
            "WHERE d.adrelid = %s", (relation_id,))
        return {r[0]: r[1] for r in rows}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
