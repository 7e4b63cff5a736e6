"""TableStateWriter's files (plugin_framework/spark/mirrors/parquet.py and statefiles.py): a
batch rewrites only the files holding the keys it touches, a commit interrupted at any step
of its file operations is finished or dropped, never half-applied, and a state written
before manifests were kept is taken over. The server-driven random workloads
(tests/spark/test_spark_mirror.py, tests/spark/test_spark_recovery.py) compare the state with
SELECT *; these drive the writer with change rows made here, against a model of the table."""

from __future__ import annotations

import random
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from support.sinkrows import COLUMNS, Row, Workload, change
from support.spark_fixtures import spark_session  # noqa: F401

from plugin_framework.spark.columns.descriptions import rows_info
from plugin_framework.spark.mirrors.parquet import TableStateWriter
from plugin_framework.spark.mirrors.statefiles import StateFiles

TABLE = "public.t"


class Crash(BaseException):
    """The writer's process dies here (raised before a file operation happens)."""


class Dying(pafs.FileSystemHandler):
    """The local file system, which dies before its ``die_at``-th change (create, write,
    move, delete) when that is set."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.die_at: int | None = None
        self.changes = 0

    def _change(self) -> None:
        if self.die_at is not None and self.changes == self.die_at:
            self.die_at = None
            raise Crash
        self.changes += 1

    def get_type_name(self) -> str:
        return "dying"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[Any]:
        return list(self.fs.get_file_info(paths))

    def get_file_info_selector(self, selector: Any) -> list[Any]:
        return list(self.fs.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self._change()
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._change()
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._change()
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise AssertionError("never")

    def delete_file(self, path: str) -> None:
        self._change()
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._change()
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self._change()
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        self._change()
        return self.fs.open_output_stream(path)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise AssertionError("never")

    def equals(self, other: Any) -> bool:
        return other is self


def state(path: Path) -> dict[int, Row]:
    files = StateFiles.at(str(path), TABLE)
    manifest = files.recover()
    assert manifest is not None
    table = files.read(list(manifest.files))
    assert table.column_names == ["id", "v", "big", "n", "_commit_lsn", "_lsn"]
    out = {}
    for r in table.to_pylist():
        assert r["id"] not in out, f"key {r['id']} twice"
        out[r["id"]] = (r["v"], r["big"], str(r["n"]))
    return out


def apply(writer: TableStateWriter, rows: list[dict[str, Any]], batch_id: int) -> None:
    """What TableSink does with one table's rows of a batch (no Spark: every value here is
    typed in Python)."""
    writer.apply(None, rows, rows_info("public", "t", rows), batch_id)


def manifest(path: Path) -> dict[str, int]:
    found = StateFiles.at(str(path), TABLE).recover()
    assert found is not None
    return found.files


def test_a_batch_rewrites_only_the_files_holding_its_keys(tmp_path: Path) -> None:
    work = Workload(seed=1)
    writer = TableStateWriter(str(tmp_path), file_rows=100)
    first = [change("INSERT", i, 1000, after=Workload.values(i, (f"v{i}", "b", "1.00")))
             for i in range(1, 1001)]
    work.rows = {i: (f"v{i}", "b", "1.00") for i in range(1, 1001)}
    work.next_id = 1001
    apply(writer, first, 0)
    before = manifest(tmp_path)
    assert len(before) == 10 and set(before.values()) == {100}
    # three keys of one file updated: that file is rewritten, no other
    rows = [change("UPDATE", i, 2000, after=Workload.values(k, ("w", "b", "2.00")))
            for i, k in enumerate((205, 230, 299))]
    for k in (205, 230, 299):
        work.rows[k] = ("w", "b", "2.00")
    apply(writer, rows, 1)
    after = manifest(tmp_path)
    assert len(set(before) - set(after)) == 1 and len(set(after) - set(before)) == 1
    assert state(tmp_path) == work.rows
    # new keys, ascending: they fill the file with the highest keys, then new ones
    for batch in range(2, 6):
        previous = manifest(tmp_path)
        apply(writer, work.batch(40, recent=True), batch)
        now = manifest(tmp_path)
        assert len(set(previous) - set(now)) <= 2, (previous, now)
        assert max(now.values()) <= 100
        assert state(tmp_path) == work.rows
    # updates and deletes of old keys leave the file with the highest keys alone, even
    # while it has room
    previous = manifest(tmp_path)
    assert min(previous.values()) < 100
    rows = [change("UPDATE", 0, 9000, after=Workload.values(150, ("u", "b", "3.00"))),
            change("DELETE", 1, 9000, before={"id": 160})]
    work.rows[150] = ("u", "b", "3.00")
    del work.rows[160]
    apply(writer, rows, 6)
    now = manifest(tmp_path)
    assert len(set(previous) - set(now)) == 1 and len(set(now) - set(previous)) == 1
    assert state(tmp_path) == work.rows


def test_a_crash_at_any_step_of_a_commit_is_finished_or_dropped(tmp_path: Path) -> None:
    dying = Dying()
    fs = pafs.PyFileSystem(dying)
    work = Workload(seed=7)
    crashed_at: set[int] = set()
    committed = 0
    for batch_id in range(40):
        rows = work.batch(work.random.choice((1, 5, 30)))
        expected = dict(work.rows)
        dying.die_at = work.random.randrange(0, 16)
        dying.changes = 0
        writer = TableStateWriter(str(tmp_path), file_rows=7, filesystem=fs)
        try:
            apply(writer, rows, batch_id)
        except Crash:
            crashed_at.add(dying.changes)
            # a new process: the state is the previous batch's or this one's, whole
            found = StateFiles.at(str(tmp_path), TABLE, fs).recover()
            if found is not None and found.batch == batch_id:
                assert state(tmp_path) == expected
            elif batch_id:
                assert found is not None and found.batch == committed
            # the batch is delivered again
            apply(TableStateWriter(str(tmp_path), file_rows=7, filesystem=fs), rows, batch_id)
        dying.die_at = None
        assert state(tmp_path) == expected, batch_id
        committed = batch_id
        # delivered once more (the checkpoint did not record it): nothing changes
        before = manifest(tmp_path)
        apply(TableStateWriter(str(tmp_path), file_rows=7, filesystem=fs), rows, batch_id)
        assert manifest(tmp_path) == before
    assert crashed_at >= set(range(8)), sorted(crashed_at)  # every step was interrupted
    # nothing is left beside the manifest's files
    names = {p.name for p in tmp_path.joinpath("public", "t").iterdir()}
    assert names == set(manifest(tmp_path)) | {"_pgdecode"}
    assert [p.name for p in tmp_path.joinpath("public", "t", "_pgdecode").iterdir()] == \
        [f"state-{committed}.json"]


def test_an_empty_table_keeps_a_file_with_its_columns(tmp_path: Path) -> None:
    writer = TableStateWriter(str(tmp_path))
    apply(writer, [change("INSERT", 0, 100, after={"id": 1, "v": "a", "big": "b", "n": "1"}),
                   change("DELETE", 1, 100, before={"id": 1})], 0)
    assert list(manifest(tmp_path).values()) == [0]
    assert state(tmp_path) == {}


@pytest.mark.slow
def test_spark_reads_the_state_with_its_types(spark: Any, tmp_path: Path) -> None:
    from plugin_framework.spark import read_state

    work = Workload(seed=3)
    writer = TableStateWriter(str(tmp_path), file_rows=10)
    for batch_id in range(5):
        apply(writer, work.batch(20), batch_id)
    df = read_state(spark, str(tmp_path), TABLE)
    assert {f.name: f.metadata.get("pg_type") for f in df.schema.fields} == {
        "id": "integer", "v": "text", "big": "text", "n": "numeric(12,2)",
        "_commit_lsn": None, "_lsn": None}
    assert {r["id"]: (r["v"], r["big"], str(r["n"])) for r in df.collect()} == work.rows


@pytest.mark.slow
@pytest.mark.parametrize("swapping", [False, True], ids=["in-place", "crashed-in-swap"])
def test_a_state_written_before_manifests_is_taken_over(spark: Any, tmp_path: Path,
                                                        swapping: bool) -> None:
    """Before the manifest, a state was a directory of Spark's Parquet files and a
    ``_pgdecode_batch-N`` file naming the batch that wrote it; that writer wrote each
    version beside the table (``.t.new-N``) and swapped it in with two renames, and a crash
    between them left only the new version."""
    from pyspark.sql import types as T

    from plugin_framework.spark import read_state

    target = tmp_path / "public" / "t"
    schema = T.StructType(
        [T.StructField("id", T.IntegerType(), True, {"pg_type": "integer"}),
         T.StructField("v", T.StringType(), True, {"pg_type": "text"}),
         T.StructField("big", T.StringType(), True, {"pg_type": "text"}),
         T.StructField("n", T.DecimalType(12, 2), True, {"pg_type": "numeric(12,2)"}),
         T.StructField("_commit_lsn", T.LongType()), T.StructField("_lsn", T.LongType())])
    old = [(i, f"v{i}", f"big{i}", Decimal("1.50"), 10, 10) for i in range(1, 31)]
    written = target.with_name(".t.new-4") if swapping else target
    spark.createDataFrame(old, schema).repartition(3).write.parquet(str(written))
    (written / "_pgdecode_batch-4").touch()
    if swapping:  # an older version, never finished: not taken
        target.with_name(".t.new-2").mkdir()
    writer = TableStateWriter(str(tmp_path), file_rows=10)
    apply(writer, [change("UPDATE", 0, 500, after={"id": 2, "v": "w", "big": None, "n": "2"},
                          toast=("big",))], 4)  # batch 4 again: had
    apply(writer, [change("UPDATE", 0, 600, after={"id": 3, "v": "w", "big": None, "n": "2"},
                          toast=("big",)),
                   change("DELETE", 1, 600, before={"id": 4})], 5)
    expected = {i: (f"v{i}", f"big{i}", "1.50") for i in range(1, 31) if i != 4}
    expected[3] = ("w", "big3", "2.00")
    assert state(tmp_path) == expected
    assert not (target / "_pgdecode_batch-4").exists()
    assert read_state(spark, str(tmp_path), TABLE).count() == 29


FULL = [{"name": "a", "type": "integer", "key": True},
        {"name": "b", "type": "integer", "key": True}]


def full_change(op: str, seq: int, commit_lsn: int, old: tuple[int, int] | None,
                new: tuple[int, int] | None) -> dict[str, Any]:
    """A change row of a REPLICA IDENTITY FULL table (a int, b int): every column the key,
    the old row whole."""
    import json

    def text(row: tuple[int, int] | None) -> list[tuple[str, str | None]] | None:
        return None if row is None else [("a", str(row[0])), ("b", str(row[1]))]

    def as_json(row: tuple[int, int] | None) -> str | None:
        return None if row is None else json.dumps({"a": row[0], "b": row[1]})

    return {"schema": "public", "table": "t", "op": op, "seq": seq, "lsn": commit_lsn + seq,
            "commit_lsn": commit_lsn, "commit_time": None, "key": text(old or new),
            "before": text(old), "after": text(new), "before_json": as_json(old),
            "after_json": as_json(new), "unchanged_toast": [], "columns": FULL}


def full_state(path: Path) -> Counter[tuple[int, int]]:
    files = StateFiles.at(str(path), TABLE)
    found = files.recover()
    assert found is not None
    return Counter((r["a"], r["b"]) for r in files.read(list(found.files)).to_pylist())


def test_equal_rows_of_a_table_keyed_by_every_column_are_counted(tmp_path: Path) -> None:
    """A REPLICA IDENTITY FULL table without a primary key: random batches of inserts of
    rows it may hold already, deletes and updates of one of equal rows, TRUNCATE, in files of
    5 rows; after each batch the state holds each row as many times as the table does."""
    r = random.Random(3)
    table: Counter[tuple[int, int]] = Counter()
    writer = TableStateWriter(str(tmp_path), file_rows=5)
    lsn = 1000
    for batch_id in range(60):
        rows = []
        for seq in range(r.choice((1, 4, 15))):
            lsn += 10
            present = sorted(table.elements())
            choice = r.random()
            new = (r.randrange(4), r.randrange(3))
            if choice < 0.02:
                rows.append(full_change("TRUNCATE", seq, lsn, None, None))
                rows[-1]["key"] = None
                table.clear()
            elif choice < 0.5 or not present:
                rows.append(full_change("INSERT", seq, lsn, None, new))
                table[new] += 1
            elif choice < 0.75:
                old = r.choice(present)
                rows.append(full_change("DELETE", seq, lsn, old, None))
                table[old] -= 1
            else:
                old = r.choice(present)
                rows.append(full_change("UPDATE", seq, lsn, old, new))
                table[old] -= 1
                table[new] += 1
        apply(writer, rows, batch_id)
        assert full_state(tmp_path) == +table, batch_id
    assert any(n > 1 for n in table.values())


def test_a_key_given_later_is_not_looked_for_by_the_old_keys_bounds(tmp_path: Path) -> None:
    """The FULL table's state is first keyed by every column (file bounds of ``a``); then
    by its primary key ``b`` (``keys``): a delete finds its row by ``b``, in whichever file
    it is, not by the bounds of ``a``."""
    rows = [full_change("INSERT", i, 1000, None, (i, 1000 - i)) for i in range(1, 101)]
    apply(TableStateWriter(str(tmp_path), file_rows=10), rows, 0)
    keyed = TableStateWriter(str(tmp_path), file_rows=10, keys={TABLE: ["b"]})
    info = keyed.keyed(rows_info("public", "t", rows))
    assert info.key_columns == ("b",) and info.primary
    gone = [full_change("DELETE", 0, 2000, (5, 995), None),
            full_change("UPDATE", 1, 2000, (50, 950), (51, 950))]
    keyed.apply(None, gone, info, 1)
    expected = Counter((i, 1000 - i) for i in range(1, 101) if i not in (5, 50))
    expected[(51, 950)] += 1
    assert full_state(tmp_path) == expected
    # a key the rows do not have (added to the table later) is not used: they are counted
    later = TableStateWriter(str(tmp_path), keys={TABLE: ["c"]}).keyed(
        rows_info("public", "t", rows))
    assert later.key_columns == ("a", "b") and not later.primary


@pytest.mark.parametrize("sink", ["state", "delta", "history"])
def test_an_unknown_unchanged_toast_value_is_written_as_null_and_said_so(
        sink: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An update that leaves a TOAST value unchanged in a row the target never had (a mirror
    started without a snapshot) is written with that value NULL: the documented policy, and
    a warning per table and batch names the table, the rows and the column. A known value is
    carried forward without one."""
    from plugin_framework.spark.mirrors.delta import DeltaTableWriter
    from plugin_framework.spark.mirrors.deltatables import read_delta
    from plugin_framework.spark.mirrors.history import HistoryWriter

    writer = {"state": TableStateWriter, "delta": DeltaTableWriter,
              "history": HistoryWriter}[sink](str(tmp_path))
    batches = [
        [change("INSERT", 0, 1000, after={"id": 1, "v": "a", "big": "B1", "n": "1.00"}),
         change("UPDATE", 1, 1000, after={"id": 5, "v": "x", "big": None, "n": "2.00"},
                toast=("big",))],
        [change("UPDATE", 0, 2000, after={"id": 1, "v": "b", "big": None, "n": "3.00"},
                toast=("big",)),
         change("UPDATE", 1, 2000, after={"id": 7, "v": "y", "big": None, "n": "4.00"},
                toast=("big",))],
    ]
    warned = []
    for batch_id, rows in enumerate(batches):
        caplog.clear()
        with caplog.at_level("WARNING", logger="plugin_framework.spark.sinks"):
            writer.apply(None, rows, rows_info("public", "t", rows), batch_id)
        warned.append([r.getMessage() for r in caplog.records])
    if sink == "state":
        held = state(tmp_path)
    else:
        held = {r["id"]: (r["v"], r["big"], str(r["n"]))
                for r in read_delta(str(tmp_path), TABLE).to_pyarrow_table().to_pylist()
                if sink == "delta" or r["_is_current"]}
    assert held == {1: ("b", "B1", "3.00"), 5: ("x", None, "2.00"), 7: ("y", None, "4.00")}
    for messages in warned:
        assert len(messages) == 1, messages
        assert messages[0].startswith("public.t: 1 row(s) of this batch left TOAST values "
                                      "unchanged (big)"), messages


