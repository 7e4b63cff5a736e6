"""The json emitter on real streams from each server version.

Every line it writes is validated against docs/json-change.schema.json, and the values are
checked against the server itself: the table state a consumer rebuilds from the lines equals
what the server's own to_jsonb() (or encode(), ::text...) says about the tables after the
workload, and the transaction facts (xids, commit times, gids) are the server's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from psycopg.adapt import Loader
from support.capture import Captured, peek, pgoutput_options
from support.jsonmirror import (
    ROW_OPS,
    Line,
    apply,
    loads,
    ordered,
    server_tables,
)
from support.parity_workload import run_parity_workload, setup_parity
from support.pgtest import create_database, drop_database
from support.recorders import with_fast_path
from support.workload import Facts, create_schema, run_workload

from emitters.json import JsonEmitter
from plugin_framework import MemoryOutput, Pipeline
from plugin_framework.framework import CallbackError, Catalog
from plugin_framework.pgtypes import TypeConverters, iso_interval, parse_array_text, pg_float8_text
from plugin_framework.pgtypes.oids import INT4, JSONB, NUMERIC

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "json-change.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)
VALID_LINES: set[str] = set()  # lines already validated

# --- sources: a database, its slot, and the captured stream ------------------------------------


@dataclass
class Source:
    db: Any
    slot: str
    publication: str
    facts: Facts | None = None
    captures: dict[tuple[bool, bool], list[Captured]] = field(default_factory=dict)
    outputs: dict[Any, tuple[list[str], list[Line]]] = field(default_factory=dict)
    # per emit_raw key: how many changes the fast path wrote, and how many it declined
    fast_counts: dict[Any, Counter[str]] = field(default_factory=dict)

    @property
    def proto(self) -> int:
        return 4 if self.db.major_version >= 16 else 3

    def capture(self, streaming: bool, binary: bool) -> list[Captured]:
        key = (streaming, binary)
        if key not in self.captures:
            options = pgoutput_options(self.proto, streaming="on" if streaming else "off",
                                       binary=binary, publication=self.publication)
            with self.db.connect(autocommit=True) as conn:
                self.captures[key] = peek(conn, self.slot, options)
        return self.captures[key]

    def emit(self, options: dict[str, str] | None = None, *, streaming: bool = True,
             binary: bool = False, catalog: bool = False) -> list[Line]:
        return self.emit_raw(options, streaming=streaming, binary=binary, catalog=catalog)[1]

    def emit_raw(self, options: dict[str, str] | None = None, *, streaming: bool = True,
                 binary: bool = False, catalog: bool = False,
                 fast: bool = True) -> tuple[list[str], list[Line]]:
        """The json emitter's lines over the whole stream: as text, and parsed. Every line is
        validated against the published schema. ``fast=False``: without the emitter's fast
        path, every change through its Python change callback."""
        options = options or {}
        key = (tuple(sorted(options.items())), streaming, binary, catalog, fast)
        if key in self.outputs:
            return self.outputs[key]
        cat = Catalog(self.db.conninfo) if catalog else None
        pipeline = Pipeline(proto_version=self.proto, catalog=cat)
        out = MemoryOutput()
        counts = self.fast_counts[key] = Counter()
        pipeline.add(with_fast_path(JsonEmitter(), counts, fast), options=options, output=out)
        pipeline.startup()
        for item in self.capture(streaming, binary):
            pipeline.feed(item.data, item.lsn)
        assert not pipeline.in_flight
        pipeline.shutdown()
        if cat is not None:
            cat.close()
        texts = out.lines
        lines = []
        for text in texts:
            assert "\n" not in text and "\r" not in text
            line = loads(text)
            if text not in VALID_LINES:  # many runs share most lines: validate each once
                errors = list(VALIDATOR.iter_errors(line))
                assert not errors, f"{text[:300]}: {[e.message[:300] for e in errors]}"
                VALID_LINES.add(text)
            lines.append(line)
        self.outputs[key] = (texts, lines)
        return texts, lines


@pytest.fixture(scope="module")
def parity(pg_module_db: Any) -> Source:
    slots = setup_parity(pg_module_db)
    run_parity_workload(pg_module_db)
    return Source(pg_module_db, slots.pgoutput, "parity_pub")


@pytest.fixture(scope="module")
def work(pg: Any) -> Iterator[Source]:
    db = create_database(pg)
    try:
        conn = db.connect(autocommit=True)
        create_schema(conn)
        slot = f"{db.dbname}_json"
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                   (slot,))
        facts = run_workload(conn)
        # A message that is not UTF-8, after the workload (peek reads everything anyway).
        conn.execute("SELECT pg_logical_emit_message(false, 'bin', '\\xff00fe'::bytea)")
        # The SQL decoding functions read only flushed WAL and the test clusters commit
        # asynchronously: a synchronous commit flushes everything before it.
        conn.execute("SET synchronous_commit = on")
        with conn.transaction():
            conn.execute("SELECT txid_current()")
        conn.close()
        yield Source(db, slot, "pub", facts)
    finally:
        drop_database(db)


@pytest.fixture(params=["parity", "work"])
def source(request: pytest.FixtureRequest, parity: Source, work: Source) -> Source:
    return parity if request.param == "parity" else work


PARITY_TABLES = [("public", t) for t in (
    "alltypes", "keyed", "ri_full", "ri_index", "ri_nothing", "toasty", "t_parent", "t_child",
    "bulk", "interleaved")] + [("My Schema", 'Weird "Table"')]
WORK_TABLES = [("public", t) for t in ("items", "parent", "child", "fulltab", "moods", "bulk")]

COMBINATIONS = {
    "defaults": ({}, True, False),
    "unstreamed": ({}, False, False),
    "two-phase": ({"two-phase": "on"}, True, False),
    "events": ({"include-transaction-events": "on"}, True, False),
    "events-two-phase": ({"include-transaction-events": "on", "two-phase": "on"}, False,
                         False),
    "number-base64": ({"numeric-as": "number", "bytea": "base64"}, True, False),
    "binary": ({}, True, True),
    "binary-base64-two-phase": ({"bytea": "base64", "two-phase": "on"}, True, True),
}


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_lines_validate_and_rebuild_the_server_tables(source: Source, combination: str) -> None:
    options, streaming, binary = COMBINATIONS[combination]
    lines = source.emit(options, streaming=streaming, binary=binary, catalog=binary)
    assert lines
    rebuilt = apply(lines)
    tables = WORK_TABLES if source.facts else PARITY_TABLES
    expected = server_tables(source.db, tables, options, binary)
    for table in tables:
        assert ordered(list(rebuilt.get(table, {}).values())) == ordered(expected[table]), table


# --- the values, spelled out --------------------------------------------------------------------


def final_rows(lines: list[Line], table: str) -> dict[Any, dict[str, Any]]:
    rows = apply(lines)[("public", table)]
    return {r["id"]: r for r in rows.values()}


def test_alltypes_values(parity: Source) -> None:
    rows = final_rows(parity.emit(), "alltypes")
    assert set(rows) == {1, 10}
    one, two = rows[1], rows[10]
    assert one["c_bool"] is True and two["c_bool"] is False
    assert (one["c_int2"], one["c_int8"], two["c_int4"]) == (-32768, 2**63 - 1, -(2**31))
    assert one["c_int4"] is None  # set to NULL by the update
    assert one["c_numeric"] == "123456789012345678901234567890.123456789"
    assert one["c_numeric_p"] == "-1.500" and two["c_numeric_p"] == "0.000"
    assert (two["c_numeric"], one["c_numeric_inf"], two["c_numeric_inf"]) == (
        "NaN", "Infinity", "-Infinity")
    assert one["c_float4"] == Decimal("1.25") and two["c_float4"] == "-Infinity"
    assert one["c_float8"] == Decimal("3.141592653589793") and two["c_float8"] == "NaN"
    assert two["c_float8_inf"] == Decimal("1e-300") and one["c_float8_inf"] == "Infinity"
    assert one["c_char"] == "ab   " and one["c_varchar"] == "héllo wörld"
    assert one["c_text"] == "changed" and two["c_text"] == ""
    assert one["c_bytea"] == "00ff10" and two["c_bytea"] == ""
    assert one["c_date"] == "2024-02-29" and two["c_date"] == "infinity"
    assert one["c_time"] == "13:14:15.123456"
    assert (one["c_timetz"], two["c_timetz"]) == ("13:14:15+05:30", "23:59:59-12:00")
    assert one["c_timestamp"] == "2024-01-02T03:04:05.678" and two["c_timestamp"] == "-infinity"
    # The test clusters run in UTC.
    assert one["c_timestamptz"] == "2024-01-02T01:04:05.678+00:00"
    assert two["c_timestamptz"] == "2000-01-01T04:59:59.999+00:00"
    assert one["c_interval"] == "P1Y2M3DT4H5M6.789S" and two["c_interval"] == "P-1D"
    assert one["c_json"] == {"a": [1, Decimal("2.50"), "x"], "b": None}
    assert two["c_json"] == "str" and two["c_jsonb"] == []
    assert one["c_jsonb"] == {"a": Decimal("1.10"), "b": {"c": True}}
    assert one["c_int_arr"] == [1, 2, None, 4] and two["c_int_arr"] == []
    assert one["c_text_arr"] == ["a b", "c,d", None, 'e"f'] and two["c_text_arr"] == [""]
    assert one["c_int_2d"] == [[1, 2], [3, 4]] and two["c_int_2d"] == [7, 8]  # [0:1] dropped
    assert one["c_jsonb_arr"] == [{"k": 1}, None]
    assert one["c_mood"] == "happy" and one["c_mood_arr"] == ["sad", "happy"]
    assert one["c_posint"] == 7  # a domain is its base type
    assert one["c_oid"] == 4294967295 and two["c_oid"] == 0
    assert one["c_uuid"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert one["c_inet"] == "192.168.0.1/24" and two["c_cidr"] == "2001:db8::/32"
    assert one["c_point"] == "(1,2)" and one["c_int4range"] == "[1,10)"
    assert one["c_pg_lsn"] == "16/B374D848"
    assert one["c_money"] == "$12.34"


def test_numeric_as_number_keeps_every_digit(parity: Source) -> None:
    texts, lines = parity.emit_raw({"numeric-as": "number"})
    first = next(t for t in texts if '"table":"alltypes"' in t and '"op":"insert"' in t)
    assert '"c_numeric":123456789012345678901234567890.123456789,' in first
    assert '"c_numeric_p":-1.500,' in first and '"c_numeric_inf":"Infinity",' in first
    rows = final_rows(lines, "alltypes")
    assert rows[10]["c_numeric"] == "NaN" and rows[10]["c_numeric_p"] == Decimal("0.000")


def test_bytea_as_base64(parity: Source) -> None:
    rows = final_rows(parity.emit({"bytea": "base64"}), "alltypes")
    assert rows[1]["c_bytea"] == "AP8Q" and rows[10]["c_bytea"] == ""


def _without(line: Line, columns: set[str]) -> Line:
    out = {k: v for k, v in line.items() if k != "binary"}
    for part in ("new", "old"):
        if isinstance(out.get(part), dict):
            out[part] = {k: v for k, v in out[part].items() if k not in columns}
    return out


@pytest.mark.native  # it counts the changes the C formatters took
@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_fast_path_writes_the_callbacks_lines(source: Source, combination: str) -> None:
    """The C fast path writes exactly what the change callback writes, for every type and
    value the workloads make; in text format it writes every change, replayed ones included
    (binary columns it leaves to the callback)."""
    options, streaming, binary = COMBINATIONS[combination]
    fast = source.emit_raw(options, streaming=streaming, binary=binary, catalog=binary)[0]
    reference = source.emit_raw(options, streaming=streaming, binary=binary, catalog=binary,
                                fast=False)[0]
    assert fast == reference
    counts = source.fast_counts[(tuple(sorted(options.items())), streaming, binary, binary,
                                 True)]
    if binary:
        assert counts["fast"] == 0
    else:
        assert counts["declined"] == 0
        # Every change, those replayed from the spool too: streamed transactions (the
        # emitter has no stream callbacks) and prepared ones it gets at COMMIT PREPARED.
        changed = sum(1 for line in source.emit(options, streaming=streaming)
                      if line["op"] in ROW_OPS)
        assert counts["fast"] == changed > 0


def test_binary_format_gives_the_same_lines(source: Source) -> None:
    """pgoutput's binary option changes nothing but the columns of types pgdecode cannot
    render from the send format, which the lines name in "binary"."""
    text = source.emit()
    binary = source.emit(binary=True, catalog=True)
    assert len(text) == len(binary)
    opaque = {c for line in binary for c in line.get("binary", [])}
    assert opaque == (set() if source.facts else {"c_money", "c_tsvector", "c_tsquery"})
    for a, b in zip(text, binary, strict=True):
        assert _without(a, opaque) == _without(b, opaque)


def test_binary_format_without_catalog(parity: Source) -> None:
    """Without a catalog connection, an enum's send format cannot be told from any other
    user type's: its values are the bytes, named in "binary", never a guess."""
    rows = final_rows(parity.emit(binary=True), "alltypes")
    assert rows[1]["c_mood"] == b"happy".hex()
    assert rows[1]["c_mood_arr"] == [b"sad".hex(), b"happy".hex()]
    assert rows[1]["c_posint"] == 7  # a domain over a built-in type still is its base type
    insert = next(line for line in parity.emit(binary=True)
                  if line["op"] == "insert" and line["table"] == "alltypes")
    assert set(insert["binary"]) == {"c_money", "c_tsvector", "c_tsquery", "c_mood",
                                     "c_mood_arr"}


