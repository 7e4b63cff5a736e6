"""``TableStateWriter(path)``: each table's current state as plain Parquet files at
``path/<schema>/<table>`` (``state_path``), in the column types of ``split_tables``, then
``_commit_lsn`` and ``_lsn`` of the change that wrote each row. Spark, DuckDB, polars and
pyarrow read it as a directory of Parquet files; Spark sees each column's PostgreSQL type in
its field metadata (``pg_type``).

Each batch applies its net changes (netchange.py: key chains followed, unchanged TOAST values
carried over, deletes and TRUNCATE applied) by rewriting only the files that hold the keys it
touches, so that its cost grows with the batch and the files it touches, not with the table:

- a file holds at most ``file_rows`` rows, sorted by the key (the replica identity; every
  column for tables without one), and the table's manifest keeps each file's lowest and
  highest first key column (for integer and text keys);
- the files that may hold a touched key (by those bounds; otherwise every file) are checked
  by reading their key column; those that do are read, and their rows with touched keys are
  replaced or removed. Unchanged TOAST values come from these rows too;
- rows of keys the table did not have go to the file with the highest keys while it is not
  full (a workload that inserts ascending keys fills one file after the other);
- the rows of the files read, and those put, are sorted by key and written as new files of
  at most ``file_rows`` rows; the files read are dropped.

Files are ranges of the key, not hash buckets: the keys of a batch of 10,000 changes, hashed,
fall into nearly every bucket, whereas a run of new ascending keys stays in one range.
Updates spread evenly over a large table touch every file: then a batch rewrites the table.
``DeltaTableWriter`` (delta.py) has the same limit (copy-on-write files); a batch of a
workload with locality (new keys ascending, updates to recent rows) rewrites one or two files.

The steps every state mirror shares (the rows, the description, the net changes typed, the
TOAST values) are ``TableSink``'s (template.py); this module is its hooks: how a state's
files are read (by key: ``rows_under``) and how a batch's are committed (statefiles.py).

A batch of a table commits in three steps: its new files are written under
``_pgdecode/pending-N`` (N: the batch id; Spark and DuckDB skip directories starting with
``_``); then the manifest ``_pgdecode/state-N.json`` (the files of the state, the batch id,
the PostgreSQL description of the columns) is written under a temporary name and renamed:
the commit; then the new files are moved into place and the dropped ones deleted. A crash
before the rename leaves the previous state (the batch is applied again when delivered
again); after it, the next writer or ``read_state`` finishes the moves. A table whose
manifest has batch N or later has the batch already: a batch delivered again applies only
to the tables it had not reached. A reader that lists the directory while a batch moves its
files may see a touched key twice or not at all; ``read_state`` reads the manifest's files.

A description changed by ALTER TABLE (columns/descriptions.py: renamed columns keep their
values, added ones are NULL in older rows, dropped ones go, retyped ones are cast or refused)
rewrites every file, through Spark. The rows are typed in the driver (arrowtyped.py, as
DeltaTableWriter's), else by Spark for a table whose values arrowtyped declines.

Paths: local paths and the URIs pyarrow's file systems take (``s3://``, ``gs://``,
``hdfs://``, ``abfs://``), or ``filesystem=`` (a ``pyarrow.fs.FileSystem``) and a path on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugin_framework.spark.columns.descriptions import Description, TableInfo
from plugin_framework.spark.columns.types import spark_type
from plugin_framework.spark.mirrors.keys import counted, key_names, key_tuples, staying
from plugin_framework.spark.mirrors.statefiles import SPARK_ROW_METADATA, Manifest, StateFiles
from plugin_framework.spark.mirrors.staterows import state_rows
from plugin_framework.spark.mirrors.template import TableBatch, TableSink, state_path

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

__all__ = ["FILE_ROWS", "TableStateWriter", "read_state"]

FILE_ROWS = 100_000


def spark_schema_json(info: TableInfo) -> str:
    """The Spark schema of the state's files (with each column's ``pg_type``), as Spark
    keeps it in the files it writes, so that Spark reads the files as its own."""
    from pyspark.sql import types as T

    fields = [T.StructField(name, spark_type(pg), True, {"pg_type": pg})
              for name, pg, _ in info.columns]
    meta = [T.StructField(n, T.LongType(), True) for n in ("_commit_lsn", "_lsn")]
    return str(T.StructType([*fields, *meta]).json())


@dataclass
class _State:
    """A table's state as ``TableStateWriter``'s hooks see it: its files, its manifest
    before the batch (None: no state yet), and the files ``rows_under`` read."""

    files: StateFiles
    manifest: Manifest | None
    read: list[str] = field(default_factory=list)


class TableStateWriter(TableSink):
    """``fn(batch_df, batch_id)`` maintaining each table's current state in Parquet at
    ``path`` (see the module's text)."""

    def __init__(self, path: str, tables: Sequence[str] | None = None,
                 on_table: Callable[[str, int], None] | None = None, *,
                 keys: Mapping[str, Sequence[str]] | None = None,
                 no_reread: Sequence[str] = (), file_rows: int = FILE_ROWS,
                 filesystem: pafs.FileSystem | None = None) -> None:
        """``keys``: as ``TableSink``'s; ``file_rows``: the most rows a file holds;
        ``filesystem``: a ``pyarrow.fs.FileSystem`` that ``path`` is on (default: by the
        path's scheme)."""
        if file_rows < 1:
            raise ValueError(f"file_rows must be at least 1, not {file_rows}")
        super().__init__(path, tables, on_table, keys=keys, no_reread=no_reread)
        self.file_rows = file_rows
        self.filesystem = filesystem

    # --- TableSink's hooks

    rewrites_touched = True  # a batch rewrites the files holding the keys it touches

    def open(self, info: TableInfo) -> _State:
        files = StateFiles.at(self.path, info.qualified_name, self.filesystem)
        return _State(files, files.recover())

    def applied(self, target: _State, batch_id: int) -> tuple[int, str | None] | None:
        manifest = target.manifest
        if manifest is not None and manifest.batch >= batch_id:
            return manifest.batch, manifest.query
        return None

    def stored_description(self, target: _State) -> Description | None:
        return None if target.manifest is None else target.manifest.description

    def redescribed(self, target: _State, stored: Description | None,
                    description: Description) -> bool:
        """A state whose description is not known (taken over from before the manifest
        said) is rewritten too: its files' columns may not be the batch's."""
        return stored != description

    def holds_rows(self, target: _State) -> bool:
        return target.manifest is not None

    def every_row(self, target: _State) -> pa.Table:
        assert target.manifest is not None
        return target.files.read(list(target.manifest.files))

    def rows_under(self, target: _State, batch: TableBatch, keys: pa.ChunkedArray,
                   changes: pa.Table) -> pa.Table:
        """The rows of the files that hold one of ``keys`` (by their bounds, then their key
        column), and of the file with the highest keys if the batch puts rows of keys the
        table does not have there: the files ``merge`` rewrites."""
        import pyarrow.compute as pc

        manifest = target.manifest
        assert manifest is not None
        info = batch.info
        first = key_names(info)
        target.read = target.files.holding(manifest, first[0], keys.combine_chunks())
        puts = state_rows(changes, info)
        base = target.files.read(target.read, puts.schema)
        tail = _tail(manifest)
        if tail is not None and tail not in target.read \
                and manifest.files[tail] < self.file_rows \
                and not pc.all(_among(puts, base, first)).as_py():
            target.read.append(tail)  # where the rows of new keys go
            base = _concat_tables(base, target.files.read([tail], puts.schema))
        return base

    def replace(self, target: _State, batch: TableBatch, rows: pa.Table) -> None:
        self._write(target.files, batch.info, Manifest(batch.batch_id, {}, batch.description),
                    rows)

    def merge(self, target: _State, batch: TableBatch, changes: pa.Table,
              base: pa.Table | None) -> None:
        """The files read (``rows_under``) written again, with the rows of the keys the
        batch touched replaced or removed and its new rows added."""
        import pyarrow.compute as pc

        manifest = target.manifest
        assert manifest is not None and base is not None
        info = batch.info
        keys = key_names(info)
        puts = state_rows(changes, info)
        if counted(info):  # equal rows: copies taken away, copies added
            state = _concat_tables(base.filter(staying(base, changes, info)), puts)
        else:
            state = _concat_tables(base.filter(pc.invert(_among(base, changes, keys))), puts)
        read = target.read
        kept = Manifest(batch.batch_id,
                        {n: r for n, r in manifest.files.items() if n not in read},
                        batch.description,
                        {n: b for n, b in manifest.bounds_of(keys[0]).items() if n not in read})
        self._write(target.files, info, kept, state)

    def _write(self, files: StateFiles, info: TableInfo, manifest: Manifest,
               rows: pa.Table) -> None:
        """Commit ``manifest`` (the files kept; the others go) with ``rows`` written as new
        files of at most ``file_rows`` rows, sorted by key."""
        keys = key_names(info)
        rows = _sorted(rows, keys)
        rows = rows.replace_schema_metadata({**(rows.schema.metadata or {}),
                                             SPARK_ROW_METADATA: spark_schema_json(info)})
        manifest.bounded = keys[0]
        manifest.query = self.query
        manifest.consistent = self.consistent_lsn(info)
        count = max(1, math.ceil(rows.num_rows / self.file_rows))
        if rows.num_rows == 0 and manifest.files:
            count = 0  # other files hold the table's rows (and its schema)
        size = math.ceil(rows.num_rows / count) if count else 0
        new = {}
        for i in range(count):
            chunk = rows.slice(i * size, size)
            name = f"part-{manifest.batch:012d}-{i:05d}.parquet"
            new[name] = chunk
            manifest.files[name] = chunk.num_rows
            bound = _bound(chunk.column(keys[0]))
            if bound is not None:
                manifest.bounds[name] = bound
        files.commit(manifest, new)


def read_state(spark: Any, path: str, table: str,
               filesystem: pafs.FileSystem | None = None) -> Any:
    """The current state of ``schema.table`` that ``TableStateWriter(path)`` keeps, as a
    DataFrame (a Parquet read of the files its manifest lists)."""
    files = StateFiles.at(path, table, filesystem)
    manifest = files.recover()
    if manifest is None:
        raise FileNotFoundError(f"no state of {table} under {path}: has a TableStateWriter "
                                "written a batch of it there?")
    prefix = state_path(path, table)
    return spark.read.parquet(*[f"{prefix}/{name}" for name in manifest.files])


def _tail(manifest: Manifest) -> str | None:
    """The file with the highest keys (by its bounds; else the last written)."""
    if not manifest.files:
        return None
    if all(n in manifest.bounds for n in manifest.files):
        highs = [n for n in manifest.files if manifest.bounds[n][1] is not None]
        if highs:
            return max(highs, key=lambda n: manifest.bounds[n][1])
    return list(manifest.files)[-1]


def _bound(values: pa.ChunkedArray) -> list[Any] | None:
    """A file's ``[low, high, has_nulls]`` of its first key column (integers and text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = values.type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    low, high = pc.min_max(values).values()
    return [low.as_py(), high.as_py(), values.null_count > 0]


def _among(rows: pa.Table, others: pa.Table, keys: Sequence[str]) -> pa.Array:
    """Which of ``rows`` have a key that one of ``others`` has (NULLs equal)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(keys) == 1 and not pa.types.is_nested(rows.schema.field(keys[0]).type):
        return pc.is_in(rows.column(keys[0]), value_set=others.column(keys[0]).combine_chunks(),
                        skip_nulls=False)
    theirs = set(key_tuples(others, keys))
    return pa.array([k in theirs for k in key_tuples(rows, keys)], pa.bool_())


def _sorted(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Rows sorted by key where the key's types sort (not lists)."""
    import pyarrow as pa

    if rows.num_rows < 2 or any(pa.types.is_nested(rows.schema.field(k).type) for k in keys):
        return rows
    return rows.sort_by([(k, "ascending") for k in keys])


def _concat_tables(*tables: pa.Table) -> pa.Table:
    import pyarrow as pa

    schema = tables[-1].schema
    return pa.concat_tables([t.cast(schema) for t in tables])
