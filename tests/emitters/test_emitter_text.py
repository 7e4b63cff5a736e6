"""The text emitter against PostgreSQL's own contrib/test_decoding, on each server.

The same transactions are decoded twice: by test_decoding through
``pg_logical_slot_peek_changes`` (with the options under test) and by pgoutput, whose stream
is fed to the text emitter with the same options. The lists of lines must be equal, and so
must each row's LSN and xid where the two plugins write at the same place.

What is allowed to differ, and why (see emitters/text/ and docs/emitters-text.md):

- test_decoding prints empty transactions (BEGIN and COMMIT only: here, the workload's DDL;
  the test clusters run without autovacuum, whose ANALYZE would add some at random) unless
  skip-empty-xacts; pgoutput never sends them. They are removed from the server's output
  before comparing, and only they.
- BEGIN rows: test_decoding writes them at the transaction's first LSN, pgoutput (which
  delays BEGIN until the first change) at its first change's; with skip-empty-xacts both
  write BEGIN at the first change.
- The xid of rows written by stream_change (and, under skip-empty-xacts, the block's
  opening written there) for a change made in a subtransaction: test_decoding's row carries
  the top-level xid; the framework writes the xid of pgoutput's stream message, which is
  the subtransaction's (the printed text is the same).
- The xid of a non-transactional message emitted in a transaction that has an xid:
  test_decoding's row carries it, pgoutput does not send it (ours is 0).
- "opening a streamed block" rows: test_decoding writes each at its block's start (where
  pgoutput's Stream Start is); the framework calls stream_start at the LSN of the
  transaction's first Stream Start, for every block.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from support.parity_workload import ParitySlots, run_parity_workload, setup_parity
from support.textparity import (
    _BEGIN,
    Decoded,
    Line,
    Source,
    assert_same,
    drop_empty_xacts,
    our_lines,
    paired_slots,
    server_lines,
)

from emitters.text import OPTIONS, TestDecodingEmitter, quote_literal, timestamptz_to_str
from plugin_framework import LSN, MemoryOutput, Pipeline
from plugin_framework.framework import CallbackError, Catalog
from plugin_framework.sources.session import SourceConfig
from plugin_framework.sources.walsender import WalsenderSource


def compare(source: Source, options: dict[str, str], *, streaming: bool = False
            ) -> tuple[list[Line], Decoded]:
    theirs = server_lines(source, options)
    ours = our_lines(source, options, streaming=streaming)
    if options.get("skip-empty-xacts") != "1":
        theirs, _ = drop_empty_xacts(theirs)
    assert_same(ours.lines, theirs, begin_lsn=options.get("skip-empty-xacts") == "1")
    return theirs, ours


# --- the parity workload ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parity(pg_module_db: Any) -> Iterator[Source]:
    db = pg_module_db
    slots: ParitySlots = setup_parity(db)
    run_parity_workload(db)
    yield Source(db, slots.test_decoding, slots.pgoutput, "parity_pub")


def test_defaults(parity: Source) -> None:
    theirs, ours = compare(parity, {})
    texts = [x.data for x in theirs]
    # What the workload must have exercised, so that equality means something.
    assert any(t.startswith("table public.alltypes: INSERT: id[integer]:1 c_bool[boolean]:true")
               for t in texts)
    assert any("c_posint[posint]:'7'" in t and "c_mood_arr[mood[]]:'{sad,happy}'" in t
               for t in texts)
    assert any(t.startswith('table "My Schema"."Weird ""Table""": UPDATE:') for t in texts)
    assert any("old-key:" in t and "new-tuple:" in t for t in texts)
    assert any("big[text]:unchanged-toast-datum" in t for t in texts)
    assert any(t.endswith("TRUNCATE: restart_seqs cascade") for t in texts)
    assert any(t.endswith("TRUNCATE: (no-flags)") for t in texts)
    assert any(t.startswith("message: transactional: 1 prefix: tx-prefix, sz: 21 content:")
               for t in texts)
    assert "message: transactional: 0 prefix: nontx-prefix, sz: 17 content:non-transactional" \
        in texts
    assert any(t.startswith("PREPARE TRANSACTION 'parity-commit', txid ") for t in texts)
    assert any(t.startswith("COMMIT PREPARED 'parity-commit', txid ") for t in texts)
    assert any(t.startswith("ROLLBACK PREPARED 'parity-rollback', txid ") for t in texts)
    # The catalog was asked about the types that are not built in, and nothing else.
    assert ours.catalog is not None
    asked = [q for q, _ in ours.catalog.asked if "format_type" in q]
    oids = [int(m) for m in re.findall(r"format_type\((\d+)::oid", " ".join(asked))]
    assert len(oids) == len(asked) == len(set(oids)) > 0
    assert all(oid >= 16384 for oid in oids)
    assert len(ours.catalog.asked) == len(asked)  # no time zone, no version: not needed