# --- rows: key, old, unchanged TOAST ------------------------------------------------------------


def changes(lines: list[Line], table: str, op: str | None = None) -> list[Line]:
    return [line for line in lines if line["op"] in ROW_OPS and line["table"] == table
            and (op is None or line["op"] == op)]


def test_unchanged_toast_is_listed_and_absent(parity: Source, work: Source) -> None:
    updates = changes(parity.emit(), "toasty", "update")
    unchanged = [u for u in updates if u["unchanged_toast"]]
    assert [u["new"]["id"] for u in unchanged] == [1, 1]  # other = 10, then other = 20
    for u in unchanged:
        assert u["unchanged_toast"] == ["big"] and "big" not in u["new"]
    changed = [u for u in updates if u["new"]["id"] == 1 and not u["unchanged_toast"]]
    assert changed and changed[0]["new"]["big"] == "TOAST" * 2100
    items = changes(work.emit(), "items", "update")
    assert any(u["unchanged_toast"] == ["big"] and "big" not in u["new"] for u in items)
    for table, lines in (("toasty", updates), ("items", items)):
        columns = set(next(iter(changes(parity.emit() if table == "toasty" else work.emit(),
                                        table, "insert")))["new"])
        for u in lines:
            assert set(u["new"]) | set(u["unchanged_toast"]) == columns
            assert not set(u["new"]) & set(u["unchanged_toast"])


