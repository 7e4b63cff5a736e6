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
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from plugin_framework.spark.columns.descriptions import SchemaChangeError, TableInfo
from plugin_framework.spark.columns.types import column, ident, spark_type
from plugin_framework.spark.mirrors.keys import counted, key_names, key_tuples
from plugin_framework.spark.mirrors.mergesql import DELETED, merge_sql, overwrite_sql, target_name
from plugin_framework.spark.mirrors.template import TableBatch, TableSink
from plugin_framework.spark.mirrors.toast import fill_rows, no_fills
from plugin_framework.spark.mirrors.typed import net_arrow, net_of

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

__all__ = ["MergeIntoWriter"]

log = logging.getLogger("pgdecode.spark.sinks")

EXTRA = ("_commit_lsn", "_lsn")  # the columns the target has after the table's own
_STAGED_META = b"pgdecode.staged"
_OVERWRITE_MODE = "spark.sql.sources.partitionOverwriteMode"


class MergeIntoWriter(TableSink):
    """``fn(batch_df, batch_id)`` applying each table's net changes of the batch to its
    target, ``target_name(target, schema, table)`` (``target`` as ``lake.{schema}.{table}``),
    a table of the Spark session's catalogs, with Spark SQL (``merge_sql``,
    ``overwrite_sql``).

    ``staging``: a directory (local, or a pyarrow file system URI; ``filesystem=``) where
    each table's net changes of the batch are kept until the next batch, so that a batch
    delivered again merges the same rows. ``create``: the clause that ends the CREATE TABLE
    of a target that does not exist (``"USING delta"``, ``"USING iceberg"``); None: such a
    target is an error that prints the statement. ``tables``, ``on_table``, ``keys``: as
    ``TableSink``'s."""

    def __init__(self, target: str, staging: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None,
                 no_reread: Sequence[str] = (), create: str | None = None,
                 filesystem: pafs.FileSystem | None = None) -> None:
        import pyarrow.fs as pafs

        if "{table}" not in target:
            raise ValueError(f"target {target!r} must name each table: put {{table}} (and "
                             "{schema}) in it, as in 'lake.{schema}.{table}'")
        try:
            target_name(target, "s", "t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"target {target!r}: only {{schema}} and {{table}} are replaced "
                             f"({exc!r})") from None
        super().__init__(staging, tables, on_table, keys=keys, no_reread=no_reread)
        self._targets: dict[str, str] = {}  # a target, case-folded -> the table it holds
        self.target = target
        self.create = create
        if filesystem is None:
            filesystem, staging = pafs.FileSystem.from_uri(_uri(staging))
        self.filesystem = filesystem
        self.staging = staging.rstrip("/")

    def target_of(self, info: TableInfo) -> str:
        """The table's target; two tables going to one target (catalogs may fold case) are
        refused."""
        target = target_name(self.target, info.schema, info.table)
        held = self._targets.setdefault(target.casefold(), info.qualified_name)
        if held != info.qualified_name:
            raise ValueError(f"{held} and {info.qualified_name} would both go to {target}: "
                             "give each its own target (put {schema} and {table} in "
                             f"{self.target!r})")
        return target

    # -- TableSink's hooks: the target keeps no batch ids and no description

    def open(self, info: TableInfo) -> str:
        """The table's target (``target_of``); a table without a key is refused."""
        name = info.qualified_name
        if counted(info):
            given = self.keys.get(name)
            raise ValueError(
                f"{name} has no key a MERGE could match rows on (REPLICA IDENTITY FULL or "
                + (f"none): the key given for it ({', '.join(given)}) names columns this "
                   "batch's rows do not have (see the warning before)" if given else
                   f"none): give its primary key in keys={{{name!r}: [...]}}")
                + ", or mirror it with TableStateWriter or DeltaTableWriter, which count "
                "equal rows")
        return self.target_of(info)

    def applied(self, target: str, batch_id: int) -> None:
        """None: every batch is applied (a batch delivered again merges its staged rows
        again, the same statement on the same rows)."""
        return None

    def stored_description(self, target: str) -> None:
        """None: the batch's rows are renamed to its newest description, and the target's
        columns are checked against it (``_check_target``) rather than rewritten."""
        return None

    def write(self, target: str, rows: Sequence[dict[str, Any]], batch: TableBatch) -> None:
        """The table's net changes of the batch staged (once per batch, with the target's
        TOAST values), then merged with one MERGE INTO, or one INSERT OVERWRITE where the
        batch truncates the table."""
        spark, info, batch_id = batch.spark, batch.info, batch.batch_id
        columns = [n for n, _, _ in info.columns]
        schema = _spark_schema(info)
        self._check_target(spark, target, info, schema)
        fingerprint = _fingerprint(rows, self.query)
        staged = self._staged(info, batch_id, fingerprint)
        if staged is None:
            staged = self._stage(spark, rows, info, batch_id, target, columns, fingerprint)
        source = spark.createDataFrame(staged, schema)
        view = _view_name(info, batch_id)
        source.createOrReplaceTempView(view)
        try:
            truncated = orjson.loads((staged.schema.metadata or {})[_STAGED_META])["truncated"]
            if truncated:
                _static_overwrite(spark, overwrite_sql(target, view, [*columns, *EXTRA]))
            else:
                spark.sql(merge_sql(target, view, [*columns, *EXTRA], key_names(info)))
        finally:
            spark.catalog.dropTempView(view)
        self._forget_before(info, batch_id)

    # -- staging

    def _dir(self, info: TableInfo) -> str:
        """The table's staging directory (its names percent-encoded: any name is one
        directory of its own)."""
        return "/".join([self.staging, *(urllib.parse.quote(n, safe="")
                                         for n in (info.schema, info.table))])

    def _staged(self, info: TableInfo, batch_id: int, fingerprint: dict[str, Any]
                ) -> pa.Table | None:
        """The staged net changes of this batch, if they are of these rows; None if there
        are none, or they are another query's. The same query's batch with other rows
        cannot be merged safely: refused."""
        import pyarrow.parquet as pq

        path = f"{self._dir(info)}/batch-{batch_id}.parquet"
        try:
            table = pq.read_table(path, filesystem=self.filesystem)
        except FileNotFoundError:
            return None
        meta = orjson.loads((table.schema.metadata or {}).get(_STAGED_META, b"{}"))
        if meta.get("rows") == fingerprint:
            return table
        if (meta.get("rows") or {}).get("query") != fingerprint["query"]:
            log.warning("%s: batch %d was staged by another query (%s): staged again for "
                        "this one", info.qualified_name, batch_id,
                        (meta.get("rows") or {}).get("query"))
            return None
        raise RuntimeError(
            f"{info.qualified_name}: batch {batch_id} is delivered again with other rows "
            f"({fingerprint}) than it was staged with ({meta.get('rows')}), and may have been "
            "merged already: its unchanged TOAST values cannot be taken from the target "
            f"again. Delete {path} to stage it from the target as it is now (values that are "
            "no longer there are then NULL, with a warning), or mirror the table again")

    def _stage(self, spark: Any, rows: Sequence[dict[str, Any]], info: TableInfo,
               batch_id: int, target: str, columns: list[str],
               fingerprint: dict[str, Any]) -> pa.Table:
        """The table's net changes of the batch, with the target's values of unchanged
        TOAST columns, written to the staging directory (then renamed into place)."""
        import pyarrow.parquet as pq

        net = net_of(rows, info)
        changes = net_arrow(spark, net, info)
        if net.truncated:
            changes = no_fills(changes, info, net.table)
        elif net.fills:
            changes = fill_rows(changes, net.fills, info,
                                _target_rows(spark, target, info, changes, net.fills), net.table)
        meta = {"rows": fingerprint, "truncated": net.truncated}
        staged = _one_row_per_key(changes.select([*columns, *EXTRA, DELETED]),
                                  key_names(info)).replace_schema_metadata(
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

    def _check_target(self, spark: Any, target: str, info: TableInfo, schema: Any) -> None:
        """The target exists (created with ``create``) and has the columns of ``schema``
        (the staged net changes': the table's, ``EXTRA`` and ``_deleted``) with their
        types, in any order; else a SchemaChangeError with the statements it needs."""
        wanted = [f for f in schema.fields if f.name != DELETED]
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
        have = {f.name: f.dataType for f in spark.table(target).schema.fields}
        missing = [f for f in wanted if f.name not in have]
        retyped = [f for f in wanted if f.name in have and not _holds(have[f.name], f.dataType)]
        extra = sorted(set(have) - {f.name for f in wanted})
        if not (missing or retyped or extra):
            return
        fixes = [f"ALTER TABLE {target} ADD COLUMNS ("
                 + ", ".join(f"{ident(f.name)} {f.dataType.simpleString()}" for f in missing)
                 + ")"] if missing else []
        fixes += [f"ALTER TABLE {target} ALTER COLUMN {ident(f.name)} TYPE "
                  f"{f.dataType.simpleString()}" for f in retyped]
        fixes += [f"ALTER TABLE {target} DROP COLUMN {ident(c)}" for c in extra]
        raise SchemaChangeError(
            f"{info.qualified_name}: the target {target} has not the table's columns "
            f"(missing: {', '.join(f.name for f in missing) or 'none'}; of another type: "
            + (", ".join(f"{f.name} ({have[f.name].simpleString()}, not "
                         f"{f.dataType.simpleString()})" for f in retyped) or "none")
            + f"; not in the table: {', '.join(extra) or 'none'}). Change it to match, then "
            "start again (the batch is delivered again). A column renamed at the source "
            "keeps its values with ALTER TABLE ... RENAME COLUMN old TO new instead of the "
            "DROP and ADD; on Delta tables, DROP and RENAME COLUMN need column mapping "
            "('delta.columnMapping.mode' = 'name'), and a type can change only where the "
            "format widens it (else mirror the table again):\n" + ";\n".join(fixes))


def _holds(have: Any, want: Any) -> bool:
    """Whether a target column of Spark type ``have`` holds every value of type ``want``
    as it is: the same type, or a wider one of its kind (Iceberg keeps a smallint as an
    int, a real may be kept as a double, a decimal with more digits on either side)."""
    from pyspark.sql import types as T

    if have == want:
        return True
    integers = [T.ByteType, T.ShortType, T.IntegerType, T.LongType]
    if type(have) in integers and type(want) in integers:
        return integers.index(type(have)) >= integers.index(type(want))
    if isinstance(want, T.FloatType):
        return isinstance(have, T.DoubleType)
    if isinstance(want, T.DecimalType) and isinstance(have, T.DecimalType):
        return (have.scale >= want.scale
                and have.precision - have.scale >= want.precision - want.scale)
    if isinstance(want, T.ArrayType) and isinstance(have, T.ArrayType):
        return _holds(have.elementType, want.elementType)
    return False


def _spark_schema(info: TableInfo) -> Any:
    """The Spark schema of a table's staged net changes: its columns in split_tables'
    types, then EXTRA and ``_deleted``."""
    from pyspark.sql import types as T

    return T.StructType(
        [T.StructField(name, spark_type(pg)) for name, pg, _ in info.columns]
        + [T.StructField(name, T.LongType()) for name in EXTRA]
        + [T.StructField(DELETED, T.BooleanType())])


def _target_rows(spark: Any, target: str, info: TableInfo, changes: pa.Table,
                 filled: Sequence[str]) -> pa.Table:
    """The key and ``filled`` columns of the target's rows under the keys that the rows
    wanting fills (``_fill``) began at (``_o_<key>``), in Arrow, as fill_rows takes them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    keys = key_names(info)
    types = {name: pg for name, pg, _ in info.columns}
    wanting = pa.array([bool(fill) for fill in changes.column("_fill").to_pylist()], pa.bool_())
    origins = changes.filter(wanting).select([f"_o_{k}" for k in keys])
    origins = origins.rename_columns([f"_k{i}" for i in range(len(keys))])
    origins = origins.filter(pc.invert(pc.is_null(origins.column(0))))
    wanted = spark.createDataFrame(origins, T.StructType(
        [T.StructField(f"_k{i}", spark_type(types[k])) for i, k in enumerate(keys)]))
    rows = spark.table(target).select(*[column(c) for c in [*keys, *filled]])
    match = None
    for i, k in enumerate(keys):
        same = rows[ident(k)].eqNullSafe(wanted[f"_k{i}"])
        match = same if match is None else match & same
    return rows.join(F.broadcast(wanted), match, "left_semi").toArrow()


def _one_row_per_key(staged: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``staged`` without the deletions of keys that a row put also matches in SQL (<=>
    takes -0.0 for 0.0, and NaN for NaN): a float key changed from 0 to -0 is one target
    row, updated, and a MERGE refuses two source rows for it."""
    import pyarrow as pa

    if not any(pa.types.is_floating(staged.schema.field(k).type) for k in keys):
        return staged

    # (key_tuples gives every NaN as one value; -0.0 equals 0.0 and hashes alike)
    deleted = staged.column(DELETED).to_pylist()
    tuples = key_tuples(staged, keys)
    put = {key for key, gone in zip(tuples, deleted, strict=True) if not gone}
    keep = [not (gone and key in put) for key, gone in zip(tuples, deleted, strict=True)]
    return staged.filter(pa.array(keep, pa.bool_()))


def _static_overwrite(spark: Any, statement: str) -> None:
    """An INSERT OVERWRITE of the whole table, whatever the session's partition overwrite
    mode (dynamic would keep the partitions no row is written to: a TRUNCATE lost)."""
    from plugin_framework.spark.settings import session_setting

    with session_setting(spark, _OVERWRITE_MODE, "static"):
        spark.sql(statement)


def _fingerprint(rows: Sequence[dict[str, Any]], query: str | None) -> dict[str, Any]:
    """What tells a table's rows of one batch from another's: their number and LSN range
    (a batch delivered again has the same transactions), and the query."""
    from plugin_framework.spark.changes.rows import TableRows

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
    return re.sub(r"[^0-9A-Za-z_]", "_", f"pgdecode_net_{info.schema}_{info.table}_{batch_id}")


def _uri(path: str) -> str:
    """A local path as pyarrow's FileSystem.from_uri takes it."""
    import os

    return path if "://" in path else os.path.abspath(path)
