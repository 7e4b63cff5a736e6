"""The net change of a batch (plugin_framework/spark/netchange.py) and the description
changes a mirror follows (schemas.py), on hand-made change rows: the cases where the server
tests' random workloads may or may not land (tests/test_spark_mirror.py checks the whole
against SELECT *)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from plugin_framework.spark.netchange import net_changes
from plugin_framework.spark.schemas import SchemaChangeError, columns_map, describe_rows

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
