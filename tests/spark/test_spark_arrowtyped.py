"""arrowtyped.typed_net (the sinks' typing in Python) equals sinks.net_frame (the Spark
expressions of tables.py, the reference) value by value: on texts in the forms the server
writes, drawn by hypothesis across each type's range (BC years, years past 9999, offsets with
seconds, numeric rounding ties and overflow, float edge cases, arrays with NULLs), and on a
real stream's changes of every supported type on each server version. Forms it does not know
are declined, never guessed."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.spark_fixtures import spark_session  # noqa: F401

from plugin_framework.spark.columns.arrowtyped import Decline, typed_net
from plugin_framework.spark.columns.descriptions import TableInfo
from plugin_framework.spark.mirrors.netchange import NetChanges, net_schema
from plugin_framework.spark.mirrors.staterows import merge_state, state_rows
from plugin_framework.spark.mirrors.typed import net_frame

pytestmark = pytest.mark.slow

COLUMNS = (("id", "integer"), ("s", "smallint"), ("b", "bigint"), ("o", "oid"),
           ("r", "real"), ("d", "double precision"), ("n", "numeric(9,3)"),
           ("n0", "numeric(38,0)"), ("nx", "numeric"), ("t", "boolean"), ("x", "bytea"),
           ("day", "date"), ("ts", "timestamp without time zone"),
           ("tz", "timestamp with time zone"), ("u", "uuid"), ("ia", "integer[]"),
           ("ta", "text[]"), ("da", "date[]"), ("za", "timestamp with time zone[]"),
           ("xa", "bytea[]"), ("na", "numeric(5,2)[]"), ("ba", "boolean[]"),
           ("ra", "real[]"), ("fa", "double precision[]"),
           ("ua", "timestamp without time zone[]"))


def storage(array: pa.ChunkedArray | pa.Array) -> list[Any]:
    """Values to compare: dates and timestamps as their numbers (Python's datetime has no
    year 0), floats by their bits' meaning (NaN equal to NaN, -0.0 apart from 0.0)."""
    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return pa.int64()
        if pa.types.is_date32(t):
            return pa.int32()
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(plain(t.value_type))
        return t

    def norm(v: Any) -> Any:
        if isinstance(v, float):
            return "NaN" if math.isnan(v) else (v, math.copysign(1, v))
        if isinstance(v, list):
            return [norm(e) for e in v]
        return v

    return [norm(v) for v in array.cast(plain(array.type)).to_pylist()]


def assert_same(spark: Any, net: pa.Table, info: TableInfo) -> None:
    """typed_net equals net_frame, and state_rows merge_state of an empty target (the
    column types and their metadata too)."""
    keys = list(info.key_columns)
    ours = typed_net(net, [(n, t) for n, t, _ in info.columns], keys)
    changes = NetChanges(net, truncated=False, fills=[])
    theirs = net_frame(spark, changes, info).toArrow()
    assert_equal_tables(ours, theirs, net)
    assert_equal_tables(state_rows(ours, info),
                        merge_state(spark, changes, info, None).toArrow(), net)


def assert_equal_tables(ours: pa.Table, theirs: pa.Table, net: pa.Table) -> None:
    def described(field: pa.Field) -> tuple[Any, ...]:
        t = field.type
        return (field.name, t.value_type if pa.types.is_list(t) else t, field.metadata)

    assert [described(f) for f in ours.schema] == [described(f) for f in theirs.schema]
    for name in ours.column_names:
        mine, ref = storage(ours.column(name)), storage(theirs.column(name))
        bad = [(i, a, b) for i, (a, b) in enumerate(zip(mine, ref, strict=True)) if a != b]
        assert not bad, (name, [(net.column("row").to_pylist()[i], a, b) for i, a, b in bad[:3]])


def net_of(rows: list[dict[str, str | None]], jsons: list[str | None]) -> pa.Table:
    n = len(rows)
    columns = {"deleted": [False] * n, "row": [list(r.items()) for r in rows],
               "row_json": jsons, "fill": [[] for _ in rows],
               "origin": [[("id", r.get("id"))] for r in rows],
               "origin_json": [None] * n, "commit_lsn": list(range(n)), "lsn": list(range(n)),
               "copies": [1] * n}
    return pa.table(columns, schema=net_schema())