def test_old_rows_follow_the_replica_identity(parity: Source) -> None:
    lines = parity.emit()
    full = changes(lines, "ri_full")
    assert {line["identity"] for line in full} == {"full"}
    assert full[0]["key"] == ["a", "b", "c"]
    update = next(line for line in full if line["op"] == "update")
    assert update["old_is_key"] is False and update["old"] == {"a": 1, "b": "a", "c": "1.5"}
    delete = next(line for line in full if line["op"] == "delete")
    assert delete["old"] == {"a": 2, "b": None, "c": None}

    index = changes(lines, "ri_index")
    assert {line["identity"] for line in index} == {"index"} and index[0]["key"] == ["code"]
    key_change = next(line for line in index
                      if line["op"] == "update" and line["new"]["code"] == "k3")
    assert key_change["old_is_key"] is True and key_change["old"] == {"code": "k2"}
    plain = next(line for line in index if line["op"] == "update" and line["new"]["id"] == 1)
    assert plain["old"] is None and plain["old_is_key"] is False
    delete = next(line for line in index if line["op"] == "delete")
    assert delete["old"] == {"code": "k1"} and delete["old_is_key"] is True

    nothing = changes(lines, "ri_nothing")
    assert [(n["op"], n["key"], n["identity"]) for n in nothing] == [("insert", [], "nothing")]

    moved = next(line for line in changes(lines, "alltypes", "update") if line["old"])
    assert moved["old"] == {"id": 2} and moved["new"]["id"] == 10 and moved["key"] == ["id"]


