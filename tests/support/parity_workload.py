"""The workload behind the emitter parity tests: the same transactions decoded by PostgreSQL's
own plugins (test_decoding, wal2json) and by pgdecode's emitters from pgoutput.

``setup_parity(db)`` creates the schema, a FOR ALL TABLES publication and the slots (created
before the workload, so that every plugin decodes exactly the same transactions);
``run_parity_workload(db)`` then runs the transactions. Nothing here is DDL after the slots
exist: pgoutput never sends empty transactions, test_decoding would print them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

STREAM_ROWS = 3000

# Column name -> type, and values for three rows: typical, edge cases, and NULL (third row is
# all NULL, so not listed). Values are SQL literals.
TYPES: list[tuple[str, str, str, str]] = [
    ("c_bool", "boolean", "true", "false"),
    ("c_int2", "smallint", "-32768", "32767"),
    ("c_int4", "integer", "42", "-2147483648"),
    ("c_int8", "bigint", "9223372036854775807", "-1"),
    ("c_numeric", "numeric", "123456789012345678901234567890.123456789", "'NaN'"),
    ("c_numeric_inf", "numeric", "'Infinity'", "'-Infinity'"),
    ("c_numeric_p", "numeric(10,3)", "-1.5", "0"),
    ("c_float4", "real", "1.25", "'-Infinity'"),
    ("c_float8", "double precision", "3.141592653589793", "'NaN'"),
    ("c_float8_inf", "double precision", "'Infinity'", "1e-300"),
    ("c_money", "money", "'12.34'", "'-0.01'"),
    ("c_char", "character(5)", "'ab'", "''"),
    ("c_varchar", "character varying(20)", "'héllo wörld'", "'it''s'"),
    ("c_text", "text", "E'line1\\nline2\\ttab \"dq\" \\\\ back'", "''"),
    ("c_name", "name", "'a_name'", "'Mixed Name'"),
    ("c_qchar", '"char"', "'x'", "'Z'"),
    ("c_bytea", "bytea", "'\\x00ff10'", "''"),
    ("c_bit", "bit(4)", "B'1010'", "B'0000'"),
    ("c_varbit", "bit varying(8)", "B'101'", "B''"),
    ("c_date", "date", "'2024-02-29'", "'infinity'"),
    ("c_time", "time without time zone", "'13:14:15.123456'", "'00:00'"),
    ("c_timetz", "time with time zone", "'13:14:15+05:30'", "'23:59:59-12'"),
    ("c_timestamp", "timestamp without time zone", "'2024-01-02 03:04:05.678'", "'-infinity'"),
    ("c_timestamptz", "timestamp(3) with time zone", "'2024-01-02 03:04:05.678+02'",
     "'1999-12-31 23:59:59.999 America/New_York'"),
    ("c_interval", "interval", "'1 year 2 mons 3 days 04:05:06.789'", "'-1 day'"),
    ("c_uuid", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
     "'00000000-0000-0000-0000-000000000000'"),
    ("c_json", "json", "'{\"a\": [1, 2.50, \"x\"], \"b\": null}'", "'\"str\"'"),
    ("c_jsonb", "jsonb", "'{\"b\": {\"c\": true}, \"a\": 1.10}'", "'[]'"),
    ("c_inet", "inet", "'192.168.0.1/24'", "'::1'"),
    ("c_cidr", "cidr", "'10.0.0.0/8'", "'2001:db8::/32'"),
    ("c_macaddr", "macaddr", "'08:00:2b:01:02:03'", "'ff:ff:ff:ff:ff:ff'"),
    ("c_macaddr8", "macaddr8", "'08:00:2b:01:02:03:04:05'", "'00:00:00:00:00:00:00:00'"),
    ("c_point", "point", "'(1,2)'", "'(-1.5,0)'"),
    ("c_line", "line", "'{1,2,3}'", "'{1,-1,0}'"),
    ("c_lseg", "lseg", "'[(0,0),(1,1)]'", "'[(1,2),(3,4)]'"),
    ("c_box", "box", "'(1,1),(0,0)'", "'(2,2),(-1,-1)'"),
    ("c_path", "path", "'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'"),
    ("c_polygon", "polygon", "'((0,0),(1,1),(1,0))'", "'((0,0),(0,1),(1,1),(1,0))'"),
    ("c_circle", "circle", "'<(0,0),5>'", "'<(1,1),0.5>'"),
    ("c_int4range", "int4range", "'[1,10)'", "'empty'"),
    ("c_numrange", "numrange", "'(1.5,2.5]'", "'(,)'"),
    ("c_tstzrange", "tstzrange", "'[2024-01-01 00:00+00,2024-02-01 00:00+00)'", "'empty'"),
    ("c_datemultirange", "datemultirange", "'{[2024-01-01,2024-01-05),[2024-02-01,2024-02-03)}'",
     "'{}'"),
    ("c_tsvector", "tsvector", "'a fat cat sat on a mat'", "''"),
    ("c_tsquery", "tsquery", "'fat & (rat | cat)'", "'!x'"),
    ("c_int_arr", "integer[]", "'{1,2,NULL,4}'", "'{}'"),
    ("c_text_arr", "text[]", "'{\"a b\",\"c,d\",NULL,\"e\\\"f\"}'", "'{\"\"}'"),
    ("c_int_2d", "integer[]", "'{{1,2},{3,4}}'", "'[0:1]={7,8}'"),
    ("c_jsonb_arr", "jsonb[]", "ARRAY['{\"k\": 1}'::jsonb, 'null'::jsonb]", "'{}'"),
    ("c_mood", "mood", "'happy'", "'sad'"),
    ("c_mood_arr", "mood[]", "'{sad,happy}'", "'{}'"),
    ("c_posint", "posint", "7", "2147483647"),
    ("c_oid", "oid", "4294967295", "0"),
    ("c_pg_lsn", "pg_lsn", "'16/B374D848'", "'0/0'"),
    ("c_xml", "xml", "'<a b=\"1\">text</a>'", "'<empty/>'"),
]

SCHEMA = '''
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE alltypes (id integer PRIMARY KEY, {columns});
CREATE SCHEMA "My Schema";
CREATE TABLE "My Schema"."Weird ""Table""" ("Mixed Case" integer PRIMARY KEY,
    "quote""d" text, "select" text, "spaced name" integer);
