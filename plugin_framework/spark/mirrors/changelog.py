"""``ChangeLogWriter(path)``: appends every change to Parquet, partitioned by
``schema``/``table``/``date`` (the commit date in the session time zone), with a
``batch_id`` column. A batch is written to a staging directory, then its files are moved
into the partitions under names carrying the batch id (replacing those of an interrupted
earlier attempt), then the batch is recorded in ``_pgdecode/commits`` with the query that
wrote it (queries.py: another query's batch of the same id is refused). Its paths go
through Hadoop's FileSystem of the session (any scheme Spark can write), or the local file
system when the session has no JVM gateway (Spark Connect).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from typing import Any

from plugin_framework.spark.mirrors.queries import OtherQueryError, query_of

__all__ = ["ChangeLogWriter"]

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
        query = query_of(df)
        if fs.exists(marker):
            # which query wrote it: an empty file N@QUERY beside N (none: not known)
            owners = [name.partition("@")[2]
                      for name in fs.children(fs.path("_pgdecode", "commits"))
                      if name.startswith(f"{batch_id}@")]
            if query is not None and owners and query not in owners:
                raise OtherQueryError(
                    f"{self.path}: the change log holds batch {batch_id} of another "
                    f"streaming query ({', '.join(owners)}); this query ({query}) numbers its "
                    "batches from 0 again, so its batch would be taken for that one and "
                    "skipped. Give this query a log path of its own")
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
        if query is not None:
            fs.touch(fs.path("_pgdecode", "commits", f"{batch_id}@{query}"))
        fs.touch(marker)
        fs.delete(staging)