INFO = TableInfo("public", "t", tuple((n, t, n == "id") for n, t in COLUMNS))

year = st.one_of(st.integers(1, 9999), st.integers(10000, 294300), st.integers(1, 4713))
usual_year = st.integers(1000, 9999)
two = st.integers(1, 12).map(lambda m: f"{m:02d}")


@st.composite
def date_text(draw: Any, usual: bool = False) -> str:
    y, bc = draw(usual_year if usual else year), not usual and draw(st.booleans())
    day = draw(st.integers(1, 28))
    return f"{y:04d}-{draw(two)}-{day:02d}" + (" BC" if bc and y <= 4713 else "")


@st.composite
def time_text(draw: Any, zone: bool, sep: str = " ", usual: bool = False) -> str:
    d = draw(date_text(usual))
    date, bc = d.removesuffix(" BC"), d.endswith(" BC")
    t = f"{draw(st.integers(0, 23)):02d}:{draw(st.integers(0, 59)):02d}:" \
        f"{draw(st.integers(0, 59)):02d}"
    frac = draw(st.one_of(st.just(""), st.integers(0, 999999).map(
        lambda f: "." + f"{f:06d}".rstrip("0") if f else "")))
    off = ""
    if zone:
        h, m, s = draw(st.integers(0, 15)), draw(st.integers(0, 59)), draw(st.integers(0, 59))
        off = draw(st.sampled_from("+-")) + f"{h:02d}" + draw(st.sampled_from(
            ["", f":{m:02d}"] + ([] if usual else [f":{m:02d}:{s:02d}"])))
    return f"{date}{sep}{t}{frac}{off}" + (" BC" if bc else "")


def integer_text(bits: int, usual: bool = False) -> st.SearchStrategy[str]:
    edge = 0 if usual else 2
    return st.integers(-(1 << (bits - 1)) - edge, (1 << (bits - 1)) - 1 + edge).map(str)


def numeric_text(whole: int, scale: int, usual: bool = False) -> st.SearchStrategy[str]:
    if usual:  # what a numeric(whole + scale, scale) column holds: every digit of the scale
        return st.tuples(st.integers(-(10 ** whole) + 1, 10 ** whole - 1),
                         st.integers(0, 10 ** scale - 1)).map(
            lambda t: f"{t[0]}.{str(t[1]).rjust(scale, '0')}")
    return st.one_of(
        st.just("NaN"),
        st.tuples(st.integers(-(10 ** (whole + 1)), 10 ** (whole + 1)),
                  st.integers(0, 10 ** scale - 1), st.integers(scale, scale + 3)).map(
            lambda t: f"{t[0]}.{str(t[1]).rjust(t[2], '0')}" if t[2] else str(t[0])))


floats = st.floats(allow_nan=True, allow_infinity=True).map(
    lambda f: {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(repr(f), repr(f)))


def json_list(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any] | None]:
    return st.one_of(st.none(), st.lists(st.one_of(st.none(), elements), max_size=4))