def test_odd_identifiers(parity: Source) -> None:
    weird = [line for line in parity.emit() if line.get("schema") == "My Schema"]
    assert {line["table"] for line in weird} == {'Weird "Table"'}
    assert weird[0]["key"] == ["Mixed Case"]
    assert weird[0]["new"] == {"Mixed Case": 1, 'quote"d': 'q"', "select": "sel",
                               "spaced name": 2}


def test_truncate_lines(parity: Source, work: Source) -> None:
    truncates = [line for line in parity.emit() if line["op"] == "truncate"]
    first = [t for t in truncates if t["cascade"]]
    assert sorted(t["table"] for t in first) == ["keyed", "t_child", "t_parent"]
    assert len({(t["lsn"], t["xid"]) for t in first}) == 1 and first[0]["restart_identity"]
    assert [(t["table"], t["cascade"], t["restart_identity"]) for t in truncates
            if not t["cascade"]] == [("ri_nothing", False, False)]
    facts = work.facts
    assert facts is not None
    wt = [line for line in work.emit() if line["op"] == "truncate"]
    assert {t["table"] for t in wt} == {"parent", "child"}
    assert {t["xid"] for t in wt} == {facts.xids["truncate"]}


# --- transactions -------------------------------------------------------------------------------


def test_transaction_fields_are_the_servers(work: Source) -> None:
    facts = work.facts
    assert facts is not None
    lines = work.emit()
    xids = {line["xid"] for line in lines if line["xid"] is not None}
    assert facts.xids["stream_abort"] not in xids and facts.xids["2pc_rollback"] not in xids
    for label in ("insert", "update", "full", "enum", "truncate", "messages", "origin",
                  "stream", "2pc_commit", "2pc_stream"):
        assert facts.xids[label] in xids, label
    with work.db.connect(autocommit=True) as conn:
        for xid in xids:
            (when,) = conn.execute("SELECT pg_xact_commit_timestamp(%s::text::xid)",
                                   (xid,)).fetchone()
            times = {line["commit_time"] for line in lines if line["xid"] == xid}
            assert {datetime.fromisoformat(t) for t in times} == {when}, xid
    for line in lines:
        if line["xid"] is not None:
            assert (line["origin"] == facts.origin) == (line["xid"] == facts.xids["origin"])
    origin_lines = [line for line in lines if line["xid"] == facts.xids["origin"]]
    assert [(o["table"], o["new"]) for o in origin_lines] == [("moods", {"id": 2, "m": "sad"})]


def test_streamed_transactions_delivered_once_and_whole(work: Source) -> None:
    facts = work.facts
    assert facts is not None
    streamed, unstreamed = work.emit(), work.emit(streaming=False)
    assert streamed == unstreamed
    from support.workload import STREAM_ROWS

    mine = [line for line in streamed if line["xid"] == facts.xids["stream"]]
    ids = [line["new"]["id"] for line in mine]
    assert ids == [*range(1, STREAM_ROWS + 1), -1]  # the rolled-back savepoint's rows: none
    assert len({line["commit_lsn"] for line in mine}) == 1


def _gid_lines(lines: list[Line], gid: str) -> list[tuple[str, str | None]]:
    return [(line["op"], line.get("phase")) for line in lines if line.get("gid") == gid]


def test_two_phase_off_emits_at_commit_prepared(work: Source, parity: Source) -> None:
    facts = work.facts
    assert facts is not None
    lines = work.emit()
    assert _gid_lines(lines, "gid-commit") == [("insert", "commit_prepared")]
    assert _gid_lines(lines, "gid-rollback") == []
    stream = [line for line in lines if line.get("gid") == "gid-stream"]
    assert len(stream) == 3000 and {line["phase"] for line in stream} == {"commit_prepared"}
    assert {line["xid"] for line in stream} == {facts.xids["2pc_stream"]}
    assert all(line["commit_lsn"] is not None for line in stream)
    plines = parity.emit()
    assert _gid_lines(plines, "parity-commit") == [("insert", "commit_prepared")]
    assert _gid_lines(plines, "parity-rollback") == []
    assert not [line for line in plines if line.get("new", {}).get("b") == "rolled back"]