CREATE TABLE keyed (id serial PRIMARY KEY, a integer, b text);
CREATE TABLE ri_full (a integer, b text, c numeric);
ALTER TABLE ri_full REPLICA IDENTITY FULL;
CREATE TABLE ri_index (id integer NOT NULL, code text NOT NULL, v text);
CREATE UNIQUE INDEX ri_index_code ON ri_index (code);
ALTER TABLE ri_index REPLICA IDENTITY USING INDEX ri_index_code;
CREATE TABLE ri_nothing (a integer, b text);
ALTER TABLE ri_nothing REPLICA IDENTITY NOTHING;
CREATE TABLE toasty (id integer PRIMARY KEY, big text, other integer);
ALTER TABLE toasty ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE t_parent (id serial PRIMARY KEY, note text);
CREATE TABLE t_child (id serial PRIMARY KEY, parent_id integer REFERENCES t_parent);
CREATE TABLE bulk (id integer PRIMARY KEY, v text);
CREATE TABLE interleaved (id integer PRIMARY KEY, who text);
CREATE PUBLICATION parity_pub FOR ALL TABLES;
'''


@dataclass
class ParitySlots:
    pgoutput: str
    test_decoding: str
    wal2json: str | None  # only where the wal2json extension is installed (PostgreSQL 15 here)


def supported_types(db: Any) -> list[tuple[str, str, str, str]]:
    """TYPES minus what this server cannot do (xml needs a server built with libxml)."""
    try:
        db.execute("SELECT '<a/>'::xml")
    except psycopg.errors.FeatureNotSupported:
        return [t for t in TYPES if t[1] != "xml"]
    return TYPES


def has_wal2json(db: Any) -> bool:
    return (db.cluster.bindir.parent / "lib" / "wal2json.so").exists()


def setup_parity(db: Any) -> ParitySlots:
    columns = ", ".join(f"{name} {typ}" for name, typ, _, _ in supported_types(db))
    with db.connect(autocommit=True) as conn:
        conn.execute(SCHEMA.replace("{columns}", columns))
    prefix = db.dbname
    slots = ParitySlots(f"{prefix}_pgoutput", f"{prefix}_test_decoding",
                        f"{prefix}_wal2json" if has_wal2json(db) else None)
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
               (slots.pgoutput,))
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', false, true)",
               (slots.test_decoding,))
    if slots.wal2json:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slots.wal2json,))
    return slots


def run_parity_workload(db: Any) -> None:
    types = supported_types(db)
    names = ", ".join(t[0] for t in types)
    conn = db.connect(autocommit=True)
    # The SQL decoding functions read only flushed WAL; the test clusters commit asynchronously.
    conn.execute("SET synchronous_commit = on")
    ex = conn.execute

    ex(f"INSERT INTO alltypes (id, {names}) VALUES "
       f"(1, {', '.join(t[2] for t in types)}), (2, {', '.join(t[3] for t in types)}), (3, "
       f"{', '.join('NULL' for _ in types)})")
    ex("UPDATE alltypes SET c_text = 'changed', c_int4 = NULL WHERE id = 1")
    ex("UPDATE alltypes SET id = 10 WHERE id = 2")  # key change
    ex("DELETE FROM alltypes WHERE id = 3")

    ex('INSERT INTO "My Schema"."Weird ""Table""" VALUES (1, \'q"\', \'sel\', 2), '
       "(2, NULL, 'x', NULL)")
    ex('UPDATE "My Schema"."Weird ""Table""" SET "select" = \'y\' WHERE "Mixed Case" = 2')
    ex('DELETE FROM "My Schema"."Weird ""Table""" WHERE "Mixed Case" = 1')

    ex("BEGIN")
    ex("INSERT INTO ri_full VALUES (1, 'a', 1.5), (2, NULL, NULL)")
    ex("UPDATE ri_full SET b = 'b' WHERE a = 1")
    ex("DELETE FROM ri_full WHERE a = 2")
    ex("INSERT INTO ri_index VALUES (1, 'k1', 'v'), (2, 'k2', NULL)")
    ex("UPDATE ri_index SET v = 'w' WHERE id = 1")
    ex("UPDATE ri_index SET code = 'k3' WHERE id = 2")
    ex("DELETE FROM ri_index WHERE id = 1")
    ex("INSERT INTO ri_nothing VALUES (1, 'only inserts')")
    ex("COMMIT")

    ex("INSERT INTO toasty VALUES (1, repeat('toast', 2000), 1), (2, 'short', 2)")
    ex("UPDATE toasty SET other = 10 WHERE id = 1")  # big unchanged: not sent
    ex("UPDATE toasty SET big = repeat('TOAST', 2100) WHERE id = 1")
    ex("UPDATE toasty SET other = 20")
    ex("DELETE FROM toasty WHERE id = 1")

    ex("INSERT INTO keyed (a, b) VALUES (1, 'one'), (2, 'two')")
    ex("UPDATE keyed SET id = 100 WHERE a = 1")
    ex("INSERT INTO t_parent (note) VALUES ('p')")
    ex("INSERT INTO t_child (parent_id) VALUES (1)")
    ex("TRUNCATE t_parent, keyed RESTART IDENTITY CASCADE")
    ex("INSERT INTO keyed (a) VALUES (3)")
    ex("TRUNCATE ri_nothing")

    ex("BEGIN")
    ex("INSERT INTO keyed (a, b) VALUES (4, 'with message')")
    ex("SELECT pg_logical_emit_message(true, 'tx-prefix', 'transactional payload')")
    ex("COMMIT")
    ex("SELECT pg_logical_emit_message(false, 'nontx-prefix', 'non-transactional')")

    ex("BEGIN")
    ex("INSERT INTO keyed (a) VALUES (5)")
    ex("SAVEPOINT s1")
    ex("INSERT INTO keyed (a) VALUES (6)")
    ex("ROLLBACK TO SAVEPOINT s1")
    ex("INSERT INTO keyed (a) VALUES (7)")
    ex("COMMIT")

    ex("BEGIN")
    ex("INSERT INTO keyed (a) VALUES (8)")
    ex("ROLLBACK")

    ex("BEGIN")
    ex("INSERT INTO keyed (a, b) VALUES (9, 'prepared')")
    ex("PREPARE TRANSACTION 'parity-commit'")
    ex("COMMIT PREPARED 'parity-commit'")
    ex("BEGIN")
    ex("INSERT INTO keyed (a, b) VALUES (10, 'rolled back')")
    ex("PREPARE TRANSACTION 'parity-rollback'")
    ex("ROLLBACK PREPARED 'parity-rollback'")

    ex("BEGIN")
    ex("INSERT INTO bulk SELECT g, repeat('s', 30) FROM generate_series(1, %s::int) g",
       (STREAM_ROWS,))
    ex("SAVEPOINT big")
    ex("UPDATE bulk SET v = 'updated' WHERE id <= 1000")
    ex("ROLLBACK TO SAVEPOINT big")
    ex("DELETE FROM bulk WHERE id > %s::int", (STREAM_ROWS - 10,))
    ex("COMMIT")

    # Interleaved: B commits first although A began first; decoders deliver in commit order.
    other = db.connect(autocommit=True)
    other.execute("SET synchronous_commit = on")
    ex("BEGIN")
    ex("INSERT INTO interleaved VALUES (1, 'A')")
    other.execute("BEGIN")
    other.execute("INSERT INTO interleaved VALUES (2, 'B')")
    ex("INSERT INTO interleaved VALUES (3, 'A')")
    other.execute("COMMIT")
    ex("COMMIT")
    other.close()
    conn.close()
    time.sleep(0.1)
