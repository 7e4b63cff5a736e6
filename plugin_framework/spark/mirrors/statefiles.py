"""A ``TableStateWriter`` table's state directory (parquet.py): its manifest of files, the
commit of a batch's files in three steps (pending files, the manifest renamed into place,
the files moved in), and the completion of a commit a crash interrupted."""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugin_framework.framework.statecheck import (
    Damage,
    StateFileError,
    dump_state,
    read_manifest,
)
from plugin_framework.spark.columns.descriptions import Description
from plugin_framework.spark.mirrors.template import state_path

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

__all__ = ["SPARK_ROW_METADATA", "Manifest", "StateFiles"]

_META = "_pgdecode"
_OLD_MARKER = "_pgdecode_batch-"  # the batch of a state written before the manifest
SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"  # Spark's own schema
_MANIFEST = re.compile(r"state-(\d+)\.json")
_PENDING = re.compile(r"pending-(\d+)")


@dataclass
class Manifest:
    """A table's state: its files (name -> rows, in the order written), the batch that
    wrote it, the PostgreSQL description of its columns (None: not known), and, for integer
    and text keys, each file's bounds of the first key column, ``bounded`` (``[low, high,
    has_nulls]``; absent: unknown)."""

    batch: int
    files: dict[str, int]
    description: Description | None
    bounds: dict[str, list[Any]] = field(default_factory=dict)
    bounded: str | None = None  # None: written before the manifest said (the first key)
    query: str | None = None  # the streaming query of the batch (None: not known)
    # the state equals the source's table as of this WAL position (None: not known to)
    consistent: int | None = None

    def dumps(self) -> bytes:
        return dump_state({"batch": self.batch, "files": self.files,
                           "description": self.description, "bounds": self.bounds,
                           "bounded": self.bounded, "query": self.query,
                           "consistent": self.consistent}, ensure_ascii=False)

    def bounds_of(self, key: str) -> dict[str, list[Any]]:
        """The bounds, if they are of column ``key`` (a table's key can change: a primary
        key added, another replica identity)."""
        return self.bounds if self.bounded in (None, key) else {}

    @classmethod
    def loads(cls, data: bytes, path: str = "the manifest", batch: int | None = None
              ) -> Manifest:
        """A manifest, checked whole (StateFileError naming ``path``); ``batch``: the batch
        its file name says."""
        try:
            raw = read_manifest(data, batch)
        except Damage as exc:
            raise StateFileError(
                f"{path} is damaged ({exc}): the state of its table cannot be trusted, and "
                "nothing was changed. Restore it from a backup; to start afresh instead, "
                "remove the table's directory and copy the table again (pgdecode snapshot "
                "--table, or a new slot with --snapshot initial)") from None
        description = raw["description"]
        return cls(int(raw["batch"]), {str(k): int(v) for k, v in raw["files"].items()},
                   None if description is None else tuple((str(n), str(t))
                                                          for n, t in description),
                   dict(raw.get("bounds") or {}), raw.get("bounded"), raw.get("query"),
                   raw.get("consistent"))