@pytest.mark.parametrize("streaming", [True, False])
def test_two_phase_on_emits_at_prepare(work: Source, streaming: bool) -> None:
    facts = work.facts
    assert facts is not None
    lines = work.emit({"two-phase": "on"}, streaming=streaming)
    assert _gid_lines(lines, "gid-commit") == [("insert", "prepare"), ("commit_prepared", None)]
    assert _gid_lines(lines, "gid-rollback") == [("insert", "prepare"),
                                                 ("rollback_prepared", None)]
    stream = _gid_lines(lines, "gid-stream")
    assert stream == [("insert", "prepare")] * 3000 + [("commit_prepared", None)]
    for gid, label in (("gid-commit", "2pc_commit"), ("gid-rollback", "2pc_rollback")):
        mine = [line for line in lines if line.get("gid") == gid]
        assert {line["xid"] for line in mine} == {facts.xids[label]}
        change = mine[0]
        assert change["commit_lsn"] is None and change["commit_time"] is None
        assert change["prepare_lsn"] and change["prepare_time"]
    done = next(line for line in lines if line["op"] == "commit_prepared"
                and line["gid"] == "gid-commit")
    with work.db.connect(autocommit=True) as conn:
        (when,) = conn.execute("SELECT pg_xact_commit_timestamp(%s::text::xid)",
                               (done["xid"],)).fetchone()
    assert datetime.fromisoformat(done["commit_time"]) == when
    # everything else is exactly as with two-phase off
    assert [x for x in lines if "gid" not in x] == [x for x in work.emit() if "gid" not in x]


@pytest.mark.parametrize("two_phase", ["off", "on"])
def test_transaction_events_bracket_the_changes(work: Source, two_phase: str) -> None:
    lines = work.emit({"include-transaction-events": "on", "two-phase": two_phase})
    plain = work.emit({"two-phase": two_phase})
    assert [x for x in lines if x["op"] not in ("begin", "commit", "prepare")] == plain
    current: Line | None = None
    seen = 0
    for line in lines:
        op = line["op"]
        if op == "begin":
            assert current is None
            current = line
            seen = 0
        elif op in ("commit", "prepare"):
            assert current is not None and line["xid"] == current["xid"] and seen
            assert {k: v for k, v in line.items() if k not in ("op", "end_lsn")} == {
                k: v for k, v in current.items() if k != "op"}
            assert (op == "prepare") == (current.get("phase") == "prepare")
            current = None
        elif current is not None:
            seen += 1
            assert {k: line[k] for k in ("xid", "commit_lsn", "commit_time", "origin")} == {
                k: current[k] for k in ("xid", "commit_lsn", "commit_time", "origin")}
        else:  # outside a transaction: only non-transactional messages and 2PC outcomes
            assert (op == "message" and not line["transactional"]) or op.endswith("_prepared")
    assert current is None
    kinds = {line["op"] for line in lines}
    assert ("prepare" in kinds) == (two_phase == "on")


def test_messages(work: Source) -> None:
    facts = work.facts
    assert facts is not None
    messages = [line for line in work.emit() if line["op"] == "message"]
    tx = next(m for m in messages if m["transactional"])
    assert tx["content"] == "transactional €" and tx["content_encoding"] == "utf-8"
    assert tx["prefix"] == "pgdecode" and tx["xid"] == facts.xids["messages"]
    assert tx["lsn"] == str(facts.message_lsns["tx"])
    nontx = next(m for m in messages if m["content"] == "at once")
    assert (nontx["xid"], nontx["commit_lsn"], nontx["transactional"]) == (None, None, False)
    assert nontx["lsn"] == str(facts.message_lsns["nontx"])
    binary = next(m for m in messages if m["prefix"] == "bin")
    assert (binary["content"], binary["content_encoding"]) == ("/wD+", "base64")


# --- options and the schema itself --------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"numeric-as": "float"}, 'could not parse value "float" for parameter "numeric-as"'),
    ({"bytea": None}, 'could not parse value "None" for parameter "bytea"'),
    ({"two-phase": "maybe"}, 'could not parse value "maybe" for parameter "two-phase"'),
    ({"pretty": "on"}, 'option "pretty" = "on" is unknown'),
])
def test_bad_options_fail_at_startup(options: dict[str, str | None], message: str) -> None:
    pipeline = Pipeline(proto_version=1)
    pipeline.add(JsonEmitter(), options=options, output=MemoryOutput())
    with pytest.raises(CallbackError, match="in the startup callback") as info:
        pipeline.startup()
    assert message in str(info.value)


def test_valueless_options_are_true() -> None:
    pipeline = Pipeline(proto_version=1)
    ctx = pipeline.add(JsonEmitter(), options={"two-phase": None,
                                               "include-transaction-events": None},
                       output=MemoryOutput())
    pipeline.startup()
    assert ctx.twophase
    pipeline = Pipeline(proto_version=1)
    ctx = pipeline.add(JsonEmitter(), output=MemoryOutput())
    pipeline.startup()
    assert not ctx.twophase


GOOD_INSERT: Line = {
    "op": "insert", "schema": "public", "table": "t", "lsn": "0/16B3748", "xid": 7,
    "commit_lsn": "0/16B3800", "commit_time": "2024-01-02T03:04:05.123456+00:00",
    "origin": None, "key": ["id"], "identity": "default", "new": {"id": 1},
}


@pytest.mark.parametrize("change", [
    {"surprise": 1},
    {"lsn": "16B3748"},
    {"op": "upsert"},
    {"commit_time": "2024-01-02 03:04:05"},
    {"gid": "g"},  # a gid without its phase
    {"gid": "g", "phase": "prepare"},  # at prepare, commit_lsn cannot be known yet
    {"gid": "g", "phase": "commit_prepared", "prepare_lsn": "0/1"},
    {"identity": "primary"},
    {"binary": []},
])
def test_schema_rejects_malformed_lines(change: Line) -> None:
    assert VALIDATOR.is_valid(GOOD_INSERT)
    assert not VALIDATOR.is_valid({**GOOD_INSERT, **change})
    assert not VALIDATOR.is_valid({**GOOD_INSERT, "op": "update"})  # unchanged_toast missing
    Draft202012Validator.check_schema(SCHEMA)


