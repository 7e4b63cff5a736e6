"""The net change of a batch (plugin_framework/spark/mirrors/netchange.py) and the description
changes a mirror follows (schemas.py), on hand-made change rows: the cases where the server
tests' random workloads may or may not land (tests/spark/test_spark_mirror.py checks the whole
against SELECT *)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from plugin_framework.spark.columns.descriptions import (
    SchemaChangeError,
    columns_map,
    describe_rows,
)
from plugin_framework.spark.mirrors.netchange import net_changes

COLUMNS = [{"name": "id", "type": "integer"}, {"name": "v", "type": "text"},
           {"name": "big", "type": "text"}]


def change(op: str, seq: int, *, after: dict[str, Any] | None = None,
           before: dict[str, Any] | None = None, key: dict[str, Any] | None = None,
           toast: tuple[str, ...] = (), columns: list[dict[str, str]] = COLUMNS,
           commit_lsn: int = 100) -> dict[str, Any]:
    def text(row: dict[str, Any] | None) -> list[tuple[str, str | None]] | None:
        return None if row is None else [(k, None if v is None else str(v))
                                         for k, v in row.items()]

    if key is None:
        key = {"id": (before or after or {})["id"]}
    return {"op": op, "seq": seq, "lsn": commit_lsn - 10 + seq, "commit_lsn": commit_lsn,
            "key": text(key), "before": text(before), "after": text(after),
            "before_json": None if before is None else json.dumps(before),
            "after_json": None if after is None else json.dumps(after),
            "unchanged_toast": list(toast), "columns": columns}


def net(rows: list[dict[str, Any]], keys: tuple[str, ...] = ("id",)) -> dict[Any, Any]:
    result = net_changes(rows, keys)
    out = {}
    for r in result.table.to_pylist():
        row = dict(r["row"])
        out[tuple(row.get(k) for k in keys)] = (
            "gone" if r["deleted"] else row, r["fill"],
            None if r["origin"] is None else dict(r["origin"]),
            None if r["row_json"] is None else json.loads(r["row_json"]))
    return out


def test_toast_follows_a_chain_of_key_changes_in_the_batch() -> None:
    rows = [change("INSERT", 0, after={"id": 1, "v": "a", "big": "T"}),
            change("UPDATE", 1, after={"id": 2, "v": "b", "big": None}, before={"id": 1},
                   toast=("big",)),
            change("UPDATE", 2, after={"id": 3, "v": "c", "big": None}, before={"id": 2},
                   toast=("big",))]
    got = net(rows)
    assert got[("1",)][0] == "gone" and got[("2",)][0] == "gone"
    row, fill, _, row_json = got[("3",)]
    assert (row["big"], row["v"], fill) == ("T", "c", [])
    assert row_json["big"] == "T"


def test_toast_of_a_row_before_the_batch_comes_from_where_its_chain_began() -> None:
    rows = [change("UPDATE", 0, after={"id": 2, "v": "b", "big": None}, before={"id": 1},
                   toast=("big",)),
            change("UPDATE", 1, after={"id": 3, "v": "c", "big": None}, before={"id": 2},
                   toast=("big",)),
            change("UPDATE", 2, after={"id": 3, "v": "d", "big": None}, toast=("big",))]
    got = net(rows)
    row, fill, origin, _ = got[("3",)]
    assert (row["v"], fill, origin) == ("d", ["big"], {"id": "1"})
    assert got[("1",)][0] == "gone"


def test_replica_identity_full_takes_toast_from_the_old_row_before_the_key() -> None:
    full = ("id", "v", "big")
    rows = [change("UPDATE", 0, after={"id": 1, "v": "b", "big": None},
                   before={"id": 1, "v": "a", "big": "T"}, toast=("big",))]
    got = net(rows, full)
    assert set(got) == {("1", "a", "T"), ("1", "b", "T")}
    assert got[("1", "a", "T")][0] == "gone"
    assert got[("1", "b", "T")][1] == []


def test_delete_and_insert_again_and_truncate() -> None:
    rows = [change("DELETE", 0, before={"id": 1}),
            change("INSERT", 1, after={"id": 1, "v": "new", "big": "N"})]
    assert net(rows)[("1",)][0]["v"] == "new"
    rows.append(change("TRUNCATE", 2, key={"id": None}))
    rows.append(change("INSERT", 3, after={"id": 5, "v": "x", "big": "X"}))
    result = net_changes(rows, ("id",))
    assert result.truncated
    assert [dict(r["row"])["id"] for r in result.table.to_pylist()] == ["5"]


def test_renames_adds_and_drops_are_followed_through_a_batch() -> None:
    renamed = [{"name": "id", "type": "integer"}, {"name": "w", "type": "text"},
               {"name": "big", "type": "text"}]
    added = [*renamed, {"name": "extra", "type": "integer"}]
    rows = [change("INSERT", 0, after={"id": 1, "v": "a", "big": "T"}),
            change("UPDATE", 1, after={"id": 1, "w": "b", "big": None}, toast=("big",),
                   columns=renamed),
            change("INSERT", 2, after={"id": 2, "w": "c", "big": "U", "extra": 7},
                   columns=added)]
    stored = tuple((c["name"], c["type"]) for c in COLUMNS)
    newest, state_map = describe_rows("public.t", rows, stored)
    assert [n for n, _ in newest] == ["id", "w", "big", "extra"]
    assert state_map == {"id": "id", "v": "w", "big": "big"}
    assert dict(rows[0]["after"]) == {"id": "1", "w": "a", "big": "T"}
    assert json.loads(rows[0]["after_json"]) == {"id": 1, "w": "a", "big": "T"}
    assert net(rows)[("1",)][0] == {"id": "1", "w": "b", "big": "T"}
    dropped = (("id", "integer"), ("big", "text"))
    assert columns_map("public.t", [stored, dropped]) == {"id": "id", "v": None, "big": "big"}


def test_a_change_it_cannot_tell_from_a_drop_and_an_add_is_refused() -> None:
    old = (("id", "integer"), ("v", "text"))
    new = (("id", "integer"), ("n", "numeric"))
    with pytest.raises(SchemaChangeError, match=r"public\.t: column v \(text\) is now n"):
        columns_map("public.t", [old, new])


# --- the column-wise net of simple batches (simple_net) against the replay ----------------


def table_rows(rows: list[dict[str, Any]]) -> Any:
    """Change rows as batch_rows gives them to the sinks: an Arrow table and its dicts."""
    import pyarrow as pa

    from plugin_framework.spark.changes.rows import NET_COLUMNS, TableRows
    from plugin_framework.spark.changes.schema import arrow_schema

    full = arrow_schema()
    schema = pa.schema([full.field(n) for n in NET_COLUMNS])
    arrow = pa.Table.from_pylist([{"schema": "public", "table": "t", "commit_time": None, **r}
                                  for r in rows], schema=schema)
    return TableRows(arrow, arrow.column("columns").to_pylist())


@st.composite
def batches(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Batches that are mostly simple (each key once, no old row, no unchanged TOAST), and
    some that are not in one way."""
    keys = draw(st.lists(st.integers(0, 30), min_size=1, max_size=25,
                         unique=draw(st.booleans()) or draw(st.booleans())))
    rows = []
    for seq, k in enumerate(keys):
        op = draw(st.sampled_from(["INSERT", "UPDATE", "DELETE", "SNAPSHOT"]))
        value = draw(st.one_of(st.none(), st.text(max_size=5)))
        after = {"id": k, "v": value, "big": draw(st.sampled_from([None, "T", "ü\n"]))}
        commit_lsn = 100 + seq // 3 * 50
        if op == "DELETE":
            rows.append(change(op, seq, key={"id": k}, commit_lsn=commit_lsn,
                               before=({"id": k} if draw(st.booleans()) else None)))
            rows[-1]["before"] = None if draw(st.integers(0, 9)) else rows[-1]["before"]
        elif op == "UPDATE" and draw(st.integers(0, 9)) == 0:  # a key change
            rows.append(change(op, seq, after=after, before={"id": k + 100},
                               commit_lsn=commit_lsn))
        else:
            toast = ("big",) if op == "UPDATE" and draw(st.integers(0, 9)) == 0 else ()
            rows.append(change(op, seq, after=after, key={"id": k}, commit_lsn=commit_lsn,
                               toast=toast))
    if draw(st.integers(0, 19)) == 0:
        rows.append(change("TRUNCATE", len(rows), key={"id": 0}))
        rows[-1].update(key=None, after=None, after_json=None)
    return rows


