"""The mirror as Spark SQL statements, for tables of the session's own catalogs (Delta Lake or
Iceberg tables, with their jars on the cluster): ``MergeIntoWriter`` runs, per table and
batch, one ``MERGE INTO`` of the batch's net changes (``merge_sql`` prints it), or one
``INSERT OVERWRITE`` when the batch truncates the table.

The net changes are the other sinks' (netchange.py): each key the batch touched once, with
its final row or its deletion, old keys of key changes deleted, unchanged TOAST values taken
from the batch or from the target's row where the key's chain of changes began. A MERGE of
final rows gives the same table however often it runs; only the TOAST values read from the
target would differ when it runs again (the rows they came from may have moved). So each
table's net changes are staged first, once per batch, as a Parquet file under ``staging``
(with the target's values in them), and a batch delivered again after a crash merges the
staged rows again: the same statement on the same rows.

Limits (docs/spark.md, "MERGE INTO"): a table needs a key (a replica identity, or ``keys``
for a REPLICA IDENTITY FULL table); the target's columns must be the table's newest columns
then ``_commit_lsn`` and ``_lsn`` (an ALTER TABLE of the source is refused with the ALTER
TABLE statements the target needs).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from plugin_framework.spark.schemas import SchemaChangeError, describe_rows
from plugin_framework.spark.sinks import (
    TableSink,
    counted,
    fill_from,
    key_names,
    net_arrow,
    net_of,
    no_fills,
)
from plugin_framework.spark.tables import TableInfo

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

__all__ = ["MergeIntoWriter", "merge_sql", "overwrite_sql"]

log = logging.getLogger("pgdecode.spark.sinks")

DELETED = "_deleted"  # the staged rows' flag: the key goes
EXTRA = ("_commit_lsn", "_lsn")  # the columns the target has after the table's own
_STAGED_META = b"pgdecode.staged"


def ident(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def merge_sql(target: str, source: str, columns: Sequence[str], keys: Sequence[str]) -> str:
    """The MERGE INTO of a table's staged net changes (view or table ``source``: the
    ``columns``, then ``_deleted``) into ``target``, matched on ``keys``."""
    on = " AND ".join(f"t.{ident(k)} <=> s.{ident(k)}" for k in keys)
    sets = ", ".join(f"t.{ident(c)} = s.{ident(c)}" for c in columns)
    names = ", ".join(ident(c) for c in columns)
    values = ", ".join(f"s.{ident(c)}" for c in columns)
    return (f"MERGE INTO {target} AS t\n"
            f"USING {source} AS s\n"
            f"ON {on}\n"
            f"WHEN MATCHED AND s.{DELETED} THEN DELETE\n"
            f"WHEN MATCHED THEN UPDATE SET {sets}\n"
            f"WHEN NOT MATCHED AND NOT s.{DELETED} THEN INSERT ({names}) VALUES ({values})")


def overwrite_sql(target: str, source: str, columns: Sequence[str]) -> str:
    """The statement of a batch that truncates the table: its rows after the TRUNCATE, in
    place of all the target's."""
    names = ", ".join(ident(c) for c in columns)
    return f"INSERT OVERWRITE {target} ({names})\nSELECT {names} FROM {source} WHERE NOT {DELETED}"