@pytest.mark.native  # it counts the changes the C formatters took
@pytest.mark.parametrize("options", [{}, {"skip-empty-xacts": "1", "include-xids": "0"}],
                         ids=["defaults", "skip-empty"])
def test_fast_path_on_and_off_match_test_decoding(parity: Source,
                                                  options: dict[str, str]) -> None:
    """The C fast path and the Python change callback each print test_decoding's lines;
    the fast path writes every change of the ordinary transactions (under skip-empty-xacts,
    all but each transaction's first, whose BEGIN the callback prints)."""
    theirs = server_lines(parity, options)
    if not options:
        theirs, _ = drop_empty_xacts(theirs)
    used: Counter[str] = Counter()
    fast = our_lines(parity, options, fast=used)
    slow = our_lines(parity, options, no_fast=True)
    skip = bool(options)
    assert_same(fast.lines, theirs, begin_lsn=skip)
    assert_same(slow.lines, theirs, begin_lsn=skip)
    rows = sum(1 for x in theirs if re.match(r"table .+?: (INSERT|UPDATE|DELETE):", x.data))
    begins = sum(1 for x in theirs if _BEGIN.fullmatch(x.data))
    assert used["fast"] + used["declined"] == rows
    assert 0 < used["declined"] <= begins if skip else used["declined"] == 0


def test_without_xids(parity: Source) -> None:
    theirs, _ = compare(parity, {"include-xids": "0"})
    assert "BEGIN" in [x.data for x in theirs]


def test_with_timestamps(parity: Source) -> None:
    theirs, _ = compare(parity, {"include-timestamp": "1"})
    assert any(re.fullmatch(r"COMMIT \d+ \(at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\+00\)",
                            x.data) for x in theirs)


def test_rollback_prepared_time(parity: Source) -> None:
    options = {"include-timestamp": "1"}

    def rollbacks(lines: list[Line]) -> list[str]:
        return [x.data for x in lines if x.data.startswith("ROLLBACK PREPARED")]

    theirs = rollbacks(server_lines(parity, options))
    assert len(theirs) == 1
    assert rollbacks(our_lines(parity, options).lines) == theirs


@pytest.mark.parametrize(("zone", "offset"), [
    ("America/St_Johns", r"-0[23]:30"),
    ("<+0545>-05:45", r"\+05:45"),  # POSIX style: no such zone for Python, the server's offset
    ("UTC+3", r"-03"),  # POSIX style too: UTC+3 is 3 hours west
])
def test_timestamps_in_the_session_time_zone(parity: Source, monkeypatch: pytest.MonkeyPatch,
                                             zone: str, offset: str) -> None:
    # libpq sends PGTZ as the session's TimeZone: to the SQL session of test_decoding, and to
    # the catalog's session, where the emitter reads it.
    monkeypatch.setenv("PGTZ", zone)
    theirs, _ = compare(parity, {"include-timestamp": "1", "include-xids": "0"})
    assert any(re.fullmatch(rf"COMMIT \(at .*{offset}\)", x.data) for x in theirs)


def test_skip_empty_xacts(parity: Source) -> None:
    theirs, _ = compare(parity, {"skip-empty-xacts": "1", "include-timestamp": "1"})
    assert any(x.data.startswith("BEGIN") for x in theirs)