# --- the converters against the server ----------------------------------------------------------

class RawText(Loader):
    """A column's text as the server's output function wrote it (as pgoutput sends it)."""

    def load(self, data: Any) -> bytes:
        return bytes(data)


# type -> values (SQL literals' text) whose binary send format must render as the server's text
BINARY_CASES: dict[str, list[str]] = {
    "smallint": ["0", "-32768", "32767"],
    "bigint": ["-9223372036854775808", "9223372036854775807"],
    "real": ["0", "-0", "1.25", "0.1", "1e6", "100000", "123456", "1e-5", "1.17549435e-38",
             "3.4028235e38", "1e-45", "NaN", "Infinity", "-Infinity", "2.5e-5", "7654321"],
    "double precision": ["0", "-0", "0.1", "1e15", "1e14", "123456789012345680", "1e-5",
                         "0.0001", "5e-324", "1.7976931348623157e308", "-3.14", "1e16",
                         "123456789012345.6", "NaN", "-Infinity", "2.5e-300"],
    "numeric": ["0", "0.0000", "-0.001", "12345.6789", "1e-20", "10000", "99999999",
                "1e100", "-123456789012345678901234567890.123456789", "0.00001000", "NaN",
                "Infinity", "-Infinity", "1.5", "100000000.00000001"],
    "numeric(30,25)": ["0.0000000000000000000000001", "1"],
    "date": ["2024-02-29", "0044-03-15 BC", "0001-01-01", "0001-12-31 BC", "5874897-12-31",
             "4713-01-01 BC", "infinity", "-infinity", "1999-12-31", "2000-01-01"],
    "time": ["00:00", "24:00:00", "13:14:15.123456", "23:59:59.999999", "01:02:03.1"],
    "time with time zone": ["13:14:15+05:30", "23:59:59-12", "00:00:00+00",
                            "12:00:00.5+14", "10:00:00-03:30"],
    "timestamp": ["2024-01-02 03:04:05.678", "0044-03-15 12:00:00 BC", "infinity",
                  "-infinity", "294276-12-31 23:59:59.999999", "1970-01-01 00:00:00",
                  "1999-12-31 23:59:59.000001"],
    "timestamp with time zone": ["2024-01-02 03:04:05.678+02", "0044-03-15 12:00:00+00 BC",
                                 "infinity", "2000-01-01 00:00:00+00"],
    "uuid": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    "inet": ["192.168.0.1/24", "10.1.2.3", "10.1.2.3/32", "::1", "fe80::1/64",
             "2001:db8::ff00:42:8329", "::ffff:1.2.3.4", "0.0.0.0/0", "::2", "::1.2.3.4",
             "::ffff:0:1.2.3.4", "1:0:0:1:0:0:0:1", "1:0:0:0:1:0:0:1", "::", "1::",
             "0:0:1::", "::1:0:0:0", "::0.0.1.2", "0:0:0:0:0:0:1:2", "1:2:3:4:5:6:7:8"],
    "cidr": ["10.0.0.0/8", "192.168.1.0/24", "2001:db8::/32", "10.1.2.3/32", "::/0",
             "fe80::/10", "::ffff:0.0.0.0/96"],
    "macaddr": ["08:00:2b:01:02:03"],
    "macaddr8": ["08:00:2b:01:02:03:04:05"],
    "bit(4)": ["1010", "0000"],
    "bit varying(20)": ["", "101", "1111000011110000111"],
    "pg_lsn": ["0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF"],
    '"char"': ["x", "", "Z"],
    "point": ["(1,2)", "(-1.5,0)", "(1e20,1e-20)"],
    "line": ["{1,2,3}", "{1,-1,0}"],
    "lseg": ["[(0,0),(1,1)]"],
    "box": ["(1,1),(0,0)", "(2.5,2),(-1,-1)"],
    "path": ["[(0,0),(1,1),(2,0)]", "((0,0),(1,1))"],
    "polygon": ["((0,0),(1,1),(1,0))"],
    "circle": ["<(0,0),5>", "<(1,1),0.5>"],
    "int4range": ["[1,10)", "empty", "(,5]", "[3,)"],
    "numrange": ["(1.5,2.5]", "(,)", "[0.000,1e-3)"],
    "tstzrange": ["[2024-01-01 00:00+00,2024-02-01 00:00+00)", "empty", "(,infinity]"],
    "tsrange": ['["2024-01-01 10:00","2024-01-02 00:00:00.5")'],
    "daterange": ["[2024-01-01,2024-01-05)", "[0044-03-15 BC,)"],
    "int8range": ["[-9223372036854775808,0)"],
    "datemultirange": ["{[2024-01-01,2024-01-05),[2024-02-01,2024-02-03)}", "{}"],
    "nummultirange": ["{(,1.5],[2,3)}"],
    "tstzmultirange": ["{[2024-01-01 00:00+00,2024-01-02 00:00+00)}"],
    "interval": ["1 year 2 mons 3 days 04:05:06.789", "-1 day", "0", "100000 hours",
                 "-0.5 sec", "1 day -1 sec", "-1 years -2 mons", "178000000 years",
                 "1 year -2 mons +3 days -04:05:06.789", "-2147483648 days"],
    "text": ["", "héllo", "tab\tand\nnewline"],
    "character(5)": ["ab"],
    "name": ["a name"],
    "json": ['{"a": [1, 2.50]}', '{\n  "spread": [1,\n 2]\r\n}', "null", '"s"'],
    "jsonb": ['{"b": {"c": true}, "a": 1.10}', "[]", "null"],
    "bytea": ["\\x00ff10", "\\x"],
    "boolean": ["true", "false"],
    "oid": ["0", "4294967295"],
    "integer[]": ["{1,2,NULL,4}", "{}", "{{1,2},{3,4}}", "[0:1]={7,8}",
                  "[2:3][5:6]={{1,2},{3,4}}", "{{{1}},{{NULL}}}"],
    "text[]": ['{"a b","c,d",NULL,"e\\"f"}', '{""}', '{"NULL",null,"\\\\"}',
               '{{"{x}","}"},{"a;b",x}}'],
    "numeric[]": ["{1.50,NaN,-0.001}"],
    "box[]": ["{(1,1),(0,0);(2,2),(1,1)}"],
    "jsonb[]": ['{"{\\"k\\": 1}","null"}'],
    "timestamp with time zone[]": ['{"2024-01-02 03:04:05+00",infinity}'],
    "date[]": ["{2024-02-29,infinity,\"0044-03-15 BC\"}"],
    "bytea[]": ['{"\\\\x00ff",NULL}'],
    "interval[]": ['{"1 day","-00:00:01"}'],
}


