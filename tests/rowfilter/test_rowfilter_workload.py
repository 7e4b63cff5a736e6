"""Differential test of row filters and column lists on random workloads.

Each example creates tables (a primary key one with a TOASTed column, a REPLICA IDENTITY FULL
one, a composite key one, a partitioned one), one to three random publications with row
filters, column lists, publish options and publish_via_partition_root, an unfiltered
publication of the same tables, and a slot; runs random transactions (NULLs, key changes,
unchanged TOAST values, cross-partition updates, truncates, a large streamed transaction);
then decodes the slot (a) through the filtered publications, by the server, and (b) through
the unfiltered publication, filtered by pgdecode. The two must be the same, operation by
operation, on each server version.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.rowfilters import decode

from plugin_framework.rowfilter import PublicationFilters

SCHEMA = """
CREATE TABLE {s}.ta (id int PRIMARY KEY, k int, v text, n numeric, big text);
ALTER TABLE {s}.ta ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE {s}.tb (id int, grp text, x int, big text);
ALTER TABLE {s}.tb REPLICA IDENTITY FULL;
ALTER TABLE {s}.tb ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE {s}.tc (k1 int, k2 text, x int, PRIMARY KEY (k1, k2));
CREATE TABLE {s}.tp (id int PRIMARY KEY, x int, note text) PARTITION BY RANGE (id);
CREATE TABLE {s}.tp1 PARTITION OF {s}.tp FOR VALUES FROM (0) TO (10);
CREATE TABLE {s}.tp2 PARTITION OF {s}.tp FOR VALUES FROM (10) TO (100);
"""


@dataclass(frozen=True)
class TableKind:
    identity: tuple[str, ...]
    full: bool
    identity_filters: tuple[str, ...]  # any publication may use these
    other_filters: tuple[str, ...]  # only publications of INSERT alone
    lists: tuple[tuple[str, ...], ...]  # column lists that include the identity
    insert_lists: tuple[tuple[str, ...], ...] = ()  # column lists for INSERT alone


TABLES = {
    "ta": TableKind(
        ("id",), False,
        ("id > 5", "id % 3 = 0", "id BETWEEN 3 AND 12", "id IN (1, 4, 9, 16)",
         "id::numeric / 4 > 2.1", "NOT (id < 8)", "id IS DISTINCT FROM 7"),
        ("k > 0", "v LIKE 'a%'", "n IS NULL", "coalesce(k, 0) <> 2", "length(big) > 3000",
         "v IS DISTINCT FROM 'x'", "n * 2 >= 3.5 OR v = ''"),
        (("id", "k"), ("id", "v", "big"), ("id", "n", "k")),
        (("k", "v"), ("big",))),
    "tb": TableKind(
        ("id", "grp", "x", "big"), True,
        ("grp = 'a'", "x > 2 OR x IS NULL", "length(big) > 3000", "grp IN ('a', 'b')",
         "x BETWEEN 1 AND 4", "big IS NULL AND id > 3", "upper(grp) = 'B'"),
        (),
        (),
        (("id", "grp"), ("x", "big"))),
    "tc": TableKind(
        ("k1", "k2"), False,
        ("k1 > 2 AND k2 <> 'z'", "k2 LIKE 'a%'", "k1 * 10 < 40", "k2 >= 'b'"),
        ("x IS NOT NULL", "x + k1 > 3"),
        (("k1", "k2"), ("k1", "k2", "x")),
        (("k2", "x"),)),
}
PARTITION_FILTERS = {"tp": ("id % 2 = 0", "id > 4 AND id < 40"),
                     "tp1": ("id > 3", "id <> 5"), "tp2": ("id < 50", "id % 5 = 1")}
ACTIONS = ("insert", "update", "delete", "truncate")


@dataclass
class Pub:
    publish: tuple[str, ...]
    via_root: bool
    in_schema: bool = False
    tables: dict[str, tuple[str | None, tuple[str, ...] | None]] = field(default_factory=dict)


@st.composite
def publications(draw: st.DrawFn) -> list[Pub]:
    pubs: list[Pub] = []
    lists: dict[str, tuple[str, ...] | None] = {}
    npubs = draw(st.integers(1, 3))
    use_schema = npubs > 1 and draw(st.integers(0, 5)) == 0
    for i in range(npubs):
        publish = draw(st.one_of(
            st.just(ACTIONS),
            st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=4, unique=True).map(
                lambda x: tuple(a for a in ACTIONS if a in x))))
        pub = Pub(publish, draw(st.booleans()))
        if use_schema and i == 0:
            pub.in_schema = True
            pubs.append(pub)
            continue
        dml = "update" in publish or "delete" in publish
        names = draw(st.lists(st.sampled_from(["ta", "tb", "tc", "tp"]), min_size=1,
                              max_size=4, unique=True))
        for name in names:
            if name == "tp":
                parts = ["tp"] if pub.via_root or draw(st.booleans()) else ["tp1", "tp2"]
                for part in parts:
                    filt = None
                    if not (part == "tp" and not pub.via_root) and draw(st.booleans()):
                        filt = draw(st.sampled_from(PARTITION_FILTERS[part]))
                    pub.tables[part] = (filt, None)
                continue
            kind = TABLES[name]
            choices = kind.identity_filters + (() if dml else kind.other_filters)
            filt = draw(st.one_of(st.none(), st.sampled_from(choices))) if choices else None
            pub.tables[name] = (filt, None)
        pubs.append(pub)
    if not use_schema:  # one column list per table, the same in every publication
        for name, kind in TABLES.items():
            users = [p for p in pubs if name in p.tables]
            if not users or not draw(st.booleans()):
                continue
            dml = any("update" in p.publish or "delete" in p.publish for p in users)
            options = kind.lists + (() if dml else kind.insert_lists)
            if kind.full and dml:
                options = ()
            if options:
                lists[name] = draw(st.sampled_from(options))
        for p in pubs:
            for name, (filt, _) in list(p.tables.items()):
                if name in lists:
                    p.tables[name] = (filt, lists[name])
    return pubs


VALUES_V = ["a", "ab", "b", "x", "", None, "z"]
VALUES_GRP = ["a", "b", "c", None]


def big_value(rnd: random.Random) -> str | None:
    choice = rnd.randrange(4)
    if choice == 0:
        return None
    if choice == 1:
        return "short"
    return "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in
                   range(rnd.randrange(2500, 9000)))


def random_op(rnd: random.Random, truncate_tp: bool) -> tuple[str, list[Any]]:
    table = rnd.choice(["ta", "ta", "tb", "tb", "tc", "tp"])
    kind = rnd.randrange(10)
    s = "{s}"
    if kind == 9:
        tables = rnd.sample(["ta", "tb", "tc"] + (["tp"] if truncate_tp else []), 2)
        return f"TRUNCATE {', '.join(f'{s}.{t}' for t in tables)}", []
    if table == "ta":
        if kind < 4:
            return (f"INSERT INTO {s}.ta VALUES (%s, %s, %s, %s, %s)",
                    [rnd.randrange(20), rnd.choice([None, -1, 0, 1, 2, 5]),
                     rnd.choice(VALUES_V), rnd.choice([None, "1.5", "2", "-3.25"]),
                     big_value(rnd)])
        if kind < 8:
            sets = rnd.choice([["k = %s"], ["v = %s"], ["id = %s"], ["big = %s"],
                               ["k = %s", "id = %s"], ["n = %s"]])
            params = []
            for item in sets:
                col = item.split()[0]
                params.append({"k": rnd.choice([None, 0, 1, 3]), "v": rnd.choice(VALUES_V),
                               "id": rnd.randrange(20), "big": big_value(rnd),
                               "n": rnd.choice([None, "1.75", "0"])}[col])
            return (f"UPDATE {s}.ta SET {', '.join(sets)} WHERE id = %s",
                    [*params, rnd.randrange(20)])
        return f"DELETE FROM {s}.ta WHERE id = %s", [rnd.randrange(20)]
    if table == "tb":
        if kind < 4:
            return (f"INSERT INTO {s}.tb VALUES (%s, %s, %s, %s)",
                    [rnd.randrange(8), rnd.choice(VALUES_GRP), rnd.choice([None, 0, 2, 3, 5]),
                     big_value(rnd)])
        if kind < 8:
            col = rnd.choice(["grp", "x", "id", "big"])
            value = {"grp": rnd.choice(VALUES_GRP), "x": rnd.choice([None, 1, 4, 7]),
                     "id": rnd.randrange(8), "big": big_value(rnd)}[col]
            return f"UPDATE {s}.tb SET {col} = %s WHERE id = %s", [value, rnd.randrange(8)]
        return f"DELETE FROM {s}.tb WHERE id = %s", [rnd.randrange(8)]
    if table == "tc":
        if kind < 4:
            return (f"INSERT INTO {s}.tc VALUES (%s, %s, %s)",
                    [rnd.randrange(6), rnd.choice(["a", "b", "ab", "z"]),
                     rnd.choice([None, 0, 3, 9])])
        if kind < 8:
            col = rnd.choice(["k2", "x", "k1"])
            value = {"k2": rnd.choice(["a", "b", "zz"]), "x": rnd.choice([None, 1, 5]),
                     "k1": rnd.randrange(6)}[col]
            return f"UPDATE {s}.tc SET {col} = %s WHERE k1 = %s", [value, rnd.randrange(6)]
        return f"DELETE FROM {s}.tc WHERE k1 = %s", [rnd.randrange(6)]
    if kind < 4:
        return (f"INSERT INTO {s}.tp VALUES (%s, %s, %s)",
                [rnd.randrange(60), rnd.choice([None, 1, 2]), rnd.choice(["n", None])])
    if kind < 8:
        col = rnd.choice(["x", "id", "note"])
        value = {"x": rnd.choice([None, 3]), "id": rnd.randrange(60),
                 "note": rnd.choice(["m", None])}[col]
        return f"UPDATE {s}.tp SET {col} = %s WHERE id = %s", [value, rnd.randrange(60)]
    return f"DELETE FROM {s}.tp WHERE id = %s", [rnd.randrange(60)]


_counter = itertools.count()
STATS: collections.Counter[str] = collections.Counter()


def create_publication(conn: psycopg.Connection[Any], schema: str, name: str,
                       pub: Pub) -> None:
    options = (f"WITH (publish = '{', '.join(pub.publish)}', "
               f"publish_via_partition_root = {str(pub.via_root).lower()})")
    if pub.in_schema:
        conn.execute(f"CREATE PUBLICATION {name} FOR TABLES IN SCHEMA {schema} {options}")
        return
    items = []
    for table, (filt, cols) in pub.tables.items():
        item = f"{schema}.{table}"
        if cols:
            item += f" ({', '.join(cols)})"
        if filt:
            item += f" WHERE ({filt})"
        items.append(item)
    conn.execute(f"CREATE PUBLICATION {name} FOR TABLE {', '.join(items)} {options}")


def run_example(db: Any, pubs: list[Pub], seed: int, streaming: bool, binary: bool) -> None:
    n = next(_counter)
    schema = f"w{n}"
    names = [f"{schema}_p{i}" for i in range(len(pubs))]
    slot = f"{schema}_slot"
    conn = db.connect(autocommit=True)
    try:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(SCHEMA.format(s=schema))
        for name, pub in zip(names, pubs, strict=True):
            create_publication(conn, schema, name, pub)
        conn.execute(f"CREATE PUBLICATION {schema}_src FOR TABLES IN SCHEMA {schema}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("SET synchronous_commit = on")
        rnd = random.Random(seed)
        truncate_tp = not any(p.via_root for p in pubs)
        for _ in range(rnd.randrange(4, 14)):
            try:
                with conn.transaction():
                    for _ in range(rnd.randrange(1, 5)):
                        sql, params = random_op(rnd, truncate_tp)
                        conn.execute(sql.format(s=schema), params)
            except psycopg.errors.UniqueViolation:
                pass
        if streaming:  # one transaction larger than logical_decoding_work_mem
            with conn.transaction():
                conn.execute(f"INSERT INTO {schema}.tc SELECT g, 'big', g % 7 "
                             "FROM generate_series(100, 2100) g")
                conn.execute(f"UPDATE {schema}.tc SET x = x + 1 WHERE k1 % 3 = 0")
                conn.execute(f"DELETE FROM {schema}.tc WHERE k1 > 100 AND k1 % 2 = 0")

        server = decode(db, slot, ",".join(names), streaming=streaming, binary=binary)
        with PublicationFilters.from_publication(db.conninfo, names) as filters:
            mine = decode(db, slot, f"{schema}_src", filters, streaming=streaming,
                          binary=binary)
        assert len(mine) == len(server)
        for i, (a, b) in enumerate(zip(mine, server, strict=True)):
            assert a == b, f"transaction {i} differs"
        STATS["examples"] += 1
        for txn in server:
            for ev in txn:
                STATS[ev[0] if ev[0] == "truncate" else ev[2]] += 1
        with PublicationFilters.from_publication(db.conninfo, f"{schema}_src") as everything:
            unfiltered = decode(db, slot, f"{schema}_src", everything, streaming=streaming,
                                binary=binary)
        STATS["unfiltered"] += sum(len(t) for t in unfiltered)
    finally:
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s) FROM pg_replication_slots "
                         "WHERE slot_name = %s", (slot, slot))
        finally:
            conn.close()


EXAMPLES = int(os.environ.get("PGDECODE_ROWFILTER_WORKLOADS", "25"))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(pubs=publications(), seed=st.integers(0, 2**32 - 1), streaming=st.booleans(),
       binary=st.booleans())
def test_random_workloads_filter_like_the_server(pg_module_db: Any, pubs: list[Pub],
                                                 seed: int, streaming: bool,
                                                 binary: bool) -> None:
    run_example(pg_module_db, pubs, seed, streaming, binary)


@pytest.mark.parametrize("seed", range(3))
def test_every_feature_at_once(pg_module_db: Any, seed: int) -> None:
    """Fixed examples: two publications ORed (one via the partition root), filters on
    identity and on non-identity columns, column lists, TOAST, streaming."""
    pubs = [
        Pub(("insert", "update", "delete", "truncate"), True,
            tables={"ta": ("id % 3 = 0", ("id", "v", "big")), "tb": ("grp = 'a'", None),
                    "tp": ("id % 2 = 0", ("id", "x")), "tc": ("k1 > 2 AND k2 <> 'z'", None)}),
        Pub(("insert",), False,
            tables={"ta": ("v LIKE 'a%'", ("id", "v", "big")),
                    "tb": ("length(big) > 3000", None), "tc": (None, None)}),
    ]
    run_example(pg_module_db, pubs, seed, streaming=seed == 0, binary=seed == 1)


def test_the_workloads_were_not_trivial() -> None:
    """Most changes pass, some are filtered out (the counts are printed with -s)."""
    print("row-filter workloads:", dict(STATS))
    if STATS["examples"] >= 10:
        assert STATS["INSERT"] and STATS["UPDATE"] and STATS["DELETE"]
        assert STATS["unfiltered"] > STATS["INSERT"] + STATS["UPDATE"] + STATS["DELETE"]