def test_stream_changes(parity: Source) -> None:
    theirs, _ = compare(parity, {"stream-changes": "1"}, streaming=True)
    texts = [x.data for x in theirs]
    assert any(t.startswith("opening a streamed block for transaction TXN ") for t in texts)
    assert any(t.startswith("streaming change for TXN ") for t in texts)
    assert any(t.startswith("closing a streamed block for transaction TXN ") for t in texts)
    assert any(t.startswith("aborting streamed (sub)transaction TXN ") for t in texts)
    assert any(t.startswith("committing streamed transaction TXN ") for t in texts)


def test_stream_changes_skip_empty_without_xids(parity: Source) -> None:
    compare(parity, {"stream-changes": "1", "skip-empty-xacts": "1", "include-xids": "0",
                     "include-timestamp": "1"}, streaming=True)


def test_stream_changes_off_reassembles_a_streamed_pgoutput(parity: Source) -> None:
    # pgoutput streams (its streaming option is on) but the emitter was not asked to:
    # the framework hands it the transactions whole, as test_decoding prints them.
    theirs = server_lines(parity, {})
    theirs, _ = drop_empty_xacts(theirs)
    ours = our_lines(parity, {}, streaming=True)
    assert [x.data for x in ours.lines] == [x.data for x in theirs]


def test_two_phase(parity: Source) -> None:
    theirs, _ = compare(parity, {"include-xids": "0", "skip-empty-xacts": "1"})
    texts = [x.data for x in theirs]
    i = texts.index("PREPARE TRANSACTION 'parity-commit'")
    assert texts[i - 2:i + 2] == [
        "BEGIN", texts[i - 1], "PREPARE TRANSACTION 'parity-commit'",
        "COMMIT PREPARED 'parity-commit'"]
    assert texts[i - 1].startswith("table public.keyed: INSERT: id[integer]:")
    assert "ROLLBACK PREPARED 'parity-rollback'" in texts


def test_without_catalog_names_user_types_from_the_stream(parity: Source) -> None:
    """Without a catalog, an array of a user type is still right (``_mood`` is read as
    ``mood[]``); a domain shows as its base type, all pgoutput tells."""
    theirs, _ = drop_empty_xacts(server_lines(parity, {}))
    ours = our_lines(parity, {}, catalog=False).lines
    expected = [x.data.replace("c_posint[posint]", "c_posint[integer]") for x in theirs]
    assert [x.data for x in ours] == expected
    assert any("c_mood_arr[mood[]]" in x.data for x in ours)


# --- options --------------------------------------------------------------------------------


def server_error(source: Source, options: list[str]) -> str:
    with pytest.raises(psycopg.Error) as info:
        server_lines(source, dict(zip(options[::2], options[1::2], strict=True)))
    message = info.value.diag.message_primary
    assert message is not None
    return message


def our_error(options: Mapping[str, str | None]) -> str:
    pipeline = Pipeline()
    pipeline.add(TestDecodingEmitter(), options=options, output=MemoryOutput())
    with pytest.raises(CallbackError) as info:
        pipeline.startup()
    return str(info.value.cause)


@pytest.mark.parametrize("options", [
    ["nope", "1"],
    ["include-xids", "maybe"],
    ["include-xids", " true"],
    ["skip-empty-xacts", ""],
    ["stream-changes", "o"],
    ["only-local", "truex"],
    ["include-timestamp", "on", "Include-Xids", "1"],
    ["force-binary", "2"],
])
def test_option_errors_are_test_decodings(parity: Source, options: list[str]) -> None:
    expected = server_error(parity, options)
    assert our_error(dict(zip(options[::2], options[1::2], strict=True))) == expected


@pytest.mark.parametrize("value", ["of", "OFF", "TRUE", "tr", "Y", "n", "1", "0", "On"])
def test_boolean_values_read_as_the_server_reads_them(parity: Source, value: str) -> None:
    first = server_lines(parity, {"include-xids": value})[0].data
    pipeline = Pipeline()
    ctx = pipeline.add(TestDecodingEmitter(), options={"include-xids": value},
                       output=MemoryOutput())
    pipeline.startup()
    assert ctx.output_plugin_private.include_xids == (first != "BEGIN")


def test_every_option_name_is_test_decodings(parity: Source) -> None:
    for option in OPTIONS:
        server_lines(parity, {option.name: "off"})  # accepted by the server
        pipeline = Pipeline()
        pipeline.add(TestDecodingEmitter(), options={option.name: "off"}, output=MemoryOutput())
        pipeline.startup()


