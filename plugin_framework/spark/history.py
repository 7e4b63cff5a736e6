"""``HistoryWriter(path)``: the history of each table (a slowly changing dimension of type
2) as a Delta Lake table at ``path/<schema>/<table>``: one row per version of a row, with
the table's columns, then

- ``_op``: the change that wrote the version (INSERT, UPDATE or SNAPSHOT; the last of its
  transaction);
- ``_valid_from_lsn``, ``_valid_from``: the commit LSN and time of its transaction;
- ``_valid_to_lsn``, ``_valid_to``: those of the transaction that changed, deleted or
  truncated the row next (a key change ends the version under the old key); NULL while
  the version is current;
- ``_is_current``.

A transaction that changes a row several times makes one version, the row as other
transactions saw it after the commit. The table as of a commit LSN ``X``: the rows with
``_valid_from_lsn <= X AND (_valid_to_lsn IS NULL OR _valid_to_lsn > X)``. Unchanged TOAST
values come from the row's previous version (netchange.py follows them through key
changes). Commit times are those of the server's commits, which are not in LSN order for
concurrent transactions: order by the LSNs.

Per batch and table, one Delta commit, idempotent by batch id as ``DeltaTableWriter``'s:
usually a MERGE that ends the current versions of the keys the batch touched and appends
the new versions; after a TRUNCATE or an ALTER TABLE, an overwrite (the whole history is
read into Spark; renamed columns keep their values in every version).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.columns.arrowtyped import Decline, typed_arrays, typed_rows
from plugin_framework.spark.columns.descriptions import TableInfo
from plugin_framework.spark.columns.tables import typed_values
from plugin_framework.spark.columns.types import column
from plugin_framework.spark.delta import (
    DeltaSink,
    Pending,
    delta_arrow,
    fill_arrow,
    keys_match,
    quote,
    target_rows,
    utc_table,
)
from plugin_framework.spark.netchange import (
    Counts,
    Gone,
    Key,
    Put,
    Replay,
    fill_columns,
    put_columns,
    put_schema,
)
from plugin_framework.spark.sinks import (
    conform,
    counted,
    fill_from,
    first_rows,
    key_names,
    key_tuples,
    no_fills,
    same_keys,
    typed_puts,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["HistoryChanges", "HistoryWriter", "ends_arrow", "history_changes",
           "versions_arrow"]

log = logging.getLogger(__name__)

At = tuple[int, datetime]  # a transaction's commit LSN and time

VERSION_COLUMNS = (("_op", "string"), ("_valid_from_lsn", "bigint"),
                   ("_valid_from", "timestamp"), ("_valid_to_lsn", "bigint"),
                   ("_valid_to", "timestamp"), ("_is_current", "boolean"))
_CLOSE = "_pgdecode_close"


@dataclass
class _Version:
    put: Put
    since: At
    until: At | None = None


@dataclass
class HistoryChanges:
    versions: pa.Table  # the versions the batch made (put_columns, op, since, until)
    ends: pa.Table  # the keys whose version in the target ends, when, and how many of
    # their current versions (row, at, copies: 1 but for a counted table's equal rows)
    truncated_at: At | None  # the target's other current versions end here
    fills: list[str] = field(default_factory=list)  # columns some versions take from the target


def history_changes(rows: Sequence[dict[str, Any]], key_columns: Sequence[str], *,
                    counted: bool = False) -> HistoryChanges:
    """The versions one table's change rows of a batch make (dicts of NET_COLUMNS, in
    ``(commit_lsn, seq)`` order), and the target's versions they end. ``counted``: the
    table is keyed by every column and may hold equal rows (``counted_history``)."""
    if counted:
        return counted_history(rows, key_columns)
    replay = Replay(tuple(key_columns))
    versions: list[_Version] = []
    current: dict[Key, _Version] = {}  # the batch's open versions
    ends: dict[Key, tuple[Put | Gone | None, Key, At]] = {}
    truncated_at: At | None = None
    for at, changes in _transactions(rows):
        replay.touched = []
        truncates = False
        for change in changes:
            truncates = truncates or change["op"] == "TRUNCATE"
            replay.apply(change)
        if truncates:
            truncated_at = truncated_at or at
            for version in current.values():
                version.until = at
            current.clear()
        for key in dict.fromkeys(replay.touched):
            entry = replay.state.get(key)  # None: truncated after
            if key not in ends:  # the target's version ends at the first touch (or TRUNCATE)
                ends[key] = (entry, key, truncated_at or at)
            if key in current:
                current.pop(key).until = at
            if isinstance(entry, Put):
                version = _Version(entry, at)
                versions.append(version)
                current[key] = version
    return _history_changes(versions, [(key, None if entry is None else entry.row_json, at, 1)
                                       for entry, key, at in ends.values()],
                            truncated_at, key_columns)


def counted_history(rows: Sequence[dict[str, Any]], key_columns: Sequence[str]
                    ) -> HistoryChanges:
    """``history_changes`` of a table keyed by every column, whose equal rows are counted
    (netchange.Counts): each copy a transaction adds is a version of its own; each copy it
    takes away ends a version of that row, the batch's own first, else ``copies`` of the
    target's current ones (the ends)."""
    versions: list[_Version] = []
    current: dict[Key, list[_Version]] = {}  # the batch's open versions of each row
    ends: list[tuple[Key, str | None, At, int]] = []
    truncated_at: At | None = None
    for at, changes in _transactions(rows):
        counts = Counts(tuple(key_columns))
        for change in changes:
            counts.apply(change)
        if counts.truncated:
            truncated_at = truncated_at or at
            for version in itertools.chain.from_iterable(current.values()):
                version.until = at
            current.clear()
        for key, entry, n in counts.changed():
            if n > 0:
                assert isinstance(entry, Put)
                for _ in range(n):
                    versions.append(_Version(entry, at))
                    current.setdefault(key, []).append(versions[-1])
                continue
            mine = current.get(key, [])
            while n and mine:
                mine.pop(0).until = at
                n += 1
            if n and truncated_at is None:  # after a TRUNCATE the target has none
                ends.append((key, entry.row_json, at, -n))
    return _history_changes(versions, ends, truncated_at, key_columns)