@pytest.mark.parametrize("type_name", list(BINARY_CASES))
def test_binary_values_convert_like_the_servers_text(pg_module_db: Any, type_name: str) -> None:
    """For each type pgdecode renders from the send format: the JSON of the binary value
    equals the JSON of the server's text of the same value."""
    values = BINARY_CASES[type_name]
    if type_name == "interval" and pg_module_db.major_version >= 17:
        values = [*values, "infinity", "-infinity"]
    with pg_module_db.connect(autocommit=True) as conn:
        oid, send = conn.execute(
            "SELECT t.oid::int8, t.typsend::regproc::text FROM pg_type t "
            "WHERE t.oid = %s::regtype", (type_name,)).fetchone()
        cur = conn.cursor()
        cur.adapters.register_loader(int(oid), RawText)  # output function text, not ::text
        rows = cur.execute(
            f"SELECT s.v, encode({send}(s.v), 'hex')::varchar FROM unnest(%s::text[]) "
            "WITH ORDINALITY u(t, n), "
            f"LATERAL (SELECT t::{type_name} AS v) s ORDER BY n", (values,)).fetchall()
    for options in ({}, {"numeric_as": "number", "bytea": "base64"}):
        types = TypeConverters(**options)
        binary, opaque = types.binary(int(oid))
        assert not opaque
        text = types.text(int(oid))
        for (server_text, sent), literal in zip(rows, values, strict=True):
            want = orjson.dumps(text(server_text))
            got = orjson.dumps(binary(bytes.fromhex(sent)))
            assert got == want, (type_name, literal, server_text)
            assert b"\n" not in got and b"\r" not in got


@pytest.mark.parametrize("type_name", ["integer[]", "text[]", "jsonb[]", "box[]",
                                       "timestamp[]", "date[]", "boolean[]", "bigint[]",
                                       "double precision[]", "json[]"])
def test_text_arrays_equal_to_jsonb(pg_module_db: Any, type_name: str) -> None:
    cases = {
        "integer[]": BINARY_CASES["integer[]"],
        "text[]": BINARY_CASES["text[]"],
        "jsonb[]": ['{"{\\"k\\": [1, 2]}","null","\\"s\\""}', "{}"],
        "box[]": BINARY_CASES["box[]"],
        "timestamp[]": ['{"2024-01-02 03:04:05",NULL,infinity}'],
        "date[]": ["{2024-02-29,NULL}"],
        "boolean[]": ["{t,f,NULL}", "{{t},{f}}"],
        "bigint[]": ["{-9223372036854775808,9223372036854775807}"],
        "double precision[]": ["{1.5,NaN,-Infinity,1e-300}"],
        "json[]": ['{"{\\"a\\": 1}","[1, 2]"}'],
    }[type_name]
    with pg_module_db.connect(autocommit=True) as conn:
        oid = int(conn.execute("SELECT %s::regtype::oid::int8", (type_name,)).fetchone()[0])
        rows = conn.execute(
            f"SELECT v::text, to_jsonb(v)::text FROM unnest(%s::text[]) WITH ORDINALITY "
            f"u(t, n), LATERAL (SELECT t::{type_name} AS v) s ORDER BY n",
            (cases,)).fetchall()
    convert = TypeConverters().text(oid)
    for text, expected in rows:
        assert loads(orjson.dumps(convert(text.encode()))) == loads(expected), text