def test_valueless_options_mean_what_they_mean_in_c() -> None:
    def private(options: Mapping[str, str | None]) -> Any:
        pipeline = Pipeline()
        ctx = pipeline.add(TestDecodingEmitter(), options=options, output=MemoryOutput())
        pipeline.startup()
        return ctx

    ctx = private({"include-xids": None, "include-timestamp": None, "skip-empty-xacts": None,
                   "only-local": None})
    state = ctx.output_plugin_private
    assert (state.include_xids, state.include_timestamp, state.skip_empty_xacts,
            state.only_local) == (True, True, True, True)
    # test_decoding ``continue``s on these three when they have no value
    ctx = private({"stream-changes": None, "force-binary": None, "include-rewrites": None})
    assert not ctx.streaming
    assert ctx.options.output_type == "textual" and not ctx.options.receive_rewrites
    ctx = private({"stream-changes": "yes", "force-binary": "t", "include-rewrites": "1"})
    assert ctx.streaming
    assert ctx.options.output_type == "binary" and ctx.options.receive_rewrites


# --- more than the parity workload has ------------------------------------------------------

EXTRA_SCHEMA = """
CREATE SCHEMA other;
CREATE TYPE other.color AS ENUM ('red', 'green');
CREATE TYPE "Mixed Type" AS ENUM ('a');
CREATE TYPE _under AS ENUM ('u');
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN dom_mood AS mood;
CREATE DOMAIN dom_text_arr AS text[];
CREATE DOMAIN dom_varchar AS varchar(5);
CREATE TABLE extra (id integer PRIMARY KEY, c other.color, ca other.color[], m "Mixed Type",
    ma "Mixed Type"[], u _under, ua _under[], dm dom_mood, dma dom_mood[], dt dom_text_arr,
    dv dom_varchar, v varchar(3)[], b bit(3)[], n numeric(5,2)[], q "char", "Select" int,
    "tab	col" text);
CREATE TABLE big (id integer PRIMARY KEY, v text);
CREATE PUBLICATION extra_pub FOR ALL TABLES;
"""