@st.composite
def row(draw: Any, usual: bool) -> tuple[dict[str, str | None], str]:
    """A change row's text and typed JSON; ``usual``: only the forms Arrow's casts take
    (the other path of arrowtyped._column)."""
    def maybe(s: st.SearchStrategy[str]) -> str | None:
        return draw(st.one_of(st.none(), s))

    values = {
        "id": draw(st.integers(1, 10 ** 6)).__str__(),
        "s": maybe(integer_text(16, usual)), "b": maybe(integer_text(64, usual)), "o": maybe(
            st.integers(0, 4294967295).map(str)),
        "r": maybe(floats), "d": maybe(floats), "n": maybe(numeric_text(6, 3, usual)),
        "n0": maybe(st.sampled_from(["9" * 38, "-" + "9" * 38, "0"] + ([] if usual else
                                                                       ["1" + "0" * 38]))),
        "nx": maybe(numeric_text(40, 5)), "t": maybe(st.sampled_from(["t", "f"])),
        "x": maybe(st.binary(max_size=8).map(lambda b: "\\x" + b.hex())),
        "day": maybe(date_text(True) if usual else st.one_of(
            date_text(), st.sampled_from(["infinity", "-infinity"]))),
        "ts": maybe(time_text(False, usual=True) if usual else st.one_of(
            time_text(False), st.just("infinity"))),
        "tz": maybe(time_text(True, usual=True) if usual else st.one_of(
            time_text(True), st.just("-infinity"))),
        "u": maybe(st.uuids().map(str)),
    }
    arrays = {
        "ia": draw(json_list(st.integers(-(1 << 31), (1 << 31) - 1))),
        "ua": draw(json_list(time_text(False, sep="T", usual=usual))),
        "ta": draw(json_list(st.text(max_size=5))),
        "da": draw(json_list(date_text())),
        "za": draw(json_list(time_text(True, sep="T"))),
        "xa": draw(json_list(st.binary(max_size=4).map(bytes.hex))),
        "na": draw(json_list(numeric_text(4, 2))),  # numerics: JSON strings
        "ra": draw(json_list(st.floats(width=32, allow_nan=False, allow_infinity=False))),
        "fa": draw(json_list(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                       st.integers(-10 ** 6, 10 ** 6)))),
        "ba": draw(json_list(st.booleans())),
    }
    if not usual and draw(st.booleans()):
        arrays["ia"] = [[1, 2], [3, 4]]  # two dimensions: NULL
    import json

    values.update({k: None if v is None else json.dumps(v) for k, v in arrays.items()})
    return values, json.dumps({"id": int(values["id"]), **arrays})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(st.booleans().flatmap(lambda usual: st.lists(row(usual), min_size=1, max_size=60)))
def test_typed_net_equals_spark_on_texts_of_each_type(spark: Any, rows: list[Any]) -> None:
    assert_same(spark, net_of([r for r, _ in rows], [j for _, j in rows]), INFO)


@pytest.mark.parametrize(("pg", "text"), [
    ("integer", " 12"), ("integer", "1_000"), ("integer", "١٢"), ("bytea", "\\x0"),
    ("boolean", "yes"), ("date", "2024-1-01"), ("timestamp with time zone", "2024-01-01"),
    ("timestamp without time zone", "2024-01-01 00:00:00+02"), ("real", " 1.5"),
    ("numeric(5,2)", "1,5")])
def test_forms_the_server_does_not_write_are_declined(pg: str, text: str) -> None:
    with pytest.raises(Decline):
        typed_net(net_of([{"id": "1", "v": text}], [None]), [("id", "integer"), ("v", pg)],
                  ["id"])
    with pytest.raises(Decline):  # an array element that is an object
        typed_net(net_of([{"id": "1"}], ['{"a": [{"k": 1}]}']), [("a", "text[]")], [])
    with pytest.raises(Decline):  # a numeric as a JSON number: its digits are gone, parsed
        typed_net(net_of([{"id": "1"}], ['{"a": [1.50]}']), [("a", "numeric(5,2)[]")], [])


TYPED = """
CREATE TABLE typed (id int PRIMARY KEY, s smallint, b bigint, o oid, r real, d double precision,
    n numeric(9,3), n0 numeric(38,0), nx numeric, t boolean, x bytea, day date, ts timestamp,
    tz timestamptz, u uuid, ia int[], ta text[], da date[], za timestamptz[], xa bytea[],
    na numeric(5,2)[], ba boolean[], ra real[], fa double precision[]);
CREATE PUBLICATION typed_pub FOR TABLE typed;
"""

