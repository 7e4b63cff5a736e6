"""The template of the mirrors that keep each table's state (``TableSink``), and what it
hands their hooks (``TableBatch``).

For each table of a batch, in one pass, ``TableSink`` runs the steps every mirror shares:

1. the batch's rows of the table (changes/rows.py), keyed (``keys``: tables keyed by every
   column), for the tables asked for;
2. the target as it is (``open``): a batch it holds already is skipped (``applied``; another
   query's is refused), and the rows are renamed to the batch's newest description, matched
   with the one the target was written under (``stored_description``, columns/
   descriptions.py);
3. ``write``: the net changes (netchange.py), typed (typed.py); if the target has no rows
   (``holds_rows``) or the batch truncates it, the state is their rows put (``replace``); if
   the description changed (``redescribed``), every row of the target (``every_row``) is
   rewritten with them in Spark (``replace``); else the target's rows under the keys needed
   (``rows_under``) give the unchanged TOAST values (toast.py), and the changes are committed
   (``merge``).

A mirror implements only the hooks: how it reads what its target holds and how it commits
(``TableStateWriter``, parquet.py; ``DeltaTableWriter``, delta.py). ``HistoryWriter``
(history.py) writes versions, not a state, with its own ``write`` over the same hooks;
``MergeIntoWriter`` (mergeinto.py) keeps no batch ids and no description in its target,
and its ``write`` stages the net changes before its SQL statements.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from plugin_framework.spark.changes.batch import batch_context
from plugin_framework.spark.changes.rows import TableRows, batch_rows
from plugin_framework.spark.columns.descriptions import (
    Description,
    TableInfo,
    describe_rows,
    described,
    only_drops,
    rows_info,
)
from plugin_framework.spark.mirrors.keys import counted, key_names
from plugin_framework.spark.mirrors.queries import OtherQueryError, query_of
from plugin_framework.spark.mirrors.staterows import merge_state, state_rows
from plugin_framework.spark.mirrors.toast import fill_rows, no_fills
from plugin_framework.spark.mirrors.typed import net_arrow, net_of

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["TableBatch", "TableSink", "state_path"]

# The state mirrors' logger, by the name it has always had (docs/spark.md, "Limitations")
log = logging.getLogger("plugin_framework.spark.sinks")


def state_path(path: str, table: str) -> str:
    """Where the state sinks under ``path`` keep ``schema.table``."""
    schema, _, name = table.partition(".")
    return "/".join([path.rstrip("/"), schema, name])


@dataclass(frozen=True)
class TableBatch:
    """One table's part of a batch, as ``TableSink.apply`` hands it to the mirror's hooks."""

    spark: Any
    info: TableInfo
    batch_id: int
    description: Description  # the table's newest description in the batch
    renamed: dict[str, str | None] | None  # the stored description's columns -> its names
    redescribed: bool  # the target's rows are rewritten under it (an ALTER TABLE)
    # the table is read again from the source (an ALTER TABLE whose values the target cannot
    # carry over exactly): until then the rewrite may leave values NULL (``apply``)
    reread: bool = False


class TableSink:
    """The template of the mirrors that keep each table's state: ``fn(batch_df, batch_id)``
    collects the batch once, then applies each table's change rows (in ``(commit_lsn,
    seq)`` order) with ``apply``, which runs the steps every such mirror takes and calls the
    mirror's hooks (see the module's text) for what differs."""

    def __init__(self, path: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None,
                 no_reread: Sequence[str] = ()) -> None:
        """``tables``: only these (``schema.table``); ``on_table(table, batch_id)`` is called
        after each table's new state is in place. ``keys``: the primary key of tables
        (``schema.table`` -> its columns; empty: the table has none) whose change rows mark
        every column as the key (REPLICA IDENTITY FULL; a key of every column): they are
        keyed by it, rather than held as a multiset of rows (``counted``). Other tables are
        keyed by their replica identity, as the stream sends it. ``no_reread``: tables
        (``schema.table``) not read again after an ALTER TABLE (huge ones): the documented
        policy applies to them instead (``apply``)."""
        self.path = path
        self.no_reread = {t if "." in t else f"public.{t}" for t in no_reread}
        self.tables = None if tables is None else set(tables)
        self.on_table = on_table
        self.keys = dict(keys or {})
        self._warned: set[str] = set()
        self._warned_alter: set[str] = set()
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

    # --- the template ------------------------------------------------------------------------

    def apply(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
              batch_id: int) -> None:
        """One table's change rows of the batch into its target, unless it has the batch
        already; the rows are renamed to the batch's newest description first."""
        target = self.open(info)
        held = self.applied(target, batch_id)
        if held is not None:
            self.held_already(info.qualified_name, held[0], held[1], batch_id)
            return  # applied already
        stored = self.stored_description(target)
        reread = self.reread(info, rows, stored)
        description, renamed = describe_rows(info.qualified_name, rows, stored, not reread)
        self.write(target, rows, TableBatch(spark, info, batch_id, description, renamed,
                                            self.redescribed(target, stored, description),
                                            reread))

    def reread(self, info: TableInfo, rows: Sequence[dict[str, Any]],
               stored: Description | None) -> bool:
        """Whether the table is read again from the source, asked now (before the target
        changes: the request is durable), because its description changed since the target
        was written in a way the target's values cannot follow exactly: an added column
        (it may have a default the stream never sent), a type change (the server converts
        its own way), a rename or a drop and add at one place (pgoutput cannot tell them
        apart). Only dropped columns carry over exactly. A table without a key, one in
        ``no_reread``, or a stream that takes no requests (Spark's own foreachBatch) is
        not read again: added columns stay NULL in older rows until they change, a rename
        is guessed, a type change is cast where each value casts back exactly, else
        refused; said once per table."""
        if stored is None:
            return False
        _, chain = described(rows, stored)
        if only_drops(chain):
            return False
        name = info.qualified_name
        context = batch_context()
        if context is not None:
            context.inexact.add(name)
        if context is None or context.request_snapshot is None or counted(info) \
                or name in self.no_reread:
            if name not in self._warned_alter:
                self._warned_alter.add(name)
                why = ("it has no key" if counted(info) else "it is in no_reread"
                       if name in self.no_reread else "this stream cannot read tables again")
                log.warning("%s: its description changed (ALTER TABLE) and the mirror is not "
                            "read again (%s): columns added are NULL in older rows until they "
                            "change, a rename is guessed by place and type (docs/spark.md, "
                            "\"ALTER TABLE\")", name, why)
            return False
        log.info("%s: its description changed (ALTER TABLE): the table is read again from "
                 "the source, so that the mirror holds the server's own values", name)
        context.request_snapshot(name, None)
        return True

    def write(self, target: Any, rows: Sequence[dict[str, Any]], batch: TableBatch) -> None:
        """The state's steps: the batch's net changes, typed; where the target has no rows
        before them (or they begin with a TRUNCATE) the state is their rows put; after an
        ALTER TABLE it is the target's rows under the new description with the changes
        applied, in Spark; else the changes take their unchanged TOAST values from the
        target's rows and are merged into it. HistoryWriter (versions, not a state) and
        MergeIntoWriter (its net changes staged, then SQL) write their own way."""
        spark, info = batch.spark, batch.info
        net = net_of(rows, info)
        if not self.holds_rows(target) or net.truncated:  # no rows before the batch's: its puts
            self.replace(target, batch,
                         state_rows(no_fills(net_arrow(spark, net, info), info, net.table),
                                    info))
            return
        if batch.redescribed:  # ALTER TABLE: every row under the new description
            existing = spark.createDataFrame(self.every_row(target))
            self.replace(target, batch,
                         merge_state(spark, net, info, existing, batch.renamed,
                                     batch.reread).toArrow())
            return
        changes = net_arrow(spark, net, info)
        wanted = self.wanted_keys(changes, net.fills, info)
        base = None if wanted is None else self.rows_under(target, batch, wanted, changes)
        if net.fills:
            assert base is not None
            changes = fill_rows(changes, net.fills, info, base, net.table)
        self.merge(target, batch, changes, base)

    def wanted_keys(self, changes: pa.Table, fills: Sequence[str],
                    info: TableInfo) -> pa.ChunkedArray | None:
        """The first key column's values of the target's rows that the batch's typed
        ``changes`` need: the keys they touch and the origins of their unchanged TOAST
        values where the mirror rewrites what it reads (``rewrites_touched``) or counts
        equal rows; else the origins of the rows that take values from the target (None:
        no row of the target is needed)."""
        first = key_names(info)[0]
        if self.rewrites_touched or counted(info):
            wanted = changes.column(first)
            return _concat(wanted, changes.column(f"_o_{first}")) if fills else wanted
        if not fills:
            return None
        wanting = [i for i, fill in enumerate(changes.column("_fill").to_pylist()) if fill]
        return changes.column(f"_o_{first}").take(wanting)

    def consistent_lsn(self, info: TableInfo) -> int | None:
        """What a mirror records with its commit of the table: the WAL position as of which
        the target then equals the source's table (changes/batch.py; None: not known to,
        as under Spark's own foreachBatch)."""
        context = batch_context()
        return None if context is None else context.consistent_for(info.qualified_name)

    # --- the hooks: how a mirror reads what its target holds, and how it commits -------------

    rewrites_touched: ClassVar[bool] = False
    """Whether ``merge`` rewrites the target's rows under every key the batch touches, so
    that ``rows_under`` is asked for them all (not only for those TOAST values come from)."""

    def open(self, info: TableInfo) -> Any:
        """The table's target as it is before the batch: what the other hooks are given."""
        raise NotImplementedError

    def applied(self, target: Any, batch_id: int) -> tuple[int, str | None] | None:
        """If the target has batch ``batch_id`` already: the batch it holds up to, and the
        streaming query that wrote it (None: not recorded); else None."""
        raise NotImplementedError

    def stored_description(self, target: Any) -> Description | None:
        """The description the target's rows were written under (None: none known)."""
        raise NotImplementedError

    def redescribed(self, target: Any, stored: Description | None,
                    description: Description) -> bool:
        """Whether the target's rows are rewritten under the batch's ``description``
        (an ALTER TABLE since ``stored``); a target whose description is not known is not."""
        return stored is not None and stored != description

    def holds_rows(self, target: Any) -> bool:
        """Whether the target has been written (else the batch's rows are all of it)."""
        raise NotImplementedError

    def every_row(self, target: Any) -> pa.Table:
        """Every row of the target (for an ALTER TABLE's rewrite)."""
        raise NotImplementedError

    def rows_under(self, target: Any, batch: TableBatch, keys: pa.ChunkedArray,
                   changes: pa.Table) -> pa.Table:
        """The target's rows whose first key column is among ``keys`` (more rows will do),
        for ``changes`` (the batch's typed rows) to take their unchanged TOAST values from
        and, for ``merge``, to change."""
        raise NotImplementedError

    def replace(self, target: Any, batch: TableBatch, rows: pa.Table) -> None:
        """Commit ``rows`` (typed, with ``_commit_lsn`` and ``_lsn``) as all of the target's
        rows, its columns the batch's."""
        raise NotImplementedError

    def merge(self, target: Any, batch: TableBatch, changes: pa.Table,
              base: pa.Table | None) -> None:
        """Commit the batch's typed net changes (``net_arrow``'s columns, their TOAST values
        filled in): each key's row put or deleted (a counted table: ``_copies`` of it added
        or taken away); ``base``: what ``rows_under`` gave (None: not asked)."""
        raise NotImplementedError


def _has_snapshot_rows(rows: Sequence[dict[str, Any]]) -> bool:
    import pyarrow.compute as pc

    if isinstance(rows, TableRows):
        return bool(pc.any(pc.equal(rows.arrow.column("op"), "SNAPSHOT")).as_py())
    return any(r["op"] == "SNAPSHOT" for r in rows)


def _concat(*arrays: pa.ChunkedArray) -> pa.ChunkedArray:
    import pyarrow as pa

    return pa.chunked_array([c for a in arrays for c in a.chunks], arrays[0].type)