def run_extra_workload(db: Any) -> None:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        ex = conn.execute
        ex("SET synchronous_commit = on")
        ex("INSERT INTO extra VALUES (1, 'red', '{red,green}', 'a', '{a}', 'u', '{u,u}', 'happy',"
           " '{sad}', '{x,\"y z\"}', 'abc', '{ab,c}', '{101,010}', '{1.5,NULL}', 'q', 7, 't')")
        # only a transactional message: whether it opens the transaction depends on the version
        ex("BEGIN")
        ex("SELECT pg_logical_emit_message(true, 'only', 'a message')")
        ex("COMMIT")
        ex("BEGIN")
        ex("SELECT pg_logical_emit_message(false, 'nontx', 'in a transaction')")
        ex("UPDATE extra SET c = 'green' WHERE id = 1")
        ex("COMMIT")
        # gids test_decoding filters, and gids that need quoting
        for key, (gid, outcome) in enumerate([("x_nodecode", "COMMIT"), ("y_nodecode", "ROLLBACK"),
                                              ("it's \\ quoted", "COMMIT"), ("plain", "ROLLBACK")]):
            ex("BEGIN")
            ex("INSERT INTO big VALUES (%s, %s)", (10_000 + key, gid))
            ex(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(psycopg.sql.Literal(gid)))
            ex(psycopg.sql.SQL(outcome + " PREPARED {}").format(psycopg.sql.Literal(gid)))
        # streamed (64kB logical_decoding_work_mem) and prepared; streamed and aborted;
        # streamed with a truncate and a transactional message
        ex("BEGIN")
        ex("INSERT INTO big SELECT g, repeat('p', 50) FROM generate_series(1, 2000) g")
        ex("PREPARE TRANSACTION 'big-prepared'")
        ex("COMMIT PREPARED 'big-prepared'")
        ex("BEGIN")
        ex("INSERT INTO big SELECT g, repeat('a', 50) FROM generate_series(2001, 4000) g")
        ex("ROLLBACK")
        ex("BEGIN")
        ex("SELECT pg_logical_emit_message(true, 'streamed', 'inside a stream')")
        ex("INSERT INTO big SELECT g, repeat('t', 50) FROM generate_series(4001, 6000) g")
        ex("TRUNCATE big")
        ex("SELECT pg_logical_emit_message(false, 'nontx2', 'beside a stream')")
        ex("INSERT INTO big VALUES (1, 'after')")
        ex("COMMIT")
        # replayed from a replication origin: only-local skips it
        origin = f"{db.dbname}_origin"
        ex("SELECT pg_replication_origin_create(%s)", (origin,))
        ex("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        ex("INSERT INTO big VALUES (2, 'from elsewhere')")
        ex("SELECT pg_replication_origin_session_reset()")
        ex("INSERT INTO big VALUES (3, 'local again')")


@pytest.fixture(scope="module")
def extra(pg: Any) -> Iterator[Source]:
    with paired_slots(pg, EXTRA_SCHEMA, "extra", "extra_pub", two_phase=True) as source:
        run_extra_workload(source.db)
        yield source


@pytest.mark.parametrize("options", [
    {},
    {"skip-empty-xacts": "1"},
    {"include-xids": "0", "include-timestamp": "1"},
    {"stream-changes": "1"},
    {"stream-changes": "1", "skip-empty-xacts": "1"},
    {"stream-changes": "1", "skip-empty-xacts": "1", "include-xids": "0"},
    {"only-local": "1", "include-xids": "0"},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_extra(extra: Source, options: dict[str, str]) -> None:
    theirs, _ = compare(extra, options, streaming=options.get("stream-changes") == "1")
    texts = [x.data for x in theirs]
    if not options:
        row = next(t for t in texts if t.startswith("table public.extra: INSERT:"))
        assert (" c[other.color]:'red' ca[other.color[]]:'{red,green}'"
                ' m["Mixed Type"]:\'a\' ma["Mixed Type"[]]:\'{a}\' u[_under]:\'u\''
                " ua[_under[]]:'{u,u}' dm[dom_mood]:'happy' dma[dom_mood[]]:'{sad}'"
                " dt[dom_text_arr]:'{x,\"y z\"}' dv[dom_varchar]:'abc'"
                " v[character varying[]]:'{ab,c}' b[bit[]]:'{101,010}'"
                " n[numeric[]]:'{1.50,NULL}' q[\"char\"]:'q' \"Select\"[integer]:7"
                ' "tab\tcol"[text]:\'t\'') in row
        assert "COMMIT PREPARED E'it''s \\\\ quoted', txid" in " ".join(texts)
        assert not any("y_nodecode" in t for t in texts)
        i = texts.index("table public.big: INSERT: id[integer]:10000 v[text]:'x_nodecode'")
        assert texts[i - 1].startswith("BEGIN ") and texts[i + 1].startswith("COMMIT ")
    only_message = texts.index("message: transactional: 1 prefix: only, sz: 9 content:a message")
    if options.get("skip-empty-xacts") == "1":
        # PostgreSQL 17 made a transactional message open the transaction
        opened = extra.db.major_version >= 17
        assert texts[only_message - 1].startswith("BEGIN") == opened
    from_origin = "table public.big: INSERT: id[integer]:2 v[text]:'from elsewhere'"
    assert (from_origin in texts) == (options.get("only-local") != "1")
    assert "table public.big: INSERT: id[integer]:3 v[text]:'local again'" in texts
    if options.get("stream-changes") == "1":
        assert any(t.startswith("preparing streamed transaction") for t in texts)
        assert any(t.startswith("streaming truncate for") for t in texts)
        assert any(t.startswith("streaming message: transactional: 1 prefix: streamed, sz: 15")
                   for t in texts)


# --- names whose quoting depends on the server version ---------------------------------------

# Keywords in some releases only (system_user reserved from 16, json_array a column-name
# keyword from 16; json, json_table, merge_action... from 17; recheck unreserved up to 17,
# gone in 18), as schema, table, column and type names. Quoted in the DDL: some cannot be
# written bare on some releases.
KEYWORD_SCHEMA = """
CREATE SCHEMA "json_query";
CREATE TYPE "json_value" AS ENUM ('v');
CREATE TYPE "json_query"."merge_action" AS ENUM ('m');
CREATE TABLE "json_query"."json_table" ("json_exists" integer PRIMARY KEY, "json" text,
    "merge_action" "json_query"."merge_action", "system_user" "json_value"[],
    "json_array" integer, "json_arrayagg" text, "json_object" text, "json_objectagg" text,
    "json_scalar" text, "json_serialize" text, "json_value" "json_value", "recheck" text,
    "select" integer);
ALTER TABLE "json_query"."json_table" REPLICA IDENTITY FULL;
CREATE TABLE "system_user" ("merge_action" integer PRIMARY KEY);
CREATE PUBLICATION keyword_pub FOR ALL TABLES;
"""


@pytest.fixture(scope="module")
def keywords(pg: Any) -> Iterator[Source]:
    with paired_slots(pg, KEYWORD_SCHEMA, "kw", "keyword_pub") as source, \
            psycopg.connect(source.db.conninfo, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute(
            'INSERT INTO "json_query"."json_table" VALUES (1, \'{}\', \'m\', \'{v,v}\', 2,'
            " 'a', 'o', 'oa', 's', 'z', 'v', 'r', 3)")
        conn.execute('UPDATE "json_query"."json_table" SET "json" = \'[]\', "select" = 4')
        conn.execute('INSERT INTO "system_user" VALUES (1)')
        conn.execute('DELETE FROM "json_query"."json_table"')
        conn.execute('TRUNCATE "json_query"."json_table", "system_user"')
        yield source


@pytest.mark.parametrize("options", [{}, {"skip-empty-xacts": "1", "include-xids": "0"}],
                         ids=["defaults", "skip-empty-xacts"])
def test_keyword_names_quoted_as_the_server_quotes_them(keywords: Source,
                                                        options: dict[str, str]) -> None:
    theirs, ours = compare(keywords, options)
    texts = [x.data for x in theirs]
    assert any(": INSERT: " in t for t in texts) and any(": UPDATE: old-key:" in t for t in texts)
    assert any(": DELETE: " in t for t in texts) and any(": TRUNCATE: " in t for t in texts)
    # What makes this test mean something: before 17 the server leaves bare what the newest
    # release quotes.
    assert any(t.startswith("table json_query.json_table: ") for t in texts) \
        == (keywords.db.major_version < 17)
    # The server version was asked once, through the catalog, since names needed it.
    assert ours.catalog is not None
    asked = [q for q, _ in ours.catalog.asked if "server_version_num" in q]
    assert len(asked) == 1


@pytest.mark.parametrize("given", [True, False], ids=["version-given", "version-unknown"])
def test_keyword_names_without_a_catalog(keywords: Source, given: bool) -> None:
    """Without a catalog, the server version from the context (a replayed capture's) or,
    unknown, the newest release's quoting: right on 17 and 18, not on 15 and 16. User
    types are named from the stream, their names quoted again for the version."""
    theirs, _ = drop_empty_xacts(server_lines(keywords, {}))
    with psycopg.connect(keywords.db.conninfo) as conn:
        version = conn.info.server_version
    ours = our_lines(keywords, {}, catalog=False,
                     server_version=version if given else None).lines
    same = [x.data for x in ours] == [x.data for x in theirs]
    assert same == (given or keywords.db.major_version >= 17)
    if given:
        assert any("[json_value[]]:" in x.data or '["json_value"[]]:' in x.data for x in ours)


def test_replayed_capture_quotes_as_its_server(keywords: Source, tmp_path: Path) -> None:
    """``pgdecode capture`` records the server version in its header and ``pgdecode replay``
    hands it to the emitter: offline, with no catalog, names are quoted as that server
    quotes them (on 15 differently from the newest release)."""
    slot = "kw_capture"  # a copy: the capture consumes it, other tests peek at the original
    with psycopg.connect(keywords.db.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)",
                      (keywords.pgoutput, slot))
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    capture, replayed = tmp_path / "kw.pgd", tmp_path / "kw.txt"
    cli = [sys.executable, "-m", "plugin_framework.cli"]
    subprocess.run([*cli, "capture", "-d", keywords.db.conninfo, "-S", slot,
                    "--publication", keywords.publication, "-E", row[0], "-f", str(capture)],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([*cli, "replay", str(capture), "--emitter", "text", "-f", str(replayed)],
                   check=True, capture_output=True, timeout=120)
    theirs, _ = drop_empty_xacts(server_lines(keywords, {}))
    ours = replayed.read_text().splitlines()
    assert ours == [x.data for x in theirs]


# --- helpers without a server ---------------------------------------------------------------


def test_quote_literal() -> None:
    assert quote_literal("a'b") == "'a''b'"
    assert quote_literal("a\\b") == "E'a\\\\b'"
    assert quote_literal("") == "''"


def test_timestamptz_to_str_against_the_server(parity: Source) -> None:
    """timestamptz_to_str prints as timestamptz_out does under DateStyle ISO."""
    moments = [datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
               datetime(2024, 7, 1, 0, 0, tzinfo=UTC),
               datetime(2000, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
               datetime(9999, 1, 1, tzinfo=UTC)]
    zones = ["UTC", "America/St_Johns", "Asia/Kathmandu", "Europe/Amsterdam",
             "Pacific/Chatham", "America/Sao_Paulo"]
    with psycopg.connect(parity.db.conninfo, autocommit=True) as conn:
        conn.execute("SET DateStyle = ISO")
        for zone in zones:
            conn.execute(psycopg.sql.SQL("SET TimeZone = {}").format(psycopg.sql.Literal(zone)))
            for moment in moments:
                (text,) = conn.execute("SELECT %s::timestamptz::text", (moment,)).fetchone() \
                    or ("",)
                assert timestamptz_to_str(moment, ZoneInfo(zone)) == text, (zone, moment)
    assert timestamptz_to_str(datetime(2024, 1, 1, tzinfo=UTC) + timedelta(microseconds=10),
                              ZoneInfo("UTC")) == "2024-01-01 00:00:00.00001+00"
    # Offsets with seconds (local mean times) print as +HH:MM:SS, as EncodeTimezone does.
    # (Not compared with the server: its time zone data and the system's disagree on them.)
    lmt = timezone(-timedelta(minutes=17, seconds=30))
    assert timestamptz_to_str(datetime(1850, 6, 1, 12, tzinfo=UTC), lmt) \
        == "1850-06-01 11:42:30-00:17:30"


def test_row_templates_print_as_the_column_loop() -> None:
    """Rows are printed through per-pattern templates; the column-by-column loop (kept for
    what has no template) is the reference."""
    from emitters.text.relation import RelationText, append_tuple
    from plugin_framework.framework.model import Relation
    from plugin_framework.protocol import RelationMessage, TupleData
    from plugin_framework.protocol.messages import RelationColumn

    # a quote in a bare column too (never from the server): printed as it is, as in C
    types = [(23, "1"), (25, "it's"), (16, "t"), (16, "f"), (1560, "101"), (1700, "N'aN"),
             (1043, "%s%%"), (3802, '{"a": "\'"}'), (17, "\\x00")]
    columns = tuple(RelationColumn(i == 0, f"c{i}%{oid}", oid, -1)
                    for i, (oid, _) in enumerate(types))
    relation = Relation.from_message(RelationMessage(1, "public", "t%", "d", columns), {})
    text = RelationText(relation, [c.type_name for c in relation.columns])
    n = len(types)
    for pattern in range(3 ** n):
        kinds = bytes(b"tnu"[pattern // 3 ** i % 3] for i in range(n))
        values = tuple(v.encode() if k == ord("t") else None
                       for k, (_, v) in zip(kinds, types, strict=True))
        data = TupleData(kinds, values)
        for skip_nulls in (False, True):
            expected, got = bytearray(), bytearray()
            append_tuple(expected, text.tuple_columns, data, skip_nulls)
            text.append(got, data, skip_nulls)
            assert got == expected, (kinds, skip_nulls)
    assert len(text.patterns) == 256  # the cache is bounded; the rest went through the loop
    with pytest.raises(ValueError, match="binary = false"):
        text.append(bytearray(), TupleData(b"b" * n, (b"\0",) * n), False)


# --- only-local and the origin of non-transactional messages --------------------------------

ORIGIN_SCHEMA = """
CREATE TABLE o (id integer PRIMARY KEY, v text);
CREATE PUBLICATION origin_pub FOR ALL TABLES;
"""
ORIGIN_MESSAGE = "message: transactional: 0 prefix: from-origin, sz: 17 content:nontx from origin"


def run_origin_workload(db: Any) -> LSN:
    """Local changes and messages, and from a replication origin's session a
    non-transactional message and a transaction (with a transactional message)."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        ex = conn.execute
        ex("SET synchronous_commit = on")  # flushed, for the peeks (the clusters' is off)
        ex("INSERT INTO o VALUES (1, 'local')")
        origin = f"{db.dbname}_origin"
        ex("SELECT pg_replication_origin_create(%s)", (origin,))
        ex("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        ex("SELECT pg_logical_emit_message(false, 'from-origin', 'nontx from origin')")
        with conn.transaction():
            ex("INSERT INTO o VALUES (2, 'from elsewhere')")
            ex("SELECT pg_logical_emit_message(true, 'tx-origin', 'in a replayed one')")
        ex("SELECT pg_replication_origin_session_reset()")
        ex("SELECT pg_logical_emit_message(false, 'local', 'nontx local')")
        ex("INSERT INTO o VALUES (3, 'local again')")
        return LSN(str(ex("SELECT pg_current_wal_lsn()").fetchone()[0]))  # type: ignore[index]


@pytest.fixture(scope="module")
def origins(pg: Any) -> Iterator[tuple[Source, LSN]]:
    with paired_slots(pg, ORIGIN_SCHEMA, "orig", "origin_pub") as source:
        yield source, run_origin_workload(source.db)


def streamed_lines(source: Source, options: Mapping[str, str], end: LSN
                   ) -> tuple[list[Line], dict[str, str]]:
    """The text emitter's rows as `pgdecode stream` gets them (the walsender source, with
    the options it asks the server for), from a copy of the pgoutput slot; and those
    options."""
    copy = f"{source.pgoutput}_{len(options)}_{'_'.join(options.values())}"
    with psycopg.connect(source.db.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)",
                     (source.pgoutput, copy))
    catalog = Catalog(source.db.conninfo)
    pipeline = Pipeline(catalog=catalog)
    out = MemoryOutput()
    pipeline.add(TestDecodingEmitter(), options=options, output=out)
    walsender = WalsenderSource(
        SourceConfig(source.db.conninfo, copy, [source.publication], endpos=end,
                     reconnect=False), pipeline)
    try:
        walsender.run()
    finally:
        pipeline.shutdown()
        catalog.close()
        with psycopg.connect(source.db.conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (copy,))
    return [Line(r.lsn, r.xid or 0, r.data.decode()) for r in out.records], walsender.options


@pytest.mark.parametrize("options", [
    {"only-local": "1"}, {"only-local": "1", "skip-empty-xacts": "1"}, {"only-local": "0"},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_only_local_and_messages_from_an_origin(origins: tuple[Source, LSN],
                                                options: dict[str, str]) -> None:
    """With only-local, test_decoding leaves out what a replication origin's session wrote,
    non-transactional messages included. pgoutput does not say a non-transactional
    message's origin: on PostgreSQL 16 and later pgdecode asks the server to filter
    (origin 'none') and is exact; on 15 it prints that message (docs/emitters-text.md)."""
    source, end = origins
    theirs = server_lines(source, options)
    ours, asked = streamed_lines(source, options, end)
    if options.get("skip-empty-xacts") != "1":
        theirs, _ = drop_empty_xacts(theirs)
    local = options["only-local"] == "1"
    assert asked.get("origin") == ("none" if local and source.db.major_version >= 16 else None)
    assert (ORIGIN_MESSAGE in [x.data for x in theirs]) == (not local)
    if local and source.db.major_version < 16:
        # The known difference on 15, and only it.
        assert [x.data for x in ours].count(ORIGIN_MESSAGE) == 1
        ours = [x for x in ours if x.data != ORIGIN_MESSAGE]
    assert_same(ours, theirs, begin_lsn=options.get("skip-empty-xacts") == "1")
    texts = [x.data for x in ours]
    assert "message: transactional: 0 prefix: local, sz: 11 content:nontx local" in texts
    assert any("'from elsewhere'" in t for t in texts) == (not local)
