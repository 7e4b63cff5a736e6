"""What a consumer of the json emitter's lines does with them (``apply``: rebuild the
tables), and what the server says the tables hold (``server_tables``: the values as the
emitter must render them, from the server's own to_jsonb(), ::text, encode()...). Tests that
claim a target equals its source compare the two."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson
from psycopg import sql

ROW_OPS = ("insert", "update", "delete")

Line = dict[str, Any]


def loads(text: str | bytes) -> Any:
    """JSON with exact numbers: every non-integer as a Decimal."""
    return json.loads(text, parse_float=Decimal)


# --- what a consumer does with the lines, and what the server says ----------------------------


def canonical(value: Any) -> bytes:
    """One text for equal values (keys sorted, a Decimal as its string): orjson's, else (an
    integer past 64 bits) the json module's. A table's rows are sorted and keyed by it."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=str, sort_keys=True).encode()


def _key(row: dict[str, Any], columns: list[str]) -> bytes:
    return canonical([row[c] for c in columns] if columns else sorted(row.items()))


def apply(lines: list[Line]) -> dict[tuple[str, str], dict[bytes, dict[str, Any]]]:
    """Rebuild the tables from the lines, as a consumer would: lines of a prepared transaction
    emitted at PREPARE are held until its commit_prepared (dropped at rollback_prepared),
    unchanged TOAST columns keep the row's previous value."""
    tables: dict[tuple[str, str], dict[bytes, dict[str, Any]]] = {}
    held: dict[str, list[Line]] = {}

    def one(line: Line) -> None:
        op = line["op"]
        if op not in (*ROW_OPS, "snapshot", "truncate"):
            return
        rows = tables.setdefault((line["schema"], line["table"]), {})
        if op == "truncate":
            rows.clear()
            return
        key = line["key"]
        if op in ("update", "delete"):
            before = line["old"] if line["old"] is not None else line["new"]
            previous = rows.pop(_key(before, key))
        if op in ("insert", "update", "snapshot"):
            row = dict(line["new"])
            for column in line.get("unchanged_toast", []):
                assert column not in row
                row[column] = previous[column]
            rows[_key(row, key)] = row

    for line in lines:
        if line.get("phase") == "prepare":
            held.setdefault(line["gid"], []).append(line)
        elif line["op"] == "commit_prepared":
            for staged in held.pop(line["gid"]):
                one(staged)
        elif line["op"] == "rollback_prepared":
            held.pop(line["gid"])
        else:
            one(line)
    assert not held
    return tables


OPAQUE_IN_BINARY = {"money": "cash_send", "tsvector": "tsvectorsend", "tsquery": "tsquerysend"}


def expected_expression(column: str, base_type: str, options: dict[str, str],
                        binary: bool) -> str:
    """SQL for what the emitter must say about a column, as jsonb, from the server itself."""
    c = sql.Identifier(column).as_string(None)
    base64 = options.get("bytea") == "base64"

    def encoded(expr: str) -> str:
        if base64:
            return f"to_jsonb(translate(encode({expr}, 'base64'), E'\\n', ''))"
        return f"to_jsonb(encode({expr}, 'hex'))"

    if binary and base_type in OPAQUE_IN_BINARY:
        return encoded(f"{OPAQUE_IN_BINARY[base_type]}({c})")
    if base_type == "numeric":
        if options.get("numeric-as") == "number":
            return (f"CASE WHEN {c}::text IN ('NaN', 'Infinity', '-Infinity') "
                    f"THEN to_jsonb({c}::text) ELSE to_jsonb({c}) END")
        return f"to_jsonb({c}::text)"
    if base_type == "bytea":
        return encoded(c)
    if base_type in ("interval", "pg_lsn"):
        return f"to_jsonb({c}::text)"  # intervals: with IntervalStyle iso_8601
    if base_type == "oid":
        return f"to_jsonb({c}::int8)"
    if base_type == "timetz":
        return f"to_jsonb(regexp_replace({c}::text, '([+-]\\d\\d)$', '\\1:00'))"
    return f"to_jsonb({c})"


def server_tables(db: Any, tables: list[tuple[str, str]], options: dict[str, str],
                  binary: bool = False) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out = {}
    with db.connect(autocommit=True) as conn:
        conn.execute("SET intervalstyle = iso_8601")
        for schema, table in tables:
            qualified = sql.Identifier(schema, table).as_string(conn)
            columns = conn.execute(
                "SELECT a.attname, b.typname FROM pg_attribute a "
                "JOIN pg_type t ON t.oid = a.atttypid "
                "JOIN pg_type b ON b.oid = CASE t.typtype WHEN 'd' THEN t.typbasetype "
                "ELSE t.oid END "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
                "ORDER BY a.attnum", (qualified,)).fetchall()
            # each row one JSON array (of at most 100 values a call), all parsed at once
            values = [expected_expression(name, typ, options, binary) for name, typ in columns]
            array = " || ".join(f"jsonb_build_array({', '.join(values[i:i + 100])})"
                                for i in range(0, len(values), 100)) or "'[]'::jsonb"
            texts = conn.execute(f"SELECT ({array})::text FROM {qualified}").fetchall()
            names = [name for name, _ in columns]
            out[schema, table] = [dict(zip(names, row, strict=True))
                                  for row in loads(f"[{','.join(t for (t,) in texts)}]")]
    return out


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=canonical)


