"""The data source's input partitions: a batch's rows travel to the executors inside them
(Arrow IPC), so each stays below Spark's "task of very large size" warning however wide the
rows (a snapshot chunk of wide rows made one warning per batch), and together they are the
batch's rows in order."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin_framework.spark.datasource.reader import PARTITION_BYTES, _partitions, _read_partition


@settings(max_examples=60, deadline=None)
@given(widths=st.lists(st.integers(0, 5000), max_size=300),
       rows_per_partition=st.integers(1, 400), max_bytes=st.integers(1, 200_000))
def test_partitions_hold_the_rows_in_order_within_their_bounds(
        widths: list[int], rows_per_partition: int, max_bytes: int) -> None:
    table = pa.table({"id": pa.array(range(len(widths)), pa.int64()),
                      "doc": pa.array(["x" * w for w in widths], pa.string())})
    parts = _partitions(table, rows_per_partition, max_bytes)
    batches = [b for part in parts for b in _read_partition(part)]
    rows = pa.Table.from_batches(batches, table.schema) if batches else table.slice(0, 0)
    assert rows.equals(table)
    for part in parts:
        read = pa.Table.from_batches(list(_read_partition(part)))
        assert 1 <= read.num_rows <= rows_per_partition
        assert read.num_rows == 1 or read.nbytes <= max_bytes, (read.num_rows, read.nbytes)


def test_a_chunk_of_wide_rows_is_cut_below_sparks_warning() -> None:
    """10,000 rows of 2 kB (a snapshot chunk of a table with wide text): under the default
    50,000 rows a partition, each partition's IPC data stays under 1000 KiB."""
    table = pa.table({"id": pa.array(range(10_000), pa.int64()),
                      "doc": pa.array(["y" * 2000] * 10_000, pa.string())})
    parts = _partitions(table, 50_000)
    assert len(parts) > 1
    assert max(len(p.data) for p in parts) < 1000 << 10
    assert max(len(p.data) for p in parts) <= PARTITION_BYTES + (64 << 10)
