"""Ready-made foreachBatch functions, idempotent by batch id: delivering a batch again
(after a crash, with the same id and rows) leaves the same result as delivering it once.

- ``ChangeLogWriter(path)`` (changelog.py): appends every change to Parquet.
- ``TableSink``: the frame of the sinks that keep each table's current state,
  ``TableStateWriter(path)`` (statefiles.py, Parquet), ``DeltaTableWriter`` (delta.py) and
  ``HistoryWriter`` (history.py).

The helpers the state sinks share (statefiles.py, delta.py, history.py): the batch's rows by
table (``batch_rows``), their net changes typed (``net_arrow``, ``net_frame``), unchanged
TOAST values filled in (``fill_rows`` in Arrow, ``fill_from`` in Spark), a state merged in
Spark (``merge_state``, for ALTER TABLE).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugin_framework.spark.changes.rows import TableRows, batch_rows
from plugin_framework.spark.columns.descriptions import TableInfo, rows_info
from plugin_framework.spark.mirrors.keys import counted, key_names
from plugin_framework.spark.mirrors.queries import OtherQueryError, query_of

__all__ = ["TableSink", "state_path"]

# The state mirrors' logger, by the name it has always had (docs/spark.md, "Limitations")
log = logging.getLogger("plugin_framework.spark.sinks")


def state_path(path: str, table: str) -> str:
    """Where the state sinks under ``path`` keep ``schema.table``."""
    schema, _, name = table.partition(".")
    return "/".join([path.rstrip("/"), schema, name])


class TableSink:
    """The frame of the sinks that keep each table's current state: ``fn(batch_df,
    batch_id)`` collects the batch once, then applies each table's change rows (in
    ``(commit_lsn, seq)`` order) with ``apply``."""

    def __init__(self, path: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None) -> None:
        """``tables``: only these (``schema.table``); ``on_table(table, batch_id)`` is called
        after each table's new state is in place. ``keys``: the primary key of tables
        (``schema.table`` -> its columns; empty: the table has none) whose change rows mark
        every column as the key (REPLICA IDENTITY FULL; a key of every column): they are
        keyed by it, rather than held as a multiset of rows (``counted``). Other tables are
        keyed by their replica identity, as the stream sends it."""
        self.path = path
        self.tables = None if tables is None else set(tables)
        self.on_table = on_table
        self.keys = dict(keys or {})
        self._warned: set[str] = set()
        self.query: str | None = None  # the streaming query of the batch being applied

    def __call__(self, df: Any, batch_id: int) -> None:
        spark = df.sparkSession
        self.query = query_of(df)
        for (schema, table), rows in sorted(batch_rows(df).items()):
            info = self.keyed(rows_info(schema, table, rows))
            if self.tables is not None and info.qualified_name not in self.tables:
                continue
            name = info.qualified_name
            if counted(info) and name not in self.keys and name not in self._warned \
                    and _has_snapshot_rows(rows):
                self._warned.add(name)
                log.warning("%s is keyed by every column and gets snapshot rows: its equal "
                            "rows are counted, and a snapshot taken while the stream runs "
                            "may send a row the stream delivered already, which is then "
                            "counted twice. If the table has a primary key, give it in keys "
                            "(-o keys; pgdecode mirror does); if it has none, say so with "
                            "an empty key", name)
            self.apply(spark, rows, info, batch_id)
            if self.on_table is not None:
                self.on_table(info.qualified_name, batch_id)

    def apply(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
              batch_id: int) -> None:
        raise NotImplementedError

    def held_already(self, table: str, held: int, by: str | None, batch_id: int) -> None:
        """Table ``table`` of the target holds batches up to ``held`` (>= ``batch_id``),
        written by query ``by``: the batch is skipped, if it is of that query. A batch of
        another query (a new checkpoint numbers its batches from 0 again) is refused."""
        if by is None or self.query is None or by == self.query:
            return
        raise OtherQueryError(
            f"{self.path}: {table} holds batches up to {held} of another streaming query "
            f"({by}); this query ({self.query}) numbers its batches from 0 again, so its "
            f"batch {batch_id} would be taken for one the target holds and skipped. Give "
            "this query a target path of its own (or remove the target's table to mirror it "
            "again from this query)")

    def keyed(self, info: TableInfo) -> TableInfo:
        """``info`` with the key ``keys`` gives it, where its rows mark every column. A key
        naming a column the batch's rows do not have (a key added to the table after these
        changes) is not used: the batch is counted, and a warning says so."""
        key = self.keys.get(info.qualified_name)
        if key is None or len(key_names(info)) != len(info.columns):
            return info
        names = [name for name, _, _ in info.columns]
        unknown = [k for k in key if k not in names]
        if unknown:
            log.warning("%s: the key given for it (%s) names %s, which this batch's rows do "
                        "not have (%s): its equal rows are counted instead", info.qualified_name,
                        ", ".join(key), ", ".join(unknown), ", ".join(names))
            return info
        return dataclasses.replace(info, primary=bool(key), columns=tuple(
            (name, pg, not key or name in key) for name, pg, _ in info.columns))


def _has_snapshot_rows(rows: Sequence[dict[str, Any]]) -> bool:
    import pyarrow.compute as pc

    if isinstance(rows, TableRows):
        return bool(pc.any(pc.equal(rows.arrow.column("op"), "SNAPSHOT")).as_py())
    return any(r["op"] == "SNAPSHOT" for r in rows)