# Each type across its range: BC and five-digit years, infinity, NaN, the local mean time
# offsets with seconds of a time zone's early years, two-dimensional arrays, NULLs
TYPED_ROWS = """
INSERT INTO typed SELECT g, (g * 337 % 65536 - 32768)::smallint,
  ((g * 30000000000000001::numeric) % 9223372036854775807)::bigint * (1 - 2 * (g % 2)),
  (g::bigint * 99991) % 4294967296,
  CASE g % 23 WHEN 0 THEN 'NaN' WHEN 1 THEN '-Infinity' WHEN 2 THEN '-0' ELSE g * 1.1 END::real,
  CASE g % 19 WHEN 0 THEN 'Infinity' WHEN 1 THEN '1e-320' ELSE g / 7.0 END::float8,
  CASE WHEN g % 31 = 0 THEN 'NaN' ELSE (g * 12345.6789 / 7 - 20000) END::numeric(9,3),
  (g::numeric ^ 13)::numeric(38,0), CASE WHEN g % 29 = 0 THEN 'NaN' ELSE g::numeric / 7 END,
  CASE WHEN g % 3 = 0 THEN NULL ELSE g % 2 = 0 END,
  CASE WHEN g % 17 = 0 THEN '\\x' ELSE decode(md5(g::text), 'hex') END,
  CASE WHEN g % 50 = 0 THEN 'infinity' WHEN g % 50 = 1 THEN '-infinity'
       ELSE date '4713-01-01 BC' + (g % 2000) * 1000003 END,
  CASE WHEN g % 40 = 0 THEN 'infinity'
       ELSE timestamp '4713-01-01 00:00:00 BC' + g * interval '1234567 h 17 min 3.123456 s' END,
  CASE WHEN g % 45 = 0 THEN '-infinity'
       ELSE timestamptz '0100-06-01 12:00+00 BC' + g * interval '9 years 3 days 17 min 11.5 s' END,
  md5(g::text)::uuid,
  CASE WHEN g % 9 = 0 THEN ARRAY[[g, 1], [2, NULL]] ELSE ARRAY[g, NULL, -g] END,
  ARRAY['a' || g, NULL, 'x,y"z'], ARRAY[date '0044-03-15 BC' + g * 4001, NULL],
  ARRAY[timestamptz '1850-01-01 00:00+00' + g * interval '7 days 1 min 1.25 s'],
  ARRAY[decode(md5(g::text), 'hex'), NULL], ARRAY[(g % 1000) / 7.0, NULL]::numeric(5,2)[],
  ARRAY[g % 2 = 0, NULL], ARRAY[g / 3.0, 'NaN', '-Infinity', NULL]::real[],
  ARRAY[g / 7.0, '1e-320', 'Infinity']::float8[]
FROM generate_series(1, 400) g
"""


def test_typed_net_equals_spark_on_a_servers_stream(db: Any, spark: Any,
                                                     tmp_path: Any) -> None:
    """The spark emitter's batches of a table of every supported type (inserts, updates,
    key changes, deletes), in the walsender's time zone Europe/Amsterdam: each batch's net
    changes, and its history versions and ends, typed both ways are equal."""
    from plugin_framework.spark import ForeachBatchStream, HistoryWriter
    from plugin_framework.spark.changes.rows import batch_rows
    from plugin_framework.spark.columns.descriptions import rows_info
    from plugin_framework.spark.mirrors.keys import key_names
    from plugin_framework.spark.mirrors.netchange import net_changes
    from plugin_framework.spark.mirrors.versions import ends_arrow, history_changes, versions_arrow

    db.execute(f"ALTER DATABASE {db.dbname} SET timezone = 'Europe/Amsterdam'")
    with db.connect(autocommit=True) as conn:
        conn.execute(TYPED)
    db.execute("SELECT pg_create_logical_replication_slot('typed', 'pgoutput')")
    with db.connect(autocommit=True) as conn:
        conn.execute(TYPED_ROWS)
        conn.execute("UPDATE typed SET r = r * 2, tz = tz + interval '1 s' WHERE id % 5 = 0")
        conn.execute("UPDATE typed SET id = id + 1000 WHERE id % 7 = 0")
        conn.execute("DELETE FROM typed WHERE id % 11 = 0")
    end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    texts: list[str] = []
    writer = HistoryWriter(str(tmp_path / "history"))

    def check(df: Any, batch_id: int) -> None:
        for (schema, table), rows in batch_rows(df).items():
            info = rows_info(schema, table, rows)
            net = net_changes(rows, key_names(info))
            assert_same(spark, net.table, info)
            history = history_changes(rows, key_names(info))  # HistoryWriter's typing
            assert_equal_tables(versions_arrow(history, info),
                                writer._versions(spark, history, info).toArrow(),
                                history.versions)
            assert_equal_tables(ends_arrow(history, info),
                                writer._ends(spark, history, info).toArrow(), history.ends)
            texts.extend(dict(r).get("tz") or "" for r in net.table.column("row").to_pylist())

    ForeachBatchStream(spark, check, dsn=db.conninfo, slot="typed", publications=["typed_pub"],
                       checkpoint=str(tmp_path / "ck"), max_rows=300, endpos=end).run()
    assert len(texts) > 300
    # the hard forms came through: offsets with seconds, BC, infinity
    assert any(t.count(":") == 4 for t in texts), texts[:5]
    assert any(t.endswith(" BC") for t in texts) and "-infinity" in texts