class MergeIntoWriter(TableSink):
    """``fn(batch_df, batch_id)`` applying each table's net changes of the batch to
    ``target.format(schema=..., table=...)``, a table of the Spark session's catalogs, with
    Spark SQL (``merge_sql``, ``overwrite_sql``).

    ``staging``: a directory (local, or a pyarrow file system URI; ``filesystem=``) where
    each table's net changes of the batch are kept until the next batch, so that a batch
    delivered again merges the same rows. ``create``: the clause that ends the CREATE TABLE
    of a target that does not exist (``"USING delta"``, ``"USING iceberg"``); None: such a
    target is an error that prints the statement. ``tables``, ``on_table``, ``keys``: as
    ``TableSink``'s."""

    def __init__(self, target: str, staging: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None, create: str | None = None,
                 filesystem: pafs.FileSystem | None = None) -> None:
        import pyarrow.fs as pafs

        if "{table}" not in target:
            raise ValueError(f"target {target!r} must name each table: put {{table}} (and "
                             "{schema}) in it, as in 'lake.{schema}_{table}'")
        super().__init__(staging, tables, on_table, keys=keys)
        self.target = target
        self.create = create
        if filesystem is None:
            filesystem, staging = pafs.FileSystem.from_uri(_uri(staging))
        self.filesystem = filesystem
        self.staging = staging.rstrip("/")

    def target_of(self, info: TableInfo) -> str:
        return self.target.format(schema=ident(info.schema)[1:-1],
                                  table=ident(info.table)[1:-1])

    def apply(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
              batch_id: int) -> None:
        name = info.qualified_name
        if counted(info):
            raise ValueError(
                f"{name} has no key a MERGE could match rows on (REPLICA IDENTITY FULL or "
                f"none): give its primary key in keys={{{name!r}: [...]}}, or mirror it with "
                "TableStateWriter or DeltaTableWriter, which count equal rows")
        target = self.target_of(info)
        describe_rows(name, rows, None)  # the rows under the batch's newest column names
        columns = [n for n, _, _ in info.columns]
        fingerprint = _fingerprint(rows, self.query)
        staged = self._staged(info, batch_id, fingerprint)
        if staged is None:
            staged = self._stage(spark, rows, info, batch_id, target, columns, fingerprint)
        else:
            self._check_target(spark, target, info, staged)
        source = spark.createDataFrame(staged)
        view = _view_name(info, batch_id)
        source.createOrReplaceTempView(view)
        try:
            truncated = orjson.loads((staged.schema.metadata or {})[_STAGED_META])["truncated"]
            statement = (overwrite_sql(target, view, [*columns, *EXTRA]) if truncated
                         else merge_sql(target, view, [*columns, *EXTRA], key_names(info)))
            spark.sql(statement)
        finally:
            spark.catalog.dropTempView(view)
        self._forget_before(info, batch_id)

    # -- staging

    def _dir(self, info: TableInfo) -> str:
        return f"{self.staging}/{info.schema}/{info.table}"

    def _staged(self, info: TableInfo, batch_id: int, fingerprint: dict[str, Any]
                ) -> pa.Table | None:
        """The staged net changes of this batch, if they are of these rows."""
        import pyarrow.parquet as pq

        path = f"{self._dir(info)}/batch-{batch_id}.parquet"
        try:
            table = pq.read_table(path, filesystem=self.filesystem)
        except FileNotFoundError:
            return None
        meta = orjson.loads((table.schema.metadata or {}).get(_STAGED_META, b"{}"))
        if meta.get("rows") != fingerprint:
            log.warning("%s: the staged net changes of batch %d are of other rows (another "
                        "query's batch of that id, or a batch that was not delivered again "
                        "as it was): staged again", info.qualified_name, batch_id)
            return None
        return table

    def _stage(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
               batch_id: int, target: str, columns: list[str],
               fingerprint: dict[str, Any]) -> pa.Table:
        """The table's net changes of the batch, with the target's values of unchanged
        TOAST columns, written to the staging directory (then renamed into place)."""
        import pyarrow.parquet as pq

        net = net_of(rows, info)
        changes = net_arrow(spark, net, info)
        self._check_target(spark, target, info, changes.select([*columns, *EXTRA, DELETED]))
        if net.truncated:
            changes = no_fills(changes, info)
        elif net.fills:
            filled = fill_from(spark.createDataFrame(changes), net.fills, info,
                               spark.table(target))
            changes = filled.toArrow().cast(changes.schema)
        meta = {"rows": fingerprint, "truncated": net.truncated}
        staged = changes.select([*columns, *EXTRA, DELETED]).replace_schema_metadata(
            {_STAGED_META: orjson.dumps(meta)})
        folder = self._dir(info)
        self.filesystem.create_dir(folder, recursive=True)
        path = f"{folder}/batch-{batch_id}.parquet"
        pq.write_table(staged, path + ".tmp", filesystem=self.filesystem)
        self.filesystem.move(path + ".tmp", path)
        return staged

    def _forget_before(self, info: TableInfo, batch_id: int) -> None:
        """Staged net changes of batches before this one (finished: batches go in order)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._dir(info), allow_not_found=True)
        for entry in self.filesystem.get_file_info(selector):
            found = re.fullmatch(r"batch-(\d+)\.parquet(\.tmp)?", entry.base_name)
            if found and int(found.group(1)) < batch_id:
                self.filesystem.delete_file(entry.path)

    # -- the target

    def _check_target(self, spark: Any, target: str, info: TableInfo, rows: pa.Table) -> None:
        """The target exists (created with ``create``) and has the columns of ``rows`` (the
        staged net changes: the table's, ``EXTRA`` and ``_deleted``), in any order; else a
        SchemaChangeError with the statements it needs."""
        wanted = [f for f in spark.createDataFrame(rows.slice(0, 0)).schema.fields
                  if f.name != DELETED]
        if not spark.catalog.tableExists(target):
            statement = (f"CREATE TABLE {target} ("
                         + ", ".join(f"{ident(f.name)} {f.dataType.simpleString()}"
                                     for f in wanted) + ")")
            if self.create is None:
                raise SchemaChangeError(
                    f"{info.qualified_name}: the target {target} does not exist. Create it "
                    f"(add your table format's clause, such as USING delta), or give "
                    f"create=\"USING ...\" to create it:\n{statement}")
            spark.sql(f"{statement} {self.create}")
            return
        have = set(spark.table(target).columns)
        missing = [f for f in wanted if f.name not in have]
        extra = sorted(have - {f.name for f in wanted})
        if missing or extra:
            fixes = [f"ALTER TABLE {target} ADD COLUMNS ("
                     + ", ".join(f"{ident(f.name)} {f.dataType.simpleString()}"
                                 for f in missing) + ")"] if missing else []
            fixes += [f"ALTER TABLE {target} DROP COLUMN {ident(c)}" for c in extra]
            raise SchemaChangeError(
                f"{info.qualified_name}: the target {target} has not the table's columns "
                f"(missing: {', '.join(f.name for f in missing) or 'none'}; not in the "
                f"table: {', '.join(extra) or 'none'}). Change it to match, then start "
                "again (the batch is delivered again); a column renamed at the source keeps "
                "its values with ALTER TABLE ... RENAME COLUMN old TO new instead of the DROP "
                "and ADD:\n" + ";\n".join(fixes))


def _fingerprint(rows: Sequence[dict[str, Any]], query: str | None) -> dict[str, Any]:
    """What tells a table's rows of one batch from another's: their number and LSN range
    (a batch delivered again has the same transactions), and the query."""
    from plugin_framework.spark.netchange import TableRows

    if isinstance(rows, TableRows):
        import pyarrow.compute as pc

        lsns = pc.min_max(rows.arrow.column("lsn")).as_py()
        low, high = lsns["min"], lsns["max"]
        commit = pc.max(rows.arrow.column("commit_lsn")).as_py()
    else:
        low = min(r["lsn"] for r in rows)
        high = max(r["lsn"] for r in rows)
        commit = max(r["commit_lsn"] for r in rows)
    return {"count": len(rows), "lsn": [low, high], "commit_lsn": commit, "query": query}


def _view_name(info: TableInfo, batch_id: int) -> str:
    return re.sub(r"\W", "_", f"pgdecode_net_{info.schema}_{info.table}_{batch_id}")


def _uri(path: str) -> str:
    """A local path as pyarrow's FileSystem.from_uri takes it."""
    import os

    return path if "://" in path else os.path.abspath(path)
