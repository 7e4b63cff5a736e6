"""Ready-made foreachBatch functions, both idempotent by batch id: delivering a batch again
(after a crash, with the same id and rows) leaves the same result as delivering it once.

- ``ChangeLogWriter(path)``: appends every change to Parquet, partitioned by
  ``schema``/``table``/``date`` (the commit date in the session time zone), with a
  ``batch_id`` column. A batch is written to a staging directory, then its files are moved
  into the partitions under names carrying the batch id (replacing those of an interrupted
  earlier attempt), then the batch is recorded in ``_pgdecode/commits``.
- ``TableStateWriter(path)``: keeps the current state of each table at
  ``path/<schema>/<table>``: the latest row per replica identity key by ``(commit_lsn,
  seq)``, deleted rows removed, TRUNCATE applied, unchanged TOAST values carried over, in
  the column types of ``split_tables``. Each batch writes a new version of the tables it
  touches beside the current one and swaps it in; the batch id recorded in the version
  (``_pgdecode_batch-N``) makes a replayed batch a no-op. Tables without a key use all
  columns as the key (duplicate rows collapse). The rewrite reads the whole table state:
  for large tables, merge into a table format with MERGE (Delta, Iceberg) from
  ``split_tables`` instead.

Paths go through Hadoop's FileSystem of the session (any scheme Spark can write), or the
local file system when the session has no JVM gateway (Spark Connect).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from plugin_framework.spark.tables import TableInfo, column, table_infos, typed_changes

__all__ = ["ChangeLogWriter", "TableStateWriter", "read_state", "state_path"]

_MARKER = "_pgdecode_batch"


# --- file systems ---------------------------------------------------------------------------


class _LocalFS:
    def __init__(self, root: str) -> None:
        self.root = root.removeprefix("file://") if root.startswith("file://") else root

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def exists(self, p: str) -> bool:
        return os.path.exists(p)

    def mkdirs(self, p: str) -> None:
        os.makedirs(p, exist_ok=True)

    def delete(self, p: str) -> None:
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def files(self, p: str) -> list[str]:
        """Files below ``p``, relative to it."""
        out = []
        for dirpath, _, names in os.walk(p):
            for name in names:
                out.append(os.path.relpath(os.path.join(dirpath, name), p))
        return sorted(out)

    def children(self, p: str) -> list[str]:
        return sorted(os.listdir(p)) if os.path.isdir(p) else []

    def touch(self, p: str) -> None:
        with open(p, "w") as f:
            os.fsync(f.fileno())

    def uri(self, p: str) -> str:
        return p


class _HadoopFS:
    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self.fs = self._Path(root).getFileSystem(spark._jsc.hadoopConfiguration())
        self.root = root.rstrip("/")

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, p: str) -> bool:
        return bool(self.fs.exists(self._Path(p)))

    def mkdirs(self, p: str) -> None:
        self.fs.mkdirs(self._Path(p))

    def delete(self, p: str) -> None:
        self.fs.delete(self._Path(p), True)

    def rename(self, src: str, dst: str) -> None:
        if not self.fs.rename(self._Path(src), self._Path(dst)):
            raise OSError(f"cannot rename {src} to {dst}")

    def files(self, p: str) -> list[str]:
        base = self._Path(p)
        if not self.fs.exists(base):
            return []
        prefix = str(self.fs.makeQualified(base).toUri().getPath()).rstrip("/") + "/"
        out = []
        it = self.fs.listFiles(base, True)
        while it.hasNext():
            path = str(it.next().getPath().toUri().getPath())
            out.append(path.removeprefix(prefix))
        return sorted(out)

    def children(self, p: str) -> list[str]:
        base = self._Path(p)
        if not self.fs.exists(base):
            return []
        return sorted(str(s.getPath().getName()) for s in self.fs.listStatus(base))

    def touch(self, p: str) -> None:
        self.fs.create(self._Path(p), True).close()

    def uri(self, p: str) -> str:
        return p


def _fs(spark: Any, root: str) -> _LocalFS | _HadoopFS:
    if getattr(spark, "_jvm", None) is not None and getattr(spark, "_jsc", None) is not None:
        return _HadoopFS(spark, root)
    return _LocalFS(root)


# --- the change log --------------------------------------------------------------------------


class ChangeLogWriter:
    """``fn(batch_df, batch_id)`` appending the change log to Parquet at ``path``."""

    def __init__(self, path: str, partition_by: Sequence[str] = ("schema", "table", "date")):
        self.path = path
        self.partition_by = list(partition_by)

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        spark = df.sparkSession
        fs = _fs(spark, self.path)
        marker = fs.path("_pgdecode", "commits", str(batch_id))
        if fs.exists(marker):
            return  # this batch is in the log already
        staging = fs.path("_pgdecode", "staging", str(batch_id))
        out = df.withColumn("date", F.to_date("commit_time")) \
                .withColumn("batch_id", F.lit(batch_id).cast("bigint"))
        out.write.mode("overwrite").partitionBy(*self.partition_by).parquet(fs.uri(staging))
        prefix = f"part-b{batch_id:012d}-"
        moves = [f for f in fs.files(staging)
                 if not os.path.basename(f).startswith(("_", ".")) and f.endswith(".parquet")]
        for directory in sorted({os.path.dirname(f) for f in moves}):
            target = fs.path(directory) if directory else fs.path()
            for name in fs.children(target):
                if name.startswith(prefix):  # left by an interrupted attempt at this batch
                    fs.delete(fs.path(directory, name) if directory else fs.path(name))
            fs.mkdirs(target)
        for f in moves:
            directory, name = os.path.split(f)
            fs.rename(fs.path("_pgdecode", "staging", str(batch_id), f),
                      fs.path(directory, prefix + name) if directory else fs.path(prefix + name))
        fs.mkdirs(fs.path("_pgdecode", "commits"))
        fs.touch(marker)
        fs.delete(staging)


# --- the current state of the tables ---------------------------------------------------------


def state_path(path: str, table: str) -> str:
    """Where ``TableStateWriter(path)`` keeps ``schema.table``."""
    schema, _, name = table.partition(".")
    return "/".join([path.rstrip("/"), schema, name])


def read_state(spark: Any, path: str, table: str) -> Any:
    """The current state of ``schema.table`` as a DataFrame (a plain Parquet read)."""
    fs = _fs(spark, path)
    target = state_path(path, table)
    _recover(fs, target)
    return spark.read.parquet(target)


def _recover(fs: _LocalFS | _HadoopFS, target: str) -> None:
    """Finish a swap that a crash interrupted: the new version is complete (it has its
    marker), the current one was moved away."""
    parent, name = target.rsplit("/", 1)
    if fs.exists(target):
        return
    versions = sorted(c for c in fs.children(parent) if c.startswith(f".{name}.new-"))
    for candidate in reversed(versions):
        path = f"{parent}/{candidate}"
        if _batch_of(fs, path) is not None:
            fs.rename(path, target)
            return


def _batch_of(fs: _LocalFS | _HadoopFS, target: str) -> int | None:
    """The batch recorded in a state version: the name of its ``_pgdecode_batch-N`` file."""
    found = [int(name.rsplit("-", 1)[1]) for name in fs.children(target)
             if name.startswith(_MARKER + "-") and name.rsplit("-", 1)[1].isdigit()]
    return max(found) if found else None


class TableStateWriter:
    """``fn(batch_df, batch_id)`` maintaining each table's current state at ``path``."""

    def __init__(self, path: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None) -> None:
        """``tables``: only these (``schema.table``); ``on_table(table, batch_id)`` is called
        after each table's new state is in place."""
        self.path = path
        self.tables = None if tables is None else set(tables)
        self.on_table = on_table

    def __call__(self, df: Any, batch_id: int) -> None:
        spark = df.sparkSession
        fs = _fs(spark, self.path)
        df = df.persist()
        try:
            for info in table_infos(df):
                if self.tables is not None and info.qualified_name not in self.tables:
                    continue
                self._apply(spark, fs, df, info, batch_id)
                if self.on_table is not None:
                    self.on_table(info.qualified_name, batch_id)
        finally:
            df.unpersist()

    def _apply(self, spark: Any, fs: _LocalFS | _HadoopFS, df: Any, info: TableInfo,
               batch_id: int) -> None:
        target = state_path(self.path, info.qualified_name)
        _recover(fs, target)
        done = _batch_of(fs, target) if fs.exists(target) else None
        if done is not None and done >= batch_id:
            return  # applied already
        existing = spark.read.parquet(target) if done is not None else None
        state = merge_state(df, info, existing)
        parent, name = target.rsplit("/", 1)
        new = f"{parent}/.{name}.new-{batch_id}"
        old = f"{parent}/.{name}.old-{batch_id}"
        fs.delete(new)
        state.write.mode("overwrite").parquet(new)
        fs.touch(f"{new}/{_MARKER}-{batch_id}")
        if fs.exists(target):
            fs.delete(old)
            fs.rename(target, old)
        fs.rename(new, target)
        fs.delete(old)


