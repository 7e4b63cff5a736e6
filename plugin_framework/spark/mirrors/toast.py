"""Unchanged TOAST values that a batch's net changes take from the target's rows where
their chain of key changes began (``_fill``, under ``_o_<key>``): in Arrow (``fill_rows``)
or in Spark (``fill_from``), and the policy for those neither the batch nor the target
holds (``report_unknown_toast``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.changes.batch import batch_context
from plugin_framework.spark.columns.descriptions import TableInfo
from plugin_framework.spark.columns.types import column
from plugin_framework.spark.mirrors.keys import counted, key_names, key_tuples, same_keys

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["fill_from", "fill_rows", "no_fills", "report_unknown_toast"]

# The state mirrors' logger, by the name it has always had (docs/spark.md, "Limitations")
log = logging.getLogger("plugin_framework.spark.sinks")


def fill_rows(changes: pa.Table, filled: Sequence[str], info: TableInfo,
              base: pa.Table, texts: pa.Table | None = None) -> pa.Table:
    """``fill_from`` in Arrow: ``net_arrow``'s rows with the columns each lists in ``_fill``
    taken from ``base``'s row (the target's, in the batch's types) under its ``_o_<key>``
    (NULL where there is none, as fill_from's outer join gives: ``report_unknown_toast``,
    with the rows' keys from ``texts``, the rows ``changes`` were typed from)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = key_names(info)
    fills = changes.column("_fill").to_pylist()
    where = {key: j for j, key in enumerate(key_tuples(base, keys))}
    origin_keys = key_tuples(changes, [f"_o_{k}" for k in keys])
    source: list[int | None] = [where.get(origin_keys[i]) if fill else None
                                for i, fill in enumerate(fills)]
    unknown = [i for i, fill in enumerate(fills) if fill and source[i] is None]
    if unknown:
        report_unknown_toast(info, [c for i in unknown for c in fills[i]],
                             key_texts(texts, unknown, keys, len(unknown)))
    out = changes
    for name in filled:
        mask = pa.array([name in (fill or ()) for fill in fills])
        taken = base.column(name).take(pa.array(source, pa.int64())).cast(
            changes.schema.field(name).type)
        position = out.schema.get_field_index(name)
        out = out.set_column(position, name, pc.if_else(mask, taken, out.column(name)))
    return out


def fill_from(changes: Any, filled: Sequence[str], info: TableInfo, base: Any) -> Any:
    """``net_frame``'s rows with their unchanged TOAST values (``_fill``, among ``filled``)
    taken from ``base``'s rows (the target's state, with the batch's column names) under
    ``_o_<key>``."""
    from pyspark.sql import functions as F

    if not filled:
        return changes
    keys = key_names(info)
    source = base.select(*[column(k).alias(f"_s_{k}") for k in keys],
                         *[column(c).alias(f"_v_{c}") for c in filled])
    wanting = changes.filter(F.size("_fill") > 0)
    unknown = wanting.join(source.select(*[f"_s_{k}" for k in keys]),
                           same_keys(keys, "_o_", "_s_"), "left_anti")
    # (a job over keys, in the batches with fills)
    found = unknown.agg(F.count(F.lit(1)).alias("rows"),
                        F.array_distinct(F.flatten(F.collect_list("_fill"))).alias("columns")
                        ).first()
    if found is not None and found["rows"]:  # (an ALTER TABLE's rewrite: the table is read
        # again whole, if it can be: template.py)
        report_unknown_toast(info, found["columns"], [None] * found["rows"])
    out = changes.join(source, same_keys(keys, "_o_", "_s_"), "left")
    for c in filled:
        out = out.withColumn(c, F.when(F.array_contains("_fill", c), column(f"_v_{c}"))
                             .otherwise(column(c)))
    return out.select(*[column(c) for c in changes.columns])


def no_fills(changes: pa.Table, info: TableInfo, texts: pa.Table | None = None) -> pa.Table:
    """``changes`` (net_arrow's, or a history's versions) applied to no rows of the target
    (its first batch, or one that truncates it): the values that its ``_fill`` lists are
    unknown, reported as fill_rows reports them."""
    fills = changes.column("_fill").to_pylist()
    unknown = [i for i, fill in enumerate(fills) if fill]
    if unknown:
        report_unknown_toast(info, [c for i in unknown for c in fills[i]],
                             key_texts(texts, unknown, key_names(info), len(unknown)))
    return changes


def key_texts(texts: pa.Table | None, rows: Sequence[int], keys: Sequence[str],
              count: int) -> list[list[str | None] | None]:
    """The keys, as the stream's text has them, of ``rows`` of ``texts`` (netchange's
    ``put_columns``: each row's text under ``row``); None each where not known."""
    if texts is None:
        return [None] * count
    values = texts.column("row").take(list(rows)).to_pylist()
    return [[dict(row).get(k) for k in keys] if row is not None else None for row in values]


def report_unknown_toast(info: TableInfo, columns: Sequence[str],
                         keys: Sequence[Sequence[str | None] | None]) -> None:
    """The policy for unchanged TOAST values that neither the batch nor the target holds (a
    row the target never had: a mirror started without a snapshot, or a row an incremental
    snapshot has not copied yet): written as NULL, counted (the stream's status line and
    ``pgdecode_unknown_toast_total``), said once per table and batch, and, where the stream
    takes requests (``ForeachBatchStream``, ``pgdecode mirror``) and the table has a key,
    the rows under those keys are read again from the source into a later batch, which
    puts their values in (docs/spark.md, "TOAST values the mirror lacks")."""
    name, rows = info.qualified_name, len(keys)
    context = batch_context()
    known = [list(k) for k in keys if k is not None]
    reread = (context is not None and context.request_snapshot is not None and not counted(info)
              and len(known) == rows)
    if context is not None:
        context.note_unknown_toast(name, rows)
        context.inexact.add(name)
    if reread:
        assert context is not None and context.request_snapshot is not None
        context.request_snapshot(name, known)
    log.warning(
        "%s: %d row(s) of this batch left TOAST values unchanged (%s) that neither the batch "
        "nor the target holds: written as NULL %s", name, rows,
        ", ".join(dict.fromkeys(columns)),
        "until the rows, asked for again, come from the source" if reread else
        "until a change sets them: this stream cannot read rows again (docs/spark.md, "
        "\"TOAST values the mirror lacks\")")