class StateFiles:
    """One table's state directory: its manifest, the commit of a batch's files, and the
    completion of a commit a crash interrupted."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.meta = f"{self.root}/{_META}"

    @classmethod
    def at(cls, path: str, table: str, filesystem: pafs.FileSystem | None = None) -> StateFiles:
        """The state of ``schema.table`` under ``path`` (a local path or a URI)."""
        import pyarrow.fs as pafs

        target = state_path(path, table)
        if filesystem is not None:
            return cls(filesystem, target)
        if "://" not in target:
            return cls(pafs.LocalFileSystem(), os.path.abspath(target))
        fs, root = pafs.FileSystem.from_uri(target)
        return cls(fs, root)

    def file(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _entries(self, directory: str) -> list[Any]:
        import pyarrow.fs as pafs

        return list(self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)))

    def _exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def recover(self) -> Manifest | None:
        """The table's manifest (None: no state yet), after finishing the commit a crash
        interrupted and dropping the files of one that did not reach its manifest."""
        found: dict[int, str] = {}
        pending: dict[int, str] = {}
        for entry in self._entries(self.meta):
            if m := _MANIFEST.fullmatch(entry.base_name):
                found[int(m.group(1))] = entry.path
            elif m := _PENDING.fullmatch(entry.base_name):
                pending[int(m.group(1))] = entry.path
        if not found:
            for path in pending.values():
                self.fs.delete_dir(path)
            return self._adopt()
        latest = max(found)
        with self.fs.open_input_stream(found[latest]) as f:
            manifest = Manifest.loads(f.read(), found[latest], latest)
        for batch, path in pending.items():
            if batch != latest:
                self.fs.delete_dir(path)  # a batch that did not commit
        if latest in pending or len(found) > 1:
            self._finish(manifest)
        return manifest

    def commit(self, manifest: Manifest, new: dict[str, pa.Table]) -> None:
        """Make ``manifest`` the table's state; ``new``: its files not written yet."""
        import pyarrow.parquet as pq

        pending = f"{self.meta}/pending-{manifest.batch}"
        if self._exists(pending):
            self.fs.delete_dir(pending)
        self.fs.create_dir(pending)
        for name, rows in new.items():
            pq.write_table(rows, f"{pending}/{name}", filesystem=self.fs)
        self._sync(pending)
        temporary = f"{self.meta}/.state-{manifest.batch}.json"
        with self.fs.open_output_stream(temporary) as f:
            f.write(manifest.dumps())
        self._sync(temporary)
        self.fs.move(temporary, f"{self.meta}/state-{manifest.batch}.json")  # the commit
        self._sync(self.meta)
        self._finish(manifest)

    def _finish(self, manifest: Manifest) -> None:
        """Move the manifest's new files into place, then delete what it does not list."""
        pending = f"{self.meta}/pending-{manifest.batch}"
        if self._exists(pending):
            for entry in self._entries(pending):
                if entry.base_name in manifest.files:
                    self.fs.move(entry.path, self.file(entry.base_name))
        for entry in self._entries(self.root):
            name = entry.base_name
            if entry.is_file and name not in manifest.files and (
                    name.startswith(_OLD_MARKER) or not name.startswith(("_", "."))):
                self.fs.delete_file(entry.path)
        for entry in self._entries(self.meta):
            m = _MANIFEST.fullmatch(entry.base_name)
            if m and int(m.group(1)) < manifest.batch:
                self.fs.delete_file(entry.path)
        if self._exists(pending):
            self.fs.delete_dir(pending)

    def _adopt(self) -> Manifest | None:
        """The manifest of a state written before manifests were kept (a directory of
        Spark's Parquet files and a ``_pgdecode_batch-N`` file, or, after a crash of that
        writer as it swapped versions, only its new version ``.<table>.new-N``), written
        now."""
        import pyarrow.parquet as pq

        if not self._exists(self.root):  # that writer's crash between its two renames
            parent, name = self.root.rsplit("/", 1)
            prefix = f".{name}.new-"
            versions = sorted((e for e in self._entries(parent)
                               if e.base_name.startswith(prefix)
                               and e.base_name.removeprefix(prefix).isdigit()),
                              key=lambda e: int(e.base_name.removeprefix(prefix)), reverse=True)
            for version in versions:
                if any(e.base_name.startswith(_OLD_MARKER) for e in self._entries(version.path)):
                    self.fs.move(version.path, self.root)
                    break
        entries = self._entries(self.root)
        batches = [int(e.base_name.removeprefix(_OLD_MARKER)) for e in entries
                   if e.base_name.startswith(_OLD_MARKER)
                   and e.base_name.removeprefix(_OLD_MARKER).isdigit()]
        if not batches:
            return None
        files = {e.base_name: pq.ParquetFile(e.path, filesystem=self.fs).metadata.num_rows
                 for e in entries if e.is_file and e.base_name.endswith(".parquet")
                 and not e.base_name.startswith(("_", "."))}
        description = None
        if files:
            schema = pq.read_schema(self.file(next(iter(files))), filesystem=self.fs)
            description = _spark_description(schema)
        manifest = Manifest(max(batches), files, description)
        self.fs.create_dir(self.meta)
        self.commit(manifest, {})
        return manifest

    def read(self, names: Sequence[str], schema: pa.Schema | None = None) -> pa.Table:
        """The rows of files ``names``, in ``schema`` if given."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(self.file(n), filesystem=self.fs) for n in names]
        if schema is not None:
            tables = [t.select(schema.names).cast(schema) for t in tables]
        return pa.concat_tables(tables) if tables else schema.empty_table()  # type: ignore[union-attr]

    def holding(self, manifest: Manifest, key: str, wanted: pa.Array) -> list[str]:
        """The files holding a row whose column ``key`` (the first key column) has a value
        among ``wanted`` (its bounds first, then the column)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        if pa.types.is_nested(wanted.type):  # neither bounds nor is_in: every file may
            return list(manifest.files)
        values = sorted(pc.unique(wanted.drop_null()).to_pylist())
        nulls = wanted.null_count > 0
        out = []
        bounds = manifest.bounds_of(key)
        for name in manifest.files:
            bound = bounds.get(name)
            if bound is not None:
                low, high, has_nulls = bound  # low and high None: no key but NULLs
                at = len(values) if low is None else bisect.bisect_left(values, low)
                if not (nulls and has_nulls) and not (at < len(values) and values[at] <= high):
                    continue
            column = pq.read_table(self.file(name), columns=[key], filesystem=self.fs)
            if pc.any(pc.is_in(column.column(key), value_set=wanted, skip_nulls=False)).as_py():
                out.append(name)
        return out

    def _sync(self, path: str) -> None:
        """Flush a local file (or a directory's entries, or every file below it) to disk:
        the commit must survive the machine, not only the process."""
        import pyarrow.fs as pafs

        if not isinstance(self.fs, pafs.LocalFileSystem):
            return
        paths = [path]
        if os.path.isdir(path):
            paths += [os.path.join(path, n) for n in os.listdir(path)]
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _spark_description(schema: pa.Schema) -> Description | None:
    """The description in the Spark schema of a Parquet file Spark wrote (None: absent)."""
    raw = (schema.metadata or {}).get(SPARK_ROW_METADATA)
    if raw is None:
        return None
    fields = [f for f in json.loads(raw)["fields"] if not f["name"].startswith("_")]
    if not all("pg_type" in (f.get("metadata") or {}) for f in fields):
        return None
    return tuple((f["name"], str(f["metadata"]["pg_type"])) for f in fields)
