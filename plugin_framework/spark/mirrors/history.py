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

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.columns.arrowtyped import Decline
from plugin_framework.spark.columns.descriptions import TableInfo
from plugin_framework.spark.columns.tables import typed_values
from plugin_framework.spark.columns.types import column
from plugin_framework.spark.mirrors.delta import DeltaSink, DeltaTarget
from plugin_framework.spark.mirrors.deltatables import keys_match, quote, target_rows, utc_table
from plugin_framework.spark.mirrors.keys import (
    counted,
    first_rows,
    key_names,
    key_tuples,
    same_keys,
)
from plugin_framework.spark.mirrors.staterows import conform
from plugin_framework.spark.mirrors.template import TableBatch
from plugin_framework.spark.mirrors.toast import fill_from, fill_rows, no_fills
from plugin_framework.spark.mirrors.typed import typed_puts
from plugin_framework.spark.mirrors.versions import (
    VERSION_COLUMNS,
    HistoryChanges,
    ended_copies,
    ends_arrow,
    history_changes,
    versions_arrow,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["HistoryWriter"]

# The history mirror's logger, by the name it has always had
log = logging.getLogger("plugin_framework.spark.history")

_CLOSE = "_pgdecode_close"


class HistoryWriter(DeltaSink):
    """``fn(batch_df, batch_id)`` appending each table's versions to its Delta history:
    ``TableSink``'s steps and ``DeltaSink``'s hooks, but the batch's versions written
    (``write``), not its state, and the rows TOAST values come from are the current
    versions (``rows_under``)."""

    def write(self, target: DeltaTarget, rows: Sequence[dict[str, Any]],
              batch: TableBatch) -> None:
        """The batch's versions appended, and the target's versions they end ended, in one
        MERGE; the whole history rewritten after a TRUNCATE or an ALTER TABLE."""
        import pyarrow as pa

        spark, info = batch.spark, batch.info
        changes = history_changes(rows, key_names(info), counted=counted(info))
        table = target.table
        if table is not None and (changes.truncated_at is not None or batch.redescribed):
            self._rewrite(target, batch, changes, self._versions(spark, changes, info))
            return
        try:
            versions, ends = versions_arrow(changes, info), ends_arrow(changes, info)
        except Decline as exc:
            log.debug("%s: typed by Spark (%s)", info.qualified_name, exc)
            versions = self._versions(spark, changes, info).toArrow()
            ends = self._ends(spark, changes, info).toArrow()
        if table is None:
            self.replace(target, batch, no_fills(versions, info, changes.versions).drop_columns(
                ["_fill", *_origins(info)]))
            return
        if counted(info):
            self._merge_counted(target, batch,
                                versions.drop_columns(["_fill", *_origins(info)]), ends)
            return
        if changes.fills:
            wanted = self.wanted_keys(versions, changes.fills, info)
            assert wanted is not None
            versions = fill_rows(versions, changes.fills, info,
                                 self.rows_under(target, batch, wanted, versions),
                                 changes.versions)
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
                     source_alias="s", target_alias="t",
                     commit_properties=self.commit_properties(batch))
         .when_matched_update({**ended, "_is_current": "false"})
         .when_not_matched_insert({quote(n): f"s.{quote(n)}" for n in names},
                                  predicate=f"NOT s.{_CLOSE}")
         .execute())

    def rows_under(self, target: DeltaTarget, batch: TableBatch, keys: pa.ChunkedArray,
                   changes: pa.Table) -> pa.Table:
        """The current versions under ``keys``."""
        assert target.table is not None
        return target_rows(target.table, keys, batch.info, current=True)

    def _merge_counted(self, target: DeltaTarget, batch: TableBatch, versions: pa.Table,
                       ends: pa.Table) -> None:
        """The MERGE of a ``counted`` table's batch: a MERGE cannot end some of equal
        versions, so every current version of a row the batch ends goes, and goes in again,
        ``ended_copies`` of them ended; the batch's versions are appended."""
        import pyarrow as pa

        assert target.table is not None
        info = batch.info
        keys = key_names(info)
        names = [name for name, _, _ in info.columns] + [name for name, _ in VERSION_COLUMNS]
        first = first_rows(ends, keys)  # an end of each row
        current = self.rows_under(target, batch, ends.column(keys[0]), ends)
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
        (target.table.merge(source, f"s.{_CLOSE} AND t._is_current AND {keys_match(info)}",
                            source_alias="s", target_alias="t",
                            commit_properties=self.commit_properties(batch))
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

    def _rewrite(self, target: DeltaTarget, batch: TableBatch, changes: HistoryChanges,
                 versions: Any) -> None:
        """The whole history again: the existing versions under the batch's description,
        those the batch ends ended, the batch's appended."""
        from pyspark.sql import functions as F

        spark, info = batch.spark, batch.info
        existing = spark.createDataFrame(self.every_row(target))
        base = conform(existing, info, batch.renamed, versions.schema, VERSION_COLUMNS,
                       batch.reread)
        if counted(info):  # equal versions: ended in Arrow, as the MERGE's are
            import pyarrow as pa

            out = versions.drop("_fill", *_origins(info)).select(*base.columns).toArrow()
            ended = ended_copies(base.toArrow(), self._ends(spark, changes, info).toArrow(),
                                 info, changes.truncated_at)
            self.replace(target, batch, pa.concat_tables([ended.cast(out.schema), out]))
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
        self.replace(target, batch, ended.select(*out).unionByName(
            versions.drop("_fill", *_origins(info)).select(*out)).toArrow())


def _nullable(table: pa.Table) -> pa.Table:
    import pyarrow as pa

    return table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))


def _origins(info: TableInfo) -> list[str]:
    return [f"_o_{k}" for k in key_names(info)]
