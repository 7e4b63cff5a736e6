"""Row filters that map case (lower, upper, initcap, ILIKE) under the database's collation and
under named ones, against the server, on each server version: libc C.UTF-8 and en_US.UTF-8,
ICU (PostgreSQL 15 here: the embedded 18 is built without ICU) and the builtin provider
(PostgreSQL 17+). Strings with non-ASCII letters whose mappings differ between libraries
(Turkish dotted and dotless I, German sharp s, Greek sigma, titlecase digraphs).

(1) pgdecode's lower/upper/initcap of random strings equal the server's; (2) the decisions of
publications filtering on them equal the server's, row by row (the approach of
test_rowfilter_workload); (3) what cannot be exact is refused, saying why.
"""
# The look-alike letters (dotless i, Greek sigma and alpha...) are what is tested here.
# ruff: noqa: RUF001

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from support.pgtest import TestDatabase, drop_database, unique_dbname
from support.rowfilters import decode

from plugin_framework.cluster import LocalCluster
from plugin_framework.rowfilter import NotSupportedError, PublicationFilters
from plugin_framework.rowfilter.casemap import chunked_query, table_query, table_rows
from plugin_framework.rowfilter.pgcatalog import DEFAULT_COLLATION, TypeCatalog

pytestmark = pytest.mark.server

# Database locales: (id, CREATE DATABASE options, minimum server version, needs).
LOCALES = [
    ("libc-C.UTF-8", "LOCALE 'C.UTF-8'", 15, None),
    ("libc-en_US.UTF-8", "LOCALE 'en_US.UTF-8'", 15, "en_US.utf8"),
    ("icu-en-US", "LOCALE 'C.UTF-8' LOCALE_PROVIDER icu ICU_LOCALE 'en-US'", 15, "icu"),
    ("icu-tr-TR", "LOCALE 'C.UTF-8' LOCALE_PROVIDER icu ICU_LOCALE 'tr-TR'", 15, "icu"),
    # ICU, even where the database's LC_CTYPE is C: the ICU locale maps case.
    ("icu-en-US-ctype-C", "LOCALE 'C' LOCALE_PROVIDER icu ICU_LOCALE 'en-US'", 15, "icu"),
    ("builtin-C.UTF-8", "LOCALE 'C.UTF-8' LOCALE_PROVIDER builtin BUILTIN_LOCALE 'C.UTF-8'",
     17, None),
    ("builtin-PG_UNICODE_FAST", "LOCALE 'C.UTF-8' LOCALE_PROVIDER builtin "
     "BUILTIN_LOCALE 'PG_UNICODE_FAST'", 18, None),
]

# Letters whose case mappings differ between Python, glibc, ICU and PostgreSQL's own tables.
TRICKY = ("İıIiiÍĮJ\u0307ßẞΣσςΌΣΟΣǅǄǆǈǋﬁŉΐάΑΆΩΩKÅµſͅ" "ΑΣ ΣΑ"
          "ÉéÆæĲĳÇçÑñЁёĞğŞş" "aAzZ09 _-%'.,\t" "\u00a0\u2160\u24b6\u1e9e\U0001e900")
strings = st.text(alphabet=st.one_of(st.sampled_from(TRICKY), st.characters(
    exclude_categories=("Cs", "Cc"), exclude_characters="\x00")), max_size=10)


def _has_locale(name: str) -> bool:
    out = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False)
    return name in out.stdout.split()


def _icu(cluster: LocalCluster) -> bool:
    with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
        return bool(conn.execute("SELECT count(*) FROM pg_collation WHERE collprovider = 'i' "
                                 "AND collname LIKE '%-x-icu'").fetchone()[0])


