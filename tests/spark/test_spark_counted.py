"""The three state sinks (TableStateWriter, DeltaTableWriter, HistoryWriter) on tables keyed
by every column, driven with change rows made here and no Spark (every value is typed in
Python): equal rows are counted, also where the first column is an array (no unique nor isin
for lists), a float that is NaN or -0 (which a MERGE takes as equal and isin does not), and
in a batch whose changes cancel out (nothing to put). tests/spark/test_spark_mirror.py compares
them with SELECT * after a server's workload."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from plugin_framework.spark.columns.descriptions import rows_info
from plugin_framework.spark.mirrors.delta import DeltaTableWriter
from plugin_framework.spark.mirrors.deltatables import read_delta
from plugin_framework.spark.mirrors.history import HistoryWriter
from plugin_framework.spark.mirrors.parquet import TableStateWriter
from plugin_framework.spark.mirrors.statefiles import StateFiles

Columns = list[tuple[str, str]]
Row = tuple[Any, ...]
NAN = float("nan")


def text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return "{" + ",".join(value) + "}"
    if isinstance(value, float) and value != value:
        return "NaN"
    return str(value)


def change(columns: Columns, op: str, seq: int, lsn: int, old: Row | None,
           new: Row | None) -> dict[str, Any]:
    """A change row of a REPLICA IDENTITY FULL table: every column the key, the old row
    whole."""
    def as_map(row: Row | None) -> list[tuple[str, str | None]] | None:
        return None if row is None else [(n, text(v)) for (n, _), v in zip(columns, row,
                                                                            strict=True)]

    def as_json(row: Row | None) -> str | None:
        return None if row is None else json.dumps(
            {n: "NaN" if isinstance(v, float) and v != v else v
             for (n, _), v in zip(columns, row, strict=True)})

    return {"schema": "public", "table": "t", "op": op, "seq": seq, "lsn": lsn + seq,
            "commit_lsn": lsn, "commit_time": datetime(2026, 1, 1, tzinfo=UTC),
            "key": as_map(old or new), "before": as_map(old), "after": as_map(new),
            "before_json": as_json(old), "after_json": as_json(new), "unchanged_toast": [],
            "columns": [{"name": n, "type": t, "key": True} for n, t in columns]}


def held(sink: str, path: Path, columns: Columns) -> Counter[str]:
    if sink == "state":
        files = StateFiles.at(str(path), "public.t")
        manifest = files.recover()
        assert manifest is not None
        rows = files.read(list(manifest.files)).to_pylist()
    else:
        rows = [r for r in read_delta(str(path), "public.t").to_pyarrow_table().to_pylist()
                if sink == "delta" or r["_is_current"]]
    return Counter(repr(tuple(r[n] for n, _ in columns)) for r in rows)


ARRAY_FIRST = [("tags", "text[]"), ("n", "integer")]
ARRAY_LAST = [("n", "integer"), ("tags", "text[]")]
FLOAT = [("x", "double precision"), ("y", "integer")]

CASES = {
    "array first": (ARRAY_FIRST, [
        [("INSERT", None, (["a"], 1)), ("INSERT", None, (["a"], 1))],
        [("DELETE", (["a"], 1), None)]], [(["a"], 1)]),
    "cancelling batch": (ARRAY_LAST, [
        [("INSERT", None, (1, ["a"]))],
        [("INSERT", None, (2, ["b"])), ("DELETE", (2, ["b"]), None)]], [(1, ["a"])]),
    "NaN": (FLOAT, [
        [("INSERT", None, (NAN, 1)), ("INSERT", None, (NAN, 1))],
        [("DELETE", (NAN, 1), None)]], [(NAN, 1)]),
    "minus zero": (FLOAT, [
        [("INSERT", None, (-0.0, 1)), ("INSERT", None, (-0.0, 1))],
        [("INSERT", None, (0.0, 1))]], [(-0.0, 1), (-0.0, 1), (0.0, 1)]),
}


@pytest.mark.parametrize("sink", ["state", "delta", "history"])
@pytest.mark.parametrize("case", list(CASES))
def test_equal_rows_are_counted_in_every_sink(sink: str, case: str, tmp_path: Path) -> None:
    columns, batches, expected = CASES[case]
    writer = {"state": TableStateWriter, "delta": DeltaTableWriter,
              "history": HistoryWriter}[sink](str(tmp_path))
    for batch_id, batch in enumerate(batches):
        lsn = 1000 * (batch_id + 1)
        rows = [change(columns, op, seq, lsn, old, new)
                for seq, (op, old, new) in enumerate(batch)]
        writer.apply(None, rows, rows_info("public", "t", rows), batch_id)
    assert held(sink, tmp_path, columns) == Counter(repr(r) for r in expected)