@settings(max_examples=300, deadline=None)
@given(batches())
def test_simple_batches_net_column_wise_as_the_replay_does(rows: list[dict[str, Any]]) -> None:
    from plugin_framework.spark.mirrors.netchange import simple_net

    fast = simple_net(table_rows(rows).arrow, ("id",))
    replayed = net_changes(rows, ("id",))
    event("simple" if fast is not None else "replayed")
    if fast is None:  # not simple: net_changes of the Arrow rows replays them
        got = net_changes(table_rows(rows), ("id",))
    else:
        got = fast
        assert all((r["op"] != "UPDATE" or r["before"] is None) and not r["unchanged_toast"]
                   for r in rows)
    assert got.table.to_pylist() == replayed.table.to_pylist()
    assert got.table.schema == replayed.table.schema
    assert (got.truncated, got.fills) == (replayed.truncated, replayed.fills)


def test_simple_net_takes_the_batches_it_should() -> None:
    from plugin_framework.spark.mirrors.netchange import simple_net

    simple = [change("INSERT", 0, after={"id": 1, "v": "a", "big": "T"}),
              change("UPDATE", 1, after={"id": 2, "v": "b", "big": "U"}),
              change("DELETE", 2, key={"id": 3})]
    assert simple_net(table_rows(simple).arrow, ("id",)) is not None
    twice = [*simple, change("UPDATE", 3, after={"id": 1, "v": "c", "big": "T"}),
             change("INSERT", 4, after={"id": 3, "v": "d", "big": "T"})]
    net = simple_net(table_rows(twice).arrow, ("id",))
    assert net is not None and [dict(r["row"])["v"] for r in net.table.to_pylist()] == \
        ["b", "c", "d"]
    toast = [change("UPDATE", 0, after={"id": 2, "v": "b", "big": None}, toast=("big",))]
    moved = [change("UPDATE", 0, after={"id": 2, "v": "b", "big": "T"}, before={"id": 1})]
    null_key = [change("INSERT", 0, after={"id": None, "v": "a", "big": "T"}, key={"id": 1})]
    for rows in (toast, moved, null_key):
        assert simple_net(table_rows(rows).arrow, ("id",)) is None