@pytest.fixture(scope="module", params=[x[0] for x in LOCALES])
def locale_db(pg: LocalCluster, request: pytest.FixtureRequest) -> Iterator[TestDatabase]:
    """A database whose default collation is the parameter's."""
    name, options, minimum, needs = next(x for x in LOCALES if x[0] == request.param)
    if pg.major_version < minimum:
        pytest.skip(f"{name} needs PostgreSQL {minimum}+")
    if needs == "icu" and not _icu(pg):
        pytest.skip(f"PostgreSQL {pg.major_version} here is built without ICU")
    if needs and needs != "icu" and not _has_locale(needs):
        pytest.skip(f"the {needs} locale is not installed (localedef -i en_US -f UTF-8 "
                    "en_US.UTF-8, as .ci/run does)")
    dbname = unique_dbname("coll")
    with psycopg.connect(pg.conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' ")
                     .format(sql.Identifier(dbname)) + sql.SQL(options))  # type: ignore
    database = TestDatabase(pg, dbname, pg.conninfo(dbname), pg.major_version)
    try:
        yield database
    finally:
        drop_database(database)


def _server_maps(db: TestDatabase, values: list[str], collate: str = "",
                 initcap: bool = True) -> list[tuple[str, str, str | None]]:
    q = (f"SELECT lower(x {collate}), upper(x {collate}), "
         f"{f'initcap(x {collate})' if initcap else 'NULL'} "
         "FROM unnest(%s::text[]) WITH ORDINALITY u(x, n) ORDER BY n")
    return [tuple(r) for r in db.execute(q, (values,))]  # type: ignore[misc]


EXAMPLES = int(os.environ.get("PGDECODE_ROWFILTER_EXAMPLES", "60"))