def test_sinks_type_by_spark_what_arrowtyped_declines(db: Any, spark: Any, tmp_path: Any,
                                                       caplog: Any) -> None:
    """A jsonb[] column (its elements are JSON objects, which arrowtyped declines): the
    Parquet, Delta and history sinks type that table's batches with Spark's expressions,
    fill unchanged TOAST values, and still equal the table."""
    import json
    import logging

    from support.spark_fixtures import delta_rows

    from plugin_framework.spark import (
        DeltaTableWriter,
        ForeachBatchStream,
        HistoryWriter,
        TableStateWriter,
        read_state,
    )

    with db.connect(autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE j (id int PRIMARY KEY, docs jsonb[], n int, big text);
            ALTER TABLE j ALTER COLUMN big SET STORAGE EXTERNAL;
            CREATE PUBLICATION j_pub FOR TABLE j;""")
    db.execute("SELECT pg_create_logical_replication_slot('j', 'pgoutput')")
    with db.connect(autocommit=True) as conn:
        conn.execute("""INSERT INTO j SELECT g, ARRAY[jsonb_build_object('g', g, 'l', ARRAY[g]),
                                                     NULL, '"s"'::jsonb],
                                              g, repeat(md5(g::text), 200)
                        FROM generate_series(1, 120) g""")
        for step in range(3):  # TOAST unchanged, key changes, deletes: in later batches
            conn.execute("UPDATE j SET n = n + 1 WHERE id %% 3 = %s", (step,))
            conn.execute("UPDATE j SET id = id + 1000 WHERE id %% 7 = %s", (step,))
            conn.execute("DELETE FROM j WHERE id %% 11 = %s", (step,))
    end = str(db.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    delta, history = str(tmp_path / "delta"), str(tmp_path / "history")
    state = str(tmp_path / "state")
    sinks = [TableStateWriter(state, file_rows=30), DeltaTableWriter(delta),
             HistoryWriter(history)]

    def fn(df: Any, batch_id: int) -> None:
        for sink in sinks:
            sink(df, batch_id)

    with caplog.at_level(logging.DEBUG, logger="plugin_framework.spark"):
        ForeachBatchStream(spark, fn, dsn=db.conninfo, slot="j", publications=["j_pub"],
                           checkpoint=str(tmp_path / "ck"), max_rows=40, endpos=end).run()
    declined = [r for r in caplog.records if "typed by Spark" in r.getMessage()]
    assert {r.name for r in declined} == {"plugin_framework.spark.sinks",
                                          "plugin_framework.spark.history"}, declined[:2]

    def element(text: str | None) -> Any:
        # Spark's from_json to array<string>: an object's JSON text, a string unquoted
        return json.loads(text) if text is not None and text.startswith("{") else text

    expected = {r[0]: r for r in db.execute("SELECT id, docs, n, big FROM j")}
    for path, current in ((state, None), (delta, False), (history, True)):
        rows = [tuple(r) for r in read_state(spark, path, "public.j")
                .select("id", "docs", "n", "big").collect()] if current is None else \
            delta_rows(path, "public.j", ["id", "docs", "n", "big"], history=current)
        got = {r[0]: (r[0], None if r[1] is None else [element(e) for e in r[1]], r[2], r[3])
               for r in rows}
        assert len(rows) == len(got) == len(expected) > 50
        assert got == {k: (v[0], list(v[1]), v[2], v[3]) for k, v in expected.items()}, path