def _transactions(rows: Sequence[dict[str, Any]]
                  ) -> Iterator[tuple[At, list[dict[str, Any]]]]:
    for _, group in itertools.groupby(rows, key=lambda r: int(r["commit_lsn"])):
        changes = list(group)
        yield (int(changes[0]["commit_lsn"]), changes[0]["commit_time"]), changes


def _history_changes(versions: list[_Version], ends: list[tuple[Key, str | None, At, int]],
                     truncated_at: At | None, key_columns: Sequence[str]) -> HistoryChanges:
    """The versions and the ends (key, row_json, at, copies) as HistoryChanges' tables."""
    import pyarrow as pa

    puts = [v.put for v in versions]
    utc = pa.timestamp("us", "UTC")
    table = pa.table({
        **put_columns(puts), "op": [p.op for p in puts],
        "since_lsn": [v.since[0] for v in versions], "since": [v.since[1] for v in versions],
        "until_lsn": [None if v.until is None else v.until[0] for v in versions],
        "until": [None if v.until is None else v.until[1] for v in versions]},
        schema=pa.schema([*put_schema(), ("op", pa.string()), ("since_lsn", pa.int64()),
                          ("since", utc), ("until_lsn", pa.int64()), ("until", utc)]))
    text_map = pa.map_(pa.string(), pa.string())
    end_table = pa.table({
        "row": pa.array([list(zip(key_columns, key, strict=True)) for key, _, _, _ in ends],
                        text_map),
        "row_json": pa.array([row_json for _, row_json, _, _ in ends], pa.string()),
        "at_lsn": pa.array([at[0] for _, _, at, _ in ends], pa.int64()),
        "at": pa.array([at[1] for _, _, at, _ in ends], utc),
        "copies": pa.array([copies for _, _, _, copies in ends], pa.int64())})
    return HistoryChanges(table, end_table, truncated_at, fill_columns(puts))