def test_intervals_equal_the_servers_iso_8601(pg_module_db: Any) -> None:
    values = BINARY_CASES["interval"] + ["1 mon", "00:00:01.000001", "-1 days +00:00:01",
                                         "3 years 4 mons -5 days +06:07:08.09",
                                         "-12:00:00", "1 day 00:00:00.000001"]
    with pg_module_db.connect(autocommit=True) as conn:
        conn.execute("SET intervalstyle = postgres")
        rows = conn.execute("SELECT v::text FROM unnest(%s::interval[]) WITH ORDINALITY "
                            "u(v, n) ORDER BY n", (values,)).fetchall()
        conn.execute("SET intervalstyle = iso_8601")
        iso = conn.execute("SELECT v::text FROM unnest(%s::interval[]) WITH ORDINALITY "
                           "u(v, n) ORDER BY n", (values,)).fetchall()
    convert = TypeConverters().text(1186)
    for (postgres,), (expected,) in zip(rows, iso, strict=True):
        assert convert(postgres.encode()) == expected, postgres


# --- the converters alone -----------------------------------------------------------------------


def test_array_parser() -> None:
    text = TypeConverters().text
    as_int = text(INT4)
    assert parse_array_text(b"{}", as_int) == []
    assert parse_array_text(b"{{}}", as_int) == [[]]
    assert orjson.dumps(parse_array_text(b"[-1:0]={NULL,3}", as_int)) == b"[null,3]"
    assert orjson.dumps(parse_array_text(b"{{1},{2}}", as_int)) == b"[[1],[2]]"
    assert parse_array_text(b'{"a\\\\b","q\\"","",NULL,"NULL"}', bytes.decode) == [
        "a\\b", 'q"', "", None, "NULL"]
    assert orjson.dumps(parse_array_text(b'{"{\\"k\\": 1}",null}', text(JSONB))) == (
        b'[{"k": 1},null]')  # an unquoted "null" is not NULL... but array_out quotes it
    with pytest.raises(ValueError, match="malformed"):
        parse_array_text(b"{1,2", as_int)


_SHAPES = (b"{}", b"{{}}", b"{%s,%s,NULL}", b"[-1:0]={NULL,%s}", b"{{%s,%s},{%s,%s}}",
           b"[1:1][2:3]={{%s,%s}}")
_ARRAY_TEXTS = {
    (1009, 25): [
        *(shape.replace(b"%s", b"x") for shape in _SHAPES),
        b'{"a\\\\b","q\\"","",NULL,"NULL"}', b'{"a b",c,"{x}","x,y"}',
        "{\"ünï\",'s',-7}".encode()],
    (1015, 1043): [b'{"a b",NULL,"NULL",""}'],
    (1007, INT4): [shape.replace(b"%s", b"-12") for shape in _SHAPES],
    (1016, 20): [b"{9223372036854775807,-9223372036854775808,NULL}"],
    (1000, 16): [shape.replace(b"%s", b"t") for shape in _SHAPES] + [b"{f,t,NULL}"],
    (3807, JSONB): [b'{"{\\"a\\": [1, 2.50]}",NULL,"1","\\"s\\""}'],  # parse_array_text's
    (1231, NUMERIC): [b"{1.50,NaN,NULL}"],
}


@pytest.mark.parametrize(("oids", "raw"), [
    (oids, raw) for oids, texts in _ARRAY_TEXTS.items() for raw in texts])
def test_psycopg_array_parsing_matches_ours(oids: tuple[int, int], raw: bytes) -> None:
    """Text, integer and boolean arrays are parsed by psycopg (in C); everything else by
    parse_array_text (jsonb and numeric here). Both must read the server's array text the
    same way, and each array type must reach its own elements' converter."""
    text = TypeConverters().text
    array_oid, element_oid = oids
    expected = orjson.dumps(parse_array_text(raw, text(element_oid)))
    assert orjson.dumps(text(array_oid)(raw)) == expected


def test_iso_intervals_and_floats() -> None:
    assert iso_interval(0, 0, 0) == "PT0S"
    assert iso_interval(-14, 0, 0) == "P-1Y-2M"
    assert iso_interval(10, 3, -(4 * 3600 + 5 * 60 + 6) * 10**6 - 789000) == (
        "P10M3DT-4H-5M-6.789S")
    assert iso_interval(0, 0, -500000) == "PT-0.5S"
    assert [pg_float8_text(x) for x in (1e15, 1e14, 1e-5, 1e-4, 0.0, -0.0, 1.5e300, 2.0)] == [
        "1e+15", "100000000000000", "1e-05", "0.0001", "0", "-0", "1.5e+300", "2"]


def test_other_output_styles_pass_through() -> None:
    """Text the converters do not recognize is passed through, never misread."""
    text = TypeConverters().text
    assert text(1114)(b"01/02/2024 03:04:05.678") == "01/02/2024 03:04:05.678"  # DateStyle SQL
    assert text(1184)(b"Tue Jan 02 03:04:05 2024 UTC") == "Tue Jan 02 03:04:05 2024 UTC"
    assert text(1184)(b"0044-03-15 12:00:00+00 BC") == "0044-03-15 12:00:00+00 BC"
    assert text(1186)(b"@ 1 day ago") == "@ 1 day ago"  # IntervalStyle postgres_verbose
    assert text(1186)(b"1-2 3 4:05:06") == "1-2 3 4:05:06"  # sql_standard
    assert text(1186)(b"P1Y2M") == "P1Y2M"  # iso_8601 already
    # bytea_output = escape
    assert text(17)(b"a\\\\b\\001\\377") == "615c6201ff"
    assert TypeConverters(bytea="base64").text(17)(b"a\\\\b\\001\\377") == "YVxiAf8="