FULL_COLUMNS = [{"name": "a", "type": "integer"}, {"name": "b", "type": "text"}]


def full_row(values: tuple[int, str]) -> dict[str, Any]:
    return {"a": values[0], "b": values[1]}


@st.composite
def full_batches(draw: st.DrawFn) -> tuple[list[tuple[int, str]], list[dict[str, Any]],
                                           Counter[tuple[int, str]]]:
    """A table keyed by every column (REPLICA IDENTITY FULL, no primary key) holding equal
    rows: its rows before a batch, the batch (changes the source could make: deletes and
    updates of rows it has, updates that leave ``b`` unchanged as TOAST), and its rows
    after."""
    row = st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"]))
    target = draw(st.lists(row, max_size=6))
    source = Counter(target)
    rows: list[dict[str, Any]] = []
    for seq in range(draw(st.integers(0, 15))):
        choice, present = draw(st.integers(0, 19)), sorted(source.elements())
        commit_lsn = 100 + seq // 3 * 50
        if choice == 0:
            rows.append(change("TRUNCATE", seq, key={"id": 0}, commit_lsn=commit_lsn))
            rows[-1].update(key=None, after=None, after_json=None)
            source.clear()
        elif choice < 8 or not present:
            new = draw(row)
            rows.append(change("INSERT", seq, after=full_row(new),
                               key=full_row(new), columns=FULL_COLUMNS,
                               commit_lsn=commit_lsn))
            source[new] += 1
        elif choice < 13:
            old = draw(st.sampled_from(present))
            rows.append(change("DELETE", seq, key=full_row(old),
                               before=full_row(old), columns=FULL_COLUMNS,
                               commit_lsn=commit_lsn))
            source[old] -= 1
        else:
            old, new = draw(st.sampled_from(present)), draw(row)
            toast = ("b",) if draw(st.booleans()) else ()
            if toast:
                new = (new[0], old[1])
            after = {"a": new[0], "b": None if toast else new[1]}
            rows.append(change("UPDATE", seq, after=after, before=full_row(old),
                               key=full_row(old), toast=toast, columns=FULL_COLUMNS,
                               commit_lsn=commit_lsn))
            if toast:
                rows[-1]["after"] = [("a", str(new[0]))]  # the server sends no value
                rows[-1]["after_json"] = json.dumps({"a": new[0]})
            source[old] -= 1
            source[new] += 1
    return target, rows, +source


@settings(max_examples=300, deadline=None)
@given(full_batches())
def test_a_table_keyed_by_every_column_keeps_its_equal_rows(
        case: tuple[list[tuple[int, str]], list[dict[str, Any]], Counter[tuple[int, str]]]
) -> None:
    """counted_net's copies, taken away from and added to the rows before the batch, give
    the rows after it, equal rows counted (as PostgreSQL's subscriber applies them)."""
    target, rows, expected = case
    result = net_changes(rows, ("a", "b"), counted=True)
    got: Counter[tuple[int, str]] = Counter() if result.truncated else Counter(target)
    for r in result.table.to_pylist():
        values = dict(r["row"])
        row = (int(values["a"]), values["b"])
        assert json.loads(r["row_json"]) == {"a": row[0], "b": row[1]}
        if r["deleted"]:
            assert got[row] >= r["copies"] > 0  # never more than the rows there are
            got[row] -= r["copies"]
        else:
            got[row] += r["copies"]
    assert +got == expected
    event(f"equal rows after: {any(n > 1 for n in expected.values())}")