class HistoryWriter(DeltaSink):
    """``fn(batch_df, batch_id)`` appending each table's versions to its Delta history."""

    def apply(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
              batch_id: int) -> None:
        import pyarrow as pa

        pending = self.pending(rows, info, batch_id)
        if pending is None:
            return  # applied already
        changes = history_changes(rows, key_names(info), counted=counted(info))
        table = pending.table
        if table is not None and (changes.truncated_at is not None or pending.redescribed):
            self._rewrite(spark, pending, changes, info, self._versions(spark, changes, info))
            return
        try:
            versions, ends = versions_arrow(changes, info), ends_arrow(changes, info)
        except Decline as exc:
            log.debug("%s: typed by Spark (%s)", info.qualified_name, exc)
            versions = self._versions(spark, changes, info).toArrow()
            ends = self._ends(spark, changes, info).toArrow()
        if table is None:
            self.overwrite_arrow(pending, no_fills(versions, info).drop_columns(
                ["_fill", *_origins(info)]))
            return
        if counted(info):
            self._merge_counted(pending, versions.drop_columns(["_fill", *_origins(info)]),
                                ends, info)
            return
        if changes.fills:
            versions = fill_arrow(versions, changes.fills, info, table, current=True)
        names = [name for name, _, _ in info.columns] + [name for name, _ in VERSION_COLUMNS]
        versions = versions.drop_columns(["_fill", *_origins(info)])
        # every field nullable: the ends have no values of the versions' columns (Spark's
        # toArrow, the fallback's, declares some columns NOT NULL)
        source = pa.concat_tables(
            [_nullable(t).append_column(_CLOSE, pa.repeat(close, t.num_rows))
             for t, close in ((versions, False), (ends, True))],
            promote_options="default")
        ended = {quote(c): f"s.{quote(c)}" for c in ("_valid_to_lsn", "_valid_to")}
        (table.merge(utc_table(source),
                     f"s.{_CLOSE} AND t._is_current AND {keys_match(info)}",
                     source_alias="s", target_alias="t", commit_properties=pending.commit)
         .when_matched_update({**ended, "_is_current": "false"})
         .when_not_matched_insert({quote(n): f"s.{quote(n)}" for n in names},
                                  predicate=f"NOT s.{_CLOSE}")
         .execute())

    def _merge_counted(self, pending: Pending, versions: pa.Table, ends: pa.Table,
                       info: TableInfo) -> None:
        """The MERGE of a ``counted`` table's batch: a MERGE cannot end some of equal
        versions, so every current version of a row the batch ends goes, and goes in again,
        ``ended_copies`` of them ended; the batch's versions are appended."""
        import pyarrow as pa

        assert pending.table is not None
        keys = key_names(info)
        names = [name for name, _, _ in info.columns] + [name for name, _ in VERSION_COLUMNS]
        first = first_rows(ends, keys)  # an end of each row
        current = target_rows(pending.table, ends.column(keys[0]), info, current=True)
        current = current.filter(pa.array([k in first for k in key_tuples(current, keys)],
                                          pa.bool_()))
        schema = _nullable(utc_table(versions.select(names))).schema
        parts = [(ends.take(pa.array(list(first.values()), pa.int64())).select(keys), True),
                 (ended_copies(current, ends, info, None).select(names), False),
                 (versions.select(names), False)]
        source = pa.concat_tables(
            [utc_table(t).cast(pa.schema([schema.field(n) for n in t.column_names]))
             .append_column(_CLOSE, pa.repeat(close, t.num_rows)) for t, close in parts],
            promote_options="default")
        (pending.table.merge(source, f"s.{_CLOSE} AND t._is_current AND {keys_match(info)}",
                             source_alias="s", target_alias="t",
                             commit_properties=pending.commit)
         .when_matched_delete()
         .when_not_matched_insert({quote(n): f"s.{quote(n)}" for n in names},
                                  predicate=f"NOT s.{_CLOSE}")
         .execute())

    def _versions(self, spark: Any, changes: HistoryChanges, info: TableInfo) -> Any:
        """The batch's versions, typed; ``_fill`` and ``_o_<key>`` for fill_from (the
        reference of versions_arrow)."""
        from pyspark.sql import functions as F

        return typed_puts(
            spark, changes.versions, info, F.col("op").alias("_op"),
            F.col("since_lsn").alias("_valid_from_lsn"),
            F.col("since").cast("timestamp").alias("_valid_from"),
            F.col("until_lsn").alias("_valid_to_lsn"),
            F.col("until").cast("timestamp").alias("_valid_to"),
            F.col("until_lsn").isNull().alias("_is_current"))

    def _ends(self, spark: Any, changes: HistoryChanges, info: TableInfo) -> Any:
        """The keys whose current version in the target ends: key columns, ``_valid_to_lsn``
        and ``_valid_to`` (the reference of ends_arrow)."""
        from pyspark.sql import functions as F

        types = {name: pg for name, pg, _ in info.columns}
        return spark.createDataFrame(changes.ends).select(
            *typed_values(F.col("row"), F.col("row_json"),
                          [(k, types[k]) for k in key_names(info)]),
            F.col("at_lsn").alias("_valid_to_lsn"), F.col("at").cast("timestamp")
            .alias("_valid_to"), F.col("copies").alias("_copies"))

    def _rewrite(self, spark: Any, pending: Pending, changes: HistoryChanges,
                 info: TableInfo, versions: Any) -> None:
        """The whole history again: the existing versions under the batch's description,
        those the batch ends ended, the batch's appended."""
        from pyspark.sql import functions as F

        assert pending.table is not None
        existing = spark.createDataFrame(delta_arrow(pending.table))
        base = conform(existing, info, pending.renamed, versions.schema, VERSION_COLUMNS)
        if counted(info):  # equal versions: ended in Arrow, as the MERGE's are
            import pyarrow as pa

            out = versions.drop("_fill", *_origins(info)).select(*base.columns).toArrow()
            ended = ended_copies(base.toArrow(), self._ends(spark, changes, info).toArrow(),
                                 info, changes.truncated_at)
            self.overwrite_arrow(pending, pa.concat_tables([ended.cast(out.schema), out]))
            return
        keys = key_names(info)
        if changes.fills:
            versions = fill_from(versions, changes.fills, info, base.filter("_is_current"))
        ends = self._ends(spark, changes, info).select(
            *[column(k).alias(f"_e_{k}") for k in keys],
            F.col("_valid_to_lsn").alias("_e_lsn"), F.col("_valid_to").alias("_e_at"))
        joined = base.join(ends, same_keys(keys, "", "_e_") & F.col("_is_current"), "left")
        trunc_lsn, trunc_at = changes.truncated_at or (None, None)
        end_lsn = F.coalesce(F.col("_e_lsn"), F.when(F.col("_is_current"), F.lit(trunc_lsn)))
        end_at = F.coalesce(F.col("_e_at"), F.when(F.col("_is_current"),
                                                   F.lit(trunc_at).cast("timestamp")))
        ended = joined.select(
            *[column(c) for c in base.columns if c not in ("_valid_to_lsn", "_valid_to",
                                                           "_is_current")],
            F.coalesce(F.col("_valid_to_lsn"), end_lsn).alias("_valid_to_lsn"),
            F.coalesce(F.col("_valid_to"), end_at).alias("_valid_to"),
            (F.col("_is_current") & end_lsn.isNull()).alias("_is_current"))
        out = [column(c) for c in base.columns]
        self.overwrite(pending, ended.select(*out).unionByName(
            versions.drop("_fill", *_origins(info)).select(*out)))