def sink_rows(sink: str, path: Path) -> list[dict[str, Any]]:
    """The rows a sink ("state", "delta", "history": its current versions) holds of public.t
    at ``path``."""
    from plugin_framework.spark.mirrors.deltatables import read_delta

    if sink == "state":
        files = StateFiles.at(str(path), TABLE)
        manifest = files.recover()
        assert manifest is not None
        return files.read(list(manifest.files)).to_pylist()
    return [r for r in read_delta(str(path), TABLE).to_pyarrow_table().to_pylist()
            if sink == "delta" or r["_is_current"]]


@pytest.mark.parametrize("sink", ["state", "delta", "history"])
def test_an_unknown_unchanged_toast_value_is_said_so_in_a_batch_that_alters_the_table(
        sink: str, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same policy where a batch redescribes the table (ADD COLUMN) and the sinks merge
    it in Spark (merge_state, the history's rewrite: fill_from)."""
    from plugin_framework.spark.mirrors.delta import DeltaTableWriter
    from plugin_framework.spark.mirrors.history import HistoryWriter

    writer = {"state": TableStateWriter, "delta": DeltaTableWriter,
              "history": HistoryWriter}[sink](str(tmp_path))
    first = [change("INSERT", 0, 1000, after={"id": 1, "v": "a", "big": "B1", "n": "1.00"})]
    writer.apply(spark, first, rows_info("public", "t", first), 0)
    altered = [change("UPDATE", 0, 2000, after={"id": 1, "v": "b", "big": None, "n": "3.00",
                                                "e": "5"}, toast=("big",)),
               change("UPDATE", 1, 2000, after={"id": 7, "v": "y", "big": None, "n": "4.00",
                                                "e": "6"}, toast=("big",))]
    for row in altered:
        row["columns"] = [*COLUMNS, {"name": "e", "type": "integer", "key": False}]
    with caplog.at_level("WARNING", logger="plugin_framework.spark.sinks"):
        writer.apply(spark, altered, rows_info("public", "t", altered), 1)
    rows = sink_rows(sink, tmp_path)
    assert {r["id"]: (r["v"], r["big"], r["e"]) for r in rows} == {1: ("b", "B1", 5),
                                                                  7: ("y", None, 6)}
    messages = [r.getMessage() for r in caplog.records]
    toast = [m for m in messages if "TOAST" in m]
    assert len(toast) == 1 and toast[0].startswith(
        "public.t: 1 row(s) of this batch left TOAST values unchanged (big)"), messages
    # called by hand, with no stream to read the table again: the ALTER TABLE policy, said
    assert [m for m in messages if "TOAST" not in m] == [
        "public.t: its description changed (ALTER TABLE) and the mirror is not read again "
        "(this stream cannot read tables again): columns added are NULL in older rows until "
        "they change, a rename is guessed by place and type (docs/spark.md, \"ALTER TABLE\")"]


@pytest.mark.parametrize("sink", ["state", "delta", "history"])
@pytest.mark.parametrize(("column", "held", "new_type", "converts"), [
    ("v", "a", "integer", False),  # not a number: Spark's ANSI cast would raise its own error
    ("n", "1.50", "integer", False),  # Spark truncates to 1 where PostgreSQL rounds to 2
    ("v", "012", "integer", False),  # 12, but not the value back: PostgreSQL's parse is not Spark's
    ("v", "12", "integer", True),
    ("n", "3.00", "bigint", True),
])
def test_a_retyped_column_is_converted_only_where_the_value_comes_back(
        sink: str, column: str, held: str, new_type: str, converts: bool, spark: Any,
        tmp_path: Path) -> None:
    """ALTER COLUMN ... TYPE rewrites the source table, and logical decoding sends none of
    the rewritten rows: the sinks convert the rows they hold themselves. They do so where
    Spark's cast of each value converts back to it; anything else is refused, naming the
    table, the column and a value, never a NULL or another number."""
    from plugin_framework.spark.columns.descriptions import SchemaChangeError
    from plugin_framework.spark.mirrors.delta import DeltaTableWriter
    from plugin_framework.spark.mirrors.history import HistoryWriter

    writer = {"state": TableStateWriter, "delta": DeltaTableWriter,
              "history": HistoryWriter}[sink](str(tmp_path))
    values = {"id": 1, "v": "x", "big": "B1", "n": "1.00", column: held}
    first = [change("INSERT", 0, 1000, after=values)]
    writer.apply(spark, first, rows_info("public", "t", first), 0)
    altered = [change("INSERT", 0, 2000, after={"id": 2, "v": "7", "big": "B2", "n": "4"})]
    altered[0]["columns"] = [{**c, "type": new_type} if c["name"] == column else c
                             for c in COLUMNS]
    if not converts:
        with pytest.raises(SchemaChangeError) as raised:
            writer.apply(spark, altered, rows_info("public", "t", altered), 1)
        assert f"public.t: column {column} is now" in str(raised.value)
        assert repr(held) in str(raised.value) or str(held) in str(raised.value)
        return
    writer.apply(spark, altered, rows_info("public", "t", altered), 1)
    rows = sink_rows(sink, tmp_path)
    got = {r["id"]: r[column] for r in rows}
    assert got == {1: int(held.split(".")[0]), 2: int({"v": "7", "n": "4"}[column])}
