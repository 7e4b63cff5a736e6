"""What the analyzer needs to know of the server's catalogs: types, operators, functions,
casts and collations, read with plain SELECTs in a read-only transaction and cached.

Type and operator resolution then follows PostgreSQL's own rules (parse_oper.c, parse_func.c,
parse_coerce.c) over these rows, so that a filter means what it means on the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, pq
from psycopg._encodings import conn_encoding

from plugin_framework.pgtypes.oids import (
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
)
from plugin_framework.rowfilter.casemap import (
    CaseMap,
    cached,
    chunked_query,
    table_query,
    table_rows,
)
from plugin_framework.rowfilter.errors import NotSupportedError

FIRST_NORMAL_OBJECT_ID = 16384  # user-defined objects have OIDs from here (transam.h)

DEFAULT_COLLATION, C_COLLATION, POSIX_COLLATION = 100, 950, 951

# Polymorphic pseudo-types (IsPolymorphicType): the "anyelement" family and the
# "anycompatible" family.
POLYMORPHIC = frozenset({ANYELEMENT, ANYARRAY, ANYNONARRAY, ANYENUM, ANYRANGE, ANYMULTIRANGE,
                         ANYCOMPATIBLE, ANYCOMPATIBLEARRAY, ANYCOMPATIBLENONARRAY,
                         ANYCOMPATIBLERANGE, ANYCOMPATIBLEMULTIRANGE})

STRING_CATEGORY = "S"


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    typname: str
    display: str  # format_type(oid, NULL): "integer", "character varying"...
    namespace: str
    category: str  # typcategory
    preferred: bool
    typtype: str  # b(ase), c(omposite), d(omain), e(num), p(seudo), r(ange), m(ultirange)
    elem: int  # element type of an array type (0 otherwise)
    array: int  # the array type of this type (0 if none)
    basetype: int  # domains: the base type
    collation: int  # typcollation: 0 for non-collatable types
    typlen: int

    @property
    def is_array(self) -> bool:
        return self.elem != 0 and self.typlen == -1 and self.category == "A"


@dataclass(frozen=True, slots=True)
class OperInfo:
    oid: int
    name: str
    namespace: str
    kind: str  # b(inary) or l(prefix)
    left: int
    right: int
    result: int
    proc: int  # oprcode


@dataclass(frozen=True, slots=True)
class ProcInfo:
    oid: int
    name: str
    namespace: str
    argtypes: tuple[int, ...]
    rettype: int
    volatility: str  # i, s, v
    prosrc: str
    strict: bool
    retset: bool
    kind: str  # f(unction), a(ggregate), w(indow), p(rocedure)
    variadic: int
    nargdefaults: int
    language: int  # 12 internal, 14 sql

    @property
    def key(self) -> str:
        """How the evaluator finds its implementation: the C symbol for internal functions,
        ``sql:name/nargs`` for the SQL-language ones."""
        if self.language == 12:
            return self.prosrc
        return f"sql:{self.name}/{len(self.argtypes)}"


@dataclass(frozen=True, slots=True)
class CastInfo:
    source: int
    target: int
    func: int  # 0: none
    context: str  # e(xplicit), a(ssignment), i(mplicit)
    method: str  # f(unction), b(inary), i(/o)


@dataclass(frozen=True, slots=True)
class CollationInfo:
    oid: int
    name: str
    namespace: str
    provider: str  # c(libc), i(cu), b(uiltin), d(efault)
    collate: str | None
    ctype: str | None
    locale: str | None  # ICU or builtin locale
    deterministic: bool

    @property
    def code_point_order(self) -> bool:
        """Whether strings sort by code point (what Python's str comparison does)."""
        if self.provider == "c":
            return self.collate in ("C", "POSIX")
        return self.provider == "b"  # builtin "C", "C.UTF-8" and "PG_UNICODE_FAST"

    @property
    def ascii_ctype(self) -> bool:
        """Whether lower()/upper()/ILIKE fold ASCII letters only."""
        if self.provider == "c":
            return self.ctype in ("C", "POSIX")
        return self.provider == "b" and self.locale == "C"


class TypeCatalog:
    """Catalog rows from a server, cached. Every query is a plain SELECT."""

    def __init__(self, conn: psycopg.Connection[Any], conninfo: str | None = None) -> None:
        self.conn = conn
        self.conninfo = conninfo  # to reconnect after the connection is lost
        self.server_version = conn.info.server_version
        self._types: dict[int, TypeInfo] = {}
        self._procs: dict[int, ProcInfo] = {}
        self._casts: dict[tuple[int, int], CastInfo | None] = {}
        self._operators: dict[tuple[str, str, str | None], list[OperInfo]] = {}
        self._functions: dict[tuple[str, int, str | None], list[ProcInfo]] = {}
        self._collations: dict[int, CollationInfo] = {}
        self._default_collation: CollationInfo | None = None
        self._casemaps: dict[int, CaseMap] = {}

    @classmethod
    def connect(cls, conninfo: str) -> TypeCatalog:
        return cls(cls._connect(conninfo), conninfo)

    @staticmethod
    def _connect(conninfo: str) -> psycopg.Connection[Any]:
        return psycopg.connect(conninfo, autocommit=True,
                               options="-c default_transaction_read_only=on")

    def close(self) -> None:
        self.conn.close()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a plain SELECT (reconnecting once if the connection was lost)."""
        if self.conn.closed and self.conninfo:
            self.conn = self._connect(self.conninfo)
        try:
            return self.conn.execute(sql, tuple(params), prepare=False).fetchall()
        except psycopg.OperationalError:
            if not self.conninfo or not self.conn.closed:
                raise
            self.conn = self._connect(self.conninfo)
            return self.conn.execute(sql, tuple(params), prepare=False).fetchall()

    # --- types ---------------------------------------------------------------------------------

    _TYPE_SQL = (
        "SELECT t.oid::int, t.typname::text, format_type(t.oid, NULL), n.nspname::text, "
        "t.typcategory::text, t.typispreferred, t.typtype::text, t.typelem::int, "
        "t.typarray::int, t.typbasetype::int, t.typcollation::int, t.typlen::int "
        "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace ")

    def load_types(self, oids: Sequence[int]) -> None:
        missing = sorted({o for o in oids if o and o not in self._types})
        if missing:
            for row in self._rows(self._TYPE_SQL + "WHERE t.oid = ANY(%s)", (missing,)):
                self._types[row[0]] = TypeInfo(*row)

    def type(self, oid: int) -> TypeInfo:
        if oid not in self._types:
            self.load_types([oid])
        try:
            return self._types[oid]
        except KeyError:
            raise LookupError(f"type with OID {oid} does not exist") from None

    def type_name(self, oid: int) -> str:
        return self.type(oid).display

    def base_type(self, oid: int) -> int:
        """getBaseType: domains reduced to their base types."""
        while oid and self.type(oid).typtype == "d":
            oid = self.type(oid).basetype
        return oid

    def category(self, oid: int) -> tuple[str, bool]:
        """(typcategory, typispreferred)."""
        if not oid:
            return ("X", False)
        info = self.type(oid)
        return info.category, info.preferred

    def array_type(self, elem: int) -> int:
        return self.type(elem).array if elem else 0

    def element_type(self, oid: int) -> int:
        info = self.type(oid)
        return info.elem if info.is_array else 0

    # --- operators and functions ---------------------------------------------------------------

    def operators(self, name: str, kind: str, schema: str | None = None) -> list[OperInfo]:
        """The operators of that name and kind visible on the search path (or in ``schema``):
        OpernameGetCandidates."""
        key = (name, kind, schema)
        found = self._operators.get(key)
        if found is None:
            where = "n.nspname = %s" if schema else "pg_operator_is_visible(o.oid)"
            rows = self._rows(
                "SELECT o.oid::int, o.oprname::text, n.nspname::text, o.oprkind::text, "
                "o.oprleft::int, o.oprright::int, o.oprresult::int, o.oprcode::oid::int "
                "FROM pg_operator o JOIN pg_namespace n ON n.oid = o.oprnamespace "
                f"WHERE o.oprname = %s AND o.oprkind = %s AND {where} ORDER BY o.oid",
                (name, kind, schema) if schema else (name, kind))
            found = self._operators[key] = [OperInfo(*r) for r in rows]
            self.load_types([t for o in found for t in (o.left, o.right, o.result)])
        return found

    _PROC_SQL = (
        "SELECT p.oid::int, p.proname::text, n.nspname::text, p.proargtypes::oid[]::int[], "
        "p.prorettype::int, p.provolatile::text, p.prosrc, p.proisstrict, p.proretset, "
        "p.prokind::text, p.provariadic::int, p.pronargdefaults::int, p.prolang::int "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace ")

    def _proc(self, row: tuple[Any, ...]) -> ProcInfo:
        values = list(row)
        values[3] = tuple(values[3] or ())
        info = ProcInfo(*values)
        self._procs[info.oid] = info
        return info

    def functions(self, name: str, nargs: int, schema: str | None = None) -> list[ProcInfo]:
        """Functions of that name taking ``nargs`` arguments (FuncnameGetCandidates, without
        variadic or default-argument expansion)."""
        key = (name, nargs, schema)
        found = self._functions.get(key)
        if found is None:
            where = "n.nspname = %s" if schema else "pg_function_is_visible(p.oid)"
            rows = self._rows(
                self._PROC_SQL + f"WHERE p.proname = %s AND p.pronargs = %s AND {where} "
                "ORDER BY p.oid", (name, nargs, schema) if schema else (name, nargs))
            found = self._functions[key] = [self._proc(r) for r in rows]
            self.load_types([t for p in found for t in (*p.argtypes, p.rettype)])
        return found

    def proc(self, oid: int) -> ProcInfo:
        info = self._procs.get(oid)
        if info is None:
            rows = self._rows(self._PROC_SQL + "WHERE p.oid = %s", (oid,))
            if not rows:
                raise LookupError(f"function with OID {oid} does not exist")
            info = self._proc(rows[0])
        return info

    def operator(self, oid: int) -> OperInfo:
        rows = self._rows(
            "SELECT o.oid::int, o.oprname::text, n.nspname::text, o.oprkind::text, "
            "o.oprleft::int, o.oprright::int, o.oprresult::int, o.oprcode::oid::int "
            "FROM pg_operator o JOIN pg_namespace n ON n.oid = o.oprnamespace "
            "WHERE o.oid = %s", (oid,))
        if not rows:
            raise LookupError(f"operator with OID {oid} does not exist")
        return OperInfo(*rows[0])

    def cast(self, source: int, target: int) -> CastInfo | None:
        key = (source, target)
        if key not in self._casts:
            rows = self._rows(
                "SELECT castsource::int, casttarget::int, castfunc::int, castcontext::text, "
                "castmethod::text FROM pg_cast WHERE castsource = %s AND casttarget = %s", key)
            self._casts[key] = CastInfo(*rows[0]) if rows else None
        return self._casts[key]

    # --- collations ----------------------------------------------------------------------------

    def collation(self, oid: int) -> CollationInfo:
        """A collation; the default collation (OID 100) is described by the database's
        locale settings."""
        if oid == DEFAULT_COLLATION:
            return self.default_collation()
        info = self._collations.get(oid)
        if info is None:
            rows = self._rows(
                "SELECT c.oid::int, c.collname::text, n.nspname::text, to_jsonb(c) "
                "FROM pg_collation c JOIN pg_namespace n ON n.oid = c.collnamespace "
                "WHERE c.oid = %s", (oid,))
            if not rows:
                raise LookupError(f"collation with OID {oid} does not exist")
            oid_, name, nsp, j = rows[0]
            info = self._collations[oid] = CollationInfo(
                oid_, name, nsp, j.get("collprovider", "c"), j.get("collcollate"),
                j.get("collctype"), j.get("colllocale") or j.get("colliculocale"),
                bool(j.get("collisdeterministic", True)))
        return info

    def default_collation(self) -> CollationInfo:
        if self._default_collation is None:
            (j,) = self._rows("SELECT to_jsonb(d) FROM pg_database d "
                              "WHERE d.datname = current_database()")[0]
            self._default_collation = CollationInfo(
                DEFAULT_COLLATION, "default", "pg_catalog", j.get("datlocprovider", "c"),
                j.get("datcollate"), j.get("datctype"),
                j.get("datlocale") or j.get("daticulocale"), True)
        return self._default_collation

    def casemap(self, coll: CollationInfo) -> CaseMap:
        """The server's case mapping under ``coll`` (lower, upper, initcap, ILIKE), read with
        one query over every code point. Kept for the process per server start, server
        version, provider, locale and collation version (C.UTF-8 has none: a server restarted
        after a C library upgrade is read again). Refused where it cannot be read."""
        mine = self._casemaps.get(coll.oid)
        if mine is not None:
            return mine
        if coll.oid == DEFAULT_COLLATION:
            clause = ""
            version_sql = ("(SELECT pg_database_collation_actual_version(oid) FROM pg_database "
                           "WHERE datname = current_database())")
        else:
            clause = f"COLLATE {_ident(coll.namespace)}.{_ident(coll.name)}"
            version_sql = f"pg_collation_actual_version({coll.oid})"
        encoding, started, version = self._rows(
            "SELECT getdatabaseencoding()::text, pg_postmaster_start_time()::text, "
            f"{version_sql}")[0]
        if encoding != "UTF8":
            raise NotSupportedError(
                f"pgdecode maps case for the \"C\" character classification only in a "
                f'{encoding} database, not for collation "{coll.name}" '
                f"({coll.ctype or coll.locale})",
                detail="The server's case mapping is read per Unicode code point, which "
                       "needs a UTF8 database.",
                hint='Use COLLATE "C" in the filter.')
        locale = (coll.ctype if coll.provider == "c" else coll.locale) or ""
        key = (self.server_version, started, coll.provider, locale, version)

        def load() -> CaseMap:
            if coll.provider == "b":
                rows = self._rows(table_query(clause))
            else:
                rows = table_rows(self._rows(chunked_query(clause)))
            return CaseMap.from_rows(coll.provider, locale, rows)

        def server(function: str, s: str) -> str:
            return str(self._rows(f"SELECT {function}(%s::text {clause})", (s,))[0][0])

        mine = self._casemaps[coll.oid] = cached(key, load).bind(server)
        return mine

    def collation_by_name(self, names: Sequence[str]) -> int | None:
        """The OID of a collation named in a COLLATE clause (for the database's encoding)."""
        if len(names) == 1:
            rows = self._rows(
                "SELECT c.oid::int FROM pg_collation c WHERE c.collname = %s "
                "AND c.collencoding IN (-1, pg_char_to_encoding(getdatabaseencoding())) "
                "AND pg_collation_is_visible(c.oid)", (names[0],))
        else:
            rows = self._rows(
                "SELECT c.oid::int FROM pg_collation c JOIN pg_namespace n "
                "ON n.oid = c.collnamespace WHERE n.nspname = %s AND c.collname = %s "
                "AND c.collencoding IN (-1, pg_char_to_encoding(getdatabaseencoding()))",
                (names[-2], names[-1]))
        return rows[0][0] if rows else None

    # --- type names ----------------------------------------------------------------------------

    def resolve_type_name(self, sql_type: str) -> tuple[int, int]:
        """(type OID, typmod) of a type name written in SQL, as the server's parser reads it.

        The name is put in a statement that is only parsed and described, never run.
        """
        return self.describe(f"SELECT NULL::{sql_type}")[0]

    def describe(self, sql: str) -> list[tuple[int, int]]:
        """The (type OID, typmod) of each result column of a query, from parse analysis only
        (the statement is prepared and described, never planned nor executed)."""
        pgconn = self.conn.pgconn
        name = b""  # the unnamed statement
        encoding = conn_encoding(self.conn)
        result = pgconn.prepare(name, sql.encode(encoding))
        _check(result, encoding)
        desc = pgconn.describe_prepared(name)
        _check(desc, encoding)
        return [(desc.ftype(i), desc.fmod(i)) for i in range(desc.nfields)]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _check(result: Any, encoding: str) -> None:
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise errors.error_from_result(result, encoding=encoding)