def merge_state(df: Any, info: TableInfo, existing: Any | None) -> Any:
    """The table's state after the batch: ``existing`` (or nothing) with the batch's changes
    applied in (commit_lsn, seq) order."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = [name for name, _, _ in info.columns]
    keys = list(info.key_columns) or names
    changes = typed_changes(df, info, old_columns=keys)
    data = [column(n) for n in names]
    order = [F.col("_commit_lsn"), F.col("_seq"), F.col("_sub")]

    # Events on keys: a "set" puts a row under its key, a "remove" takes a key away.
    sets = changes.filter(F.col("_op").isin("INSERT", "UPDATE", "SNAPSHOT")).select(
        *data, F.col("_lsn"), F.col("_commit_lsn"), F.col("_seq"), F.lit(1).alias("_sub"),
        F.lit(True).alias("_set"), F.col("_unchanged_toast").alias("_toast"),
        *[column(f"_old_{k}") for k in keys], F.col("_has_old"))
    removes = changes.filter(
        (F.col("_op") == "DELETE") | ((F.col("_op") == "UPDATE") & F.col("_has_old"))
    ).select(
        *[(F.col(f"_old_{n}") if n in keys else F.lit(None)).alias(n) for n in names],
        F.col("_lsn"), F.col("_commit_lsn"), F.col("_seq"), F.lit(0).alias("_sub"),
        F.lit(False).alias("_set"), F.array().cast("array<string>").alias("_toast"),
        *[F.lit(None).alias(f"_old_{k}") for k in keys], F.lit(False).alias("_has_old"))
    # a DELETE's row is its old key; take it from the before image in both cases
    events = sets.unionByName(removes)
    if existing is not None:
        current = existing.select(
            *[(column(n) if n in existing.columns else F.lit(None)).cast(_type(changes, n))
              .alias(n) for n in names],
            (F.col("_lsn") if "_lsn" in existing.columns else F.lit(None)).cast("bigint")
            .alias("_lsn"),
            F.lit(-1).cast("bigint").alias("_commit_lsn"), F.lit(-1).alias("_seq"),
            F.lit(1).alias("_sub"), F.lit(True).alias("_set"),
            F.array().cast("array<string>").alias("_toast"),
            *[F.lit(None).alias(f"_old_{k}") for k in keys], F.lit(False).alias("_has_old"))
        events = current.unionByName(events, allowMissingColumns=True)
    if info.truncated_at is not None:
        lsn, seq = info.truncated_at
        events = events.filter((F.col("_commit_lsn") > lsn)
                               | ((F.col("_commit_lsn") == lsn) & (F.col("_seq") > seq)))
    key = F.struct(*[column(k) for k in keys])
    events = events.withColumn("_key", key)
    toast = [c for c in info.toast_columns if c in names]
    if toast:
        events = _carry_toast(events, toast, keys, moved=info.moved_toast)
    latest = Window.partitionBy("_key").orderBy(*[o.desc() for o in order])
    final = events.withColumn("_rn", F.row_number().over(latest)) \
                  .filter((F.col("_rn") == 1) & F.col("_set"))
    return final.select(*data, F.col("_commit_lsn"), F.col("_lsn"))


def _type(df: Any, name: str) -> Any:
    return df.schema[name].dataType


def _carry_toast(events: Any, columns: Sequence[str], keys: Sequence[str], *,
                 moved: bool) -> Any:
    """Fill unchanged TOAST columns of "set" events from the previous version of the row:
    the latest earlier set event of the same key, or, for an UPDATE that came with its old
    row (a key change, or REPLICA IDENTITY FULL), the old row itself or the latest earlier
    version under the old key."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = [F.col("_commit_lsn"), F.col("_seq"), F.col("_sub")]
    sets = events.filter(F.col("_set"))
    others = events.filter(~F.col("_set"))
    upto = Window.partitionBy("_key").orderBy(*order) \
                 .rowsBetween(Window.unboundedPreceding, Window.currentRow)

    def known(c: str) -> Any:  # the value, wrapped so that a real NULL counts as known
        return F.when(~F.array_contains(F.col("_toast"), c), F.struct(column(c).alias("v")))

    if moved:
        is_moved = F.col("_has_old") & (F.size("_toast") > 0)
        # values known from the old row itself (its key columns; all of them under FULL)
        for c in columns:
            if c in keys:
                sets = sets.withColumn(c, F.when(is_moved & F.array_contains("_toast", c),
                                                 column(f"_old_{c}")).otherwise(column(c)))
                sets = sets.withColumn("_toast", F.when(is_moved, F.array_remove("_toast", c))
                                       .otherwise(F.col("_toast")))
        lookup = [c for c in columns if c not in keys]
        if lookup:
            # the others from the latest earlier version under the old key
            history = sets.select(
                F.col("_key").alias("_h_key"), F.struct(*order).alias("_h_order"),
                *[F.coalesce(known(c), F.last(known(c), ignorenulls=True).over(upto))
                  .alias(f"_h_{c}") for c in lookup])
            wanted = sets.filter(is_moved).select(
                F.col("_key").alias("_m_key"), F.col("_commit_lsn").alias("_m_commit_lsn"),
                F.col("_seq").alias("_m_seq"),
                F.struct(*[column(f"_old_{k}").alias(k) for k in keys]).alias("_m_old"))
            found = wanted.join(
                history,
                (F.col("_h_key") == F.col("_m_old"))
                & (F.col("_h_order") < F.struct(F.col("_m_commit_lsn"), F.col("_m_seq"),
                                                 F.lit(0))),
                "inner",
            ).groupBy("_m_key", "_m_commit_lsn", "_m_seq").agg(
                *[F.max_by(column(f"_h_{c}"), F.col("_h_order")).alias(f"_o_{c}") for c in lookup])
            sets = sets.join(
                found,
                (F.col("_key") == F.col("_m_key"))
                & (F.col("_commit_lsn") == F.col("_m_commit_lsn"))
                & (F.col("_seq") == F.col("_m_seq")),
                "left",
            )
            for c in lookup:
                hit = F.array_contains("_toast", c) & column(f"_o_{c}").isNotNull()
                sets = sets.withColumn(c, F.when(hit, column(f"_o_{c}").getField("v"))
                                       .otherwise(column(c)))
                sets = sets.withColumn("_toast", F.when(hit, F.array_remove("_toast", c))
                                       .otherwise(F.col("_toast")))
            sets = sets.drop("_m_key", "_m_commit_lsn", "_m_seq", "_m_old",
                             *[f"_o_{c}" for c in lookup])
    for c in columns:
        sets = sets.withColumn(f"_prev_{c}", F.last(known(c), ignorenulls=True).over(upto))
    for c in columns:
        sets = sets.withColumn(
            c, F.when(F.array_contains(F.col("_toast"), c), column(f"_prev_{c}").getField("v"))
            .otherwise(column(c)))
    sets = sets.drop(*[f"_prev_{c}" for c in columns])
    return sets.unionByName(others)