def test_case_mapping_equals_the_servers(locale_db: TestDatabase) -> None:
    """lower, upper and initcap of random strings under the database's default collation
    (and, where it differs, Turkish ICU or PG_UNICODE_FAST as a named collation)."""
    cat = TypeCatalog.connect(locale_db.conninfo)
    try:
        collations = [(DEFAULT_COLLATION, "")]
        for named in ("tr-x-icu", "lt-x-icu", "el-x-icu", "az-x-icu", "pg_unicode_fast",
                      "pg_c_utf8", "en-US-x-icu"):
            oid = cat.collation_by_name([named])
            if oid is not None and (not named.endswith("-x-icu") or _icu(locale_db.cluster)):
                collations.append((oid, f'COLLATE "{named}"'))
        maps = [(cat.casemap(cat.collation(oid)), clause) for oid, clause in collations]

        @settings(max_examples=EXAMPLES, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(values=st.lists(strings, min_size=1, max_size=40))
        def check(values: list[str]) -> None:
            values = [*values, TRICKY, "ΌΣΟΣ ΣΑ", "ǆemal ǅ ǈ", "İstanbul ISTANBUL",
                      "straße STRASSE", "I\u0307i ΑΣ. ΣΣ Σ"]
            for cm, clause in maps:
                initcap = cm.provider != "i"
                server = _server_maps(locale_db, values, clause, initcap)
                mine = [(cm.lower(v), cm.upper(v), cm.initcap(v) if initcap else None)
                        for v in values]
                for v, a, b in zip(values, mine, server, strict=True):
                    assert a == b, (clause or "default", v)
        check()
    finally:
        cat.close()


_counter = itertools.count()

FILTERS = [
    "lower(owner) LIKE 'a%'",
    "lower(owner) = 'istanbul'",
    "upper(owner) = 'STRASSE'",
    "upper(owner) LIKE '%Σ%'",
    "lower(owner) LIKE '%ς%'",
    "owner ILIKE '%ß%'",
    "owner ILIKE 'i%'",
    "owner NOT ILIKE '%ǆ%'",
    "initcap(owner) LIKE 'Ǆ%' OR initcap(owner) LIKE '%ǅ%'",
    "initcap(owner) = owner",
    "lower(owner) = lower(upper(owner))",
    "upper(owner COLLATE \"C\") = 'ISTANBUL'",
]
owners = st.one_of(st.none(), strings, st.sampled_from(
    ["İstanbul", "istanbul", "ISTANBUL", "ıstanbul", "straße", "STRASSE", "Straße",
     "ΌΣΟΣ", "όσος", "ǅemal", "ǆemal", "aa", "Ab", "ǈuba", "ﬁne", "σς"]))


@settings(max_examples=max(EXAMPLES // 6, 4), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(filters=st.lists(st.sampled_from(FILTERS), min_size=1, max_size=3, unique=True),
       rows=st.lists(owners, min_size=1, max_size=25), binary=st.booleans())
def test_publication_decisions_equal_the_servers(locale_db: TestDatabase,
                                                 filters: list[str],
                                                 rows: list[str | None], binary: bool) -> None:
    """Publications filtering on case-mapped text: the server's decisions and pgdecode's
    (from an unfiltered publication) are the same, change by change."""
    if _icu_default(locale_db):
        filters = [f for f in filters if "initcap" not in f] or ["owner ILIKE 'i%'"]
    n = next(_counter)
    schema, slot = f"c{n}", f"c{n}_slot"
    names = [f"c{n}_p{i}" for i in range(len(filters))]
    conn = locale_db.connect(autocommit=True)
    try:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.acct (id int PRIMARY KEY, owner text)")
        for name, filt in zip(names, filters, strict=True):
            conn.execute(f"CREATE PUBLICATION {name} FOR TABLE {schema}.acct WHERE ({filt}) "
                         "WITH (publish = 'insert')")
        conn.execute(f"CREATE PUBLICATION c{n}_src FOR TABLE {schema}.acct")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("SET synchronous_commit = on")  # the commit flushed before peeking
        with conn.transaction():
            for i, owner in enumerate(rows):
                conn.execute(f"INSERT INTO {schema}.acct VALUES (%s, %s)", (i, owner))
        server = decode(locale_db, slot, ",".join(names), binary=binary)
        with PublicationFilters.from_publication(locale_db.conninfo, names) as filt:
            mine = decode(locale_db, slot, f"c{n}_src", filt, binary=binary)
        assert mine == server
    finally:
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        finally:
            conn.close()


def _icu_default(db: TestDatabase) -> bool:
    cat = TypeCatalog.connect(db.conninfo)
    try:
        return cat.default_collation().provider == "i"
    finally:
        cat.close()


def test_what_cannot_be_exact_is_refused_saying_why(locale_db: TestDatabase) -> None:
    """Ordering under a non-C collation, and initcap under ICU (word breaks), are refused;
    case mapping itself is not."""
    locale_db.execute("CREATE TABLE IF NOT EXISTS r (id int PRIMARY KEY, owner text)")
    ok = PublicationFilters.from_spec(locale_db.conninfo, {"r": "lower(owner) LIKE 'a%'"},
                                      publish=["insert"])
    ok.close()
    if _icu_default(locale_db):
        with pytest.raises(NotSupportedError, match="word boundaries"):
            PublicationFilters.from_spec(locale_db.conninfo, {"r": "initcap(owner) = 'A'"},
                                         publish=["insert"])
    coll = TypeCatalog.connect(locale_db.conninfo)
    try:
        code_point_order = coll.default_collation().code_point_order
    finally:
        coll.close()
    if not code_point_order:
        with pytest.raises(NotSupportedError, match=r"(?s)code point order.*does not reproduce"):
            PublicationFilters.from_spec(locale_db.conninfo, {"r": "owner < 'b'"},
                                         publish=["insert"])


def test_the_chunked_table_equals_the_per_code_point_one(pg: LocalCluster) -> None:
    """pgdecode reads libc's and ICU's case mapping a chunk of code points at a time; the
    table must be the one that asking the server code point by code point gives (which
    takes ICU half a minute on PostgreSQL 15), row for row: under libc C.UTF-8 and
    en_US.UTF-8, and under ICU's Turkish (its dotted and dotless i are the contexts a line
    feed must cut) where the server has ICU."""
    dbname = unique_dbname("chunks")
    with psycopg.connect(pg.conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' "
                             "LOCALE 'C.UTF-8'").format(sql.Identifier(dbname)))
    database = TestDatabase(pg, dbname, pg.conninfo(dbname), pg.major_version)
    clauses = [""]
    if _has_locale("en_US.utf8"):
        clauses.append('COLLATE "en_US.utf8"')
    if _icu(pg):
        clauses.append('COLLATE "tr-x-icu"')
    try:
        for clause in clauses:
            slow = database.execute(table_query(clause))
            fast = table_rows(database.execute(chunked_query(clause)))  # type: ignore[arg-type]
            assert len(fast) == len(slow) and set(fast) == set(slow), clause
    finally:
        drop_database(database)