def versions_arrow(changes: HistoryChanges, info: TableInfo) -> pa.Table:
    """``HistoryWriter._versions`` typed in Python (arrowtyped.py): raises Decline where
    only Spark's expressions are known to type a value as they do."""
    import pyarrow.compute as pc

    v = changes.versions
    out = typed_rows(v, [(name, pg) for name, pg, _ in info.columns], key_names(info))
    for name, values in (("_op", v.column("op")), ("_valid_from_lsn", v.column("since_lsn")),
                         ("_valid_from", v.column("since")),
                         ("_valid_to_lsn", v.column("until_lsn")),
                         ("_valid_to", v.column("until")),
                         ("_is_current", pc.is_null(v.column("until_lsn")))):
        out = out.append_column(name, values)
    return out


def ends_arrow(changes: HistoryChanges, info: TableInfo) -> pa.Table:
    """``HistoryWriter._ends`` typed in Python (arrowtyped.py)."""
    import pyarrow as pa

    e = changes.ends
    types = {name: pg for name, pg, _ in info.columns}
    keys = key_names(info)
    typed = typed_arrays(e.column("row"), e.column("row_json").to_pylist(),
                         [(k, types[k]) for k in keys])
    return pa.table([*typed, e.column("at_lsn"), e.column("at"), e.column("copies")],
                    names=[*keys, "_valid_to_lsn", "_valid_to", "_copies"])


def ended_copies(rows: pa.Table, ends: pa.Table, info: TableInfo,
                 truncated_at: At | None) -> pa.Table:
    """A ``counted`` table's versions ``rows`` with ``ends`` applied (typed: the row,
    ``_valid_to_lsn``, ``_valid_to``, ``_copies``): each ends that many of the row's current
    versions, the oldest first; then, after a TRUNCATE (``truncated_at``), every version
    still current ends there."""
    import pyarrow as pa

    keys = key_names(info)
    since = rows.column("_valid_from_lsn").to_pylist()
    current = rows.column("_is_current").to_pylist()
    row_keys = key_tuples(rows, keys)
    by_row: dict[tuple[Any, ...], list[int]] = {}  # each row's current versions, oldest first
    for i in sorted(range(rows.num_rows), key=lambda i: (since[i], i)):
        if current[i]:
            by_row.setdefault(row_keys[i], []).append(i)
    until_lsn = rows.column("_valid_to_lsn").to_pylist()
    until = rows.column("_valid_to").to_pylist()
    for key, lsn, at, copies in zip(key_tuples(ends, keys),
                                    ends.column("_valid_to_lsn").to_pylist(),
                                    ends.column("_valid_to").to_pylist(),
                                    ends.column("_copies").to_pylist(), strict=True):
        versions = by_row.get(key, [])
        for i in versions[:copies]:
            until_lsn[i], until[i], current[i] = lsn, at, False
        del versions[:copies]
    if truncated_at is not None:
        for i, now in enumerate(current):
            if now:
                until_lsn[i], until[i], current[i] = truncated_at[0], truncated_at[1], False
    out = rows
    for name, values in (("_valid_to_lsn", until_lsn), ("_valid_to", until),
                         ("_is_current", current)):
        position = out.schema.get_field_index(name)
        out = out.set_column(position, out.schema.field(name),
                             pa.array(values, out.schema.field(name).type))
    return out


def _nullable(table: pa.Table) -> pa.Table:
    import pyarrow as pa

    return table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))


def _origins(info: TableInfo) -> list[str]:
    return [f"_o_{k}" for k in key_names(info)]
