"""Every state file pgdecode reads back, damaged (hypothesis): FILE.progress, a FILE.hold
entry, the Spark checkpoint's entries and stored batches, a mirror table's manifest, and a
capture, each written by the real writer code (a capture: by a real ``pgdecode capture``
run). Each damage is refused with a message that names the file and says what to do, or
the file is read as exactly what was written; the files are never changed.

Two kinds of damage:

- what a disk or a copy does: truncation, flipped bits, members reordered or repeated, the
  whole wrapped in brackets, a frame dropped, repeated or moved. Refused, or read exactly;
- what a hand edit (or a file written before checksums) does: a member of another type,
  a value wrapped in a list, a value nested thousands deep, in a file whose checksum is left
  out (JSON files) or made to match (hold entries). Refused, always.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.scripted import Rec, StreamRec, StreamTwoPhaseRec, Wal, alter, ins, upd

from plugin_framework import LSN, FileOutput, Pipeline
from plugin_framework.framework import OutputError
from plugin_framework.framework.hold import HoldError, HoldStore
from plugin_framework.framework.outputs import new_record
from plugin_framework.framework.spool import SpoolBudget
from plugin_framework.framework.statecheck import StateFileError, read_progress

FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


# --- damage -----------------------------------------------------------------------------------

Path_ = tuple[str | int, ...]  # where a value is in a JSON document


def paths(value: Any, at: Path_ = ()) -> Iterator[Path_]:
    """Every place in a JSON document that holds a value other than null (the root aside)."""
    if at and value is not None:
        yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*at, i))


def replaced(document: Any, at: Path_, new: Any) -> Any:
    """A copy of ``document`` with the value at ``at`` replaced by ``new``."""
    if not at:
        return new
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[at[0]] = replaced(document[at[0]], at[1:], new)  # type: ignore[index]
    return copy


def value_at(document: Any, at: Path_) -> Any:
    for step in at:
        document = document[step]
    return document


def kind(value: Any) -> str:
    return type(value).__name__


# values of every JSON type but null (null is allowed where a member is optional)
OTHERS = [0, 7, -1, 2**70, 1.5, "x", "0/16B3748", True, False, [], [1], {}, {"a": 1}]
DEEP = 5000  # nested past what the JSON reader recurses through


@st.composite
def hand_edits(draw: st.DrawFn, document: Any) -> str:
    """A JSON document with one value of another type, wrapped in a list, or nested
    thousands deep, as text."""
    at = draw(st.sampled_from(list(paths(document))))
    old = value_at(document, at)
    how = draw(st.sampled_from(["swap", "wrap", "deep"]))
    if how == "swap":
        new = draw(st.sampled_from([v for v in OTHERS if kind(v) != kind(old)]))
        return json.dumps(replaced(document, at, new))
    if how == "wrap":
        return json.dumps(replaced(document, at, [old]))
    marker = "\u0000MARK\u0000"
    text = json.dumps(replaced(document, at, marker))
    return text.replace(json.dumps(marker), "[" * DEEP + json.dumps(old) + "]" * DEEP)


@st.composite
def byte_damage(draw: st.DrawFn, data: bytes) -> bytes:
    """What a disk or a copy does: cut short, or bits flipped."""
    if draw(st.booleans()):
        return data[:draw(st.integers(0, len(data) - 1))]
    damaged = bytearray(data)
    for bit in draw(st.lists(st.integers(0, len(data) * 8 - 1), min_size=1, max_size=3)):
        damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


@st.composite
def json_damage(draw: st.DrawFn, data: bytes) -> bytes:
    """``byte_damage``, or the members of one object reordered, one repeated, the whole
    wrapped: each with the checksum the file was written with."""
    how = draw(st.sampled_from(["bytes", "reorder", "repeat", "wrap"]))
    if how == "bytes":
        return draw(byte_damage(data))
    document = json.loads(data)
    if how == "wrap":
        return b"[" + data + b"]"
    objects = [at for at in [(), *paths(document)]
               if isinstance(value_at(document, at), dict) and len(value_at(document, at)) > 1]
    at = draw(st.sampled_from(objects))
    obj = value_at(document, at)
    keys = list(obj)
    if how == "reorder":
        order = draw(st.permutations(keys))
        return json.dumps(replaced(document, at, {k: obj[k] for k in order})).encode()
    key = draw(st.sampled_from(keys))
    text = json.dumps(replaced(document, at, obj))
    inner = json.dumps(obj)
    return text.replace(inner, "{" + f"{json.dumps(key)}: {json.dumps(obj[key])}, "
                        + inner[1:], 1).encode()


def unchanged(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def attempt(read: Callable[[], Any], refusal: type[Exception], names: str) -> Any:
    """``read()``'s result, or None when it refused with a message naming ``names`` and
    saying what to do."""
    try:
        return read()
    except refusal as exc:
        message = str(exc)
        assert names in message, message
        assert "Restore" in message or "Record the capture again" in message, message
        return None


# --- FILE.progress ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def progressed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output file as FileOutput leaves it: in the middle of an incremental snapshot,
    with a streamed transaction open, bound to slot "s" with two-phase on, after some
    lines that were there before it."""
    directory = tmp_path_factory.mktemp("progress")
    path = directory / "out"
    path.write_bytes(b"a line that was there first\n")
    out = FileOutput(path)
    out.claim("s", two_phase=True)
    out.begin_snapshot()
    for n in range(5):
        out.write(new_record(LSN(0x1000 + n), 700 + n, f'{{"row": {n}}}'.encode()))
    out.note_open_streams([712, 713])
    out.note_incremental({
        "slot": "s", "queue": ["public.b", "public.c"], "done": ["public.d"],
        "after": {"public.b": ["17", None]}, "table": "public.a",
        "ranges": {"public.a": [[["5"], ["100"]], [None, ["200"]]]},
        "starts": ["public.c"], "moved": {"public.a": [["7"], ["9"]]}})
    out.mark(LSN(0x1010))
    out.flush()
    out.close()
    return path


def read_output(path: Path) -> Any:
    """What a run resuming ``path`` would go on from, or None when it is refused."""
    def read() -> Any:
        out = FileOutput(path)
        try:
            return (read_progress(Path(f"{path}.progress").read_bytes()), out.resume_lsn,
                    out.resume_open_streams, out.resume_incremental, out.snapshot_state)
        finally:
            out.close()
    return attempt(read, OutputError, f"{path}.progress")


def damaged_copy(source: Path, work: Path, name: str, data: bytes) -> Path:
    """A copy of ``source``'s directory in ``work`` with file ``name`` holding ``data``."""
    target = work / "copy"
    shutil.copytree(source, target)
    (target / name).write_bytes(data)
    return target


@FUZZ
@given(st.data())
def test_a_progress_file_damaged_on_disk_is_refused_or_read_exactly(
        progressed: Path, data: st.DataObject) -> None:
    original = read_output(progressed)
    assert original is not None and original[2] == [712, 713]  # all of it is there
    written = Path(f"{progressed}.progress").read_bytes()
    damaged = data.draw(json_damage(written))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(progressed.parent, Path(work), "out.progress", damaged)
        before = unchanged(copy)
        got = read_output(copy / "out")
        assert got is None or got == original
        assert unchanged(copy) == before


@FUZZ
@given(st.data())
def test_a_progress_file_edited_by_hand_is_refused(progressed: Path,
                                                   data: st.DataObject) -> None:
    document = json.loads(Path(f"{progressed}.progress").read_bytes())
    del document["crc32"]  # as a file written before checksums: its members are all
    edited = data.draw(hand_edits(document))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(progressed.parent, Path(work), "out.progress", edited.encode())
        before = unchanged(copy)
        assert read_output(copy / "out") is None
        assert unchanged(copy) == before


# --- FILE.hold entries ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hold directories a pipeline leaves at a PREPARE (tests/framework/test_hold.py's streamed
    case): a whole transaction for a plugin without stream callbacks (out1), the rest of a
    stream for one with them (out0)."""
    directory = tmp_path_factory.mktemp("hold")
    wal = Wal()
    wal.table("t", "id", "v")
    wal.txn(760, alter("t", "id", "v"), ins("t", "0", "z"))
    wal.block(770, ins("t", "1", "a"), ins("t", "2", "b", sub=771))
    wal.block(770, upd("t", "1", "1", "c"), ins("t", "3", "d", sub=772))
    wal.stream_prepare(770, "streamed")
    plugins = [StreamRec(), Rec(), StreamTwoPhaseRec()]
    p = Pipeline(proto_version=4, slot_name="s")
    for i, plugin in enumerate(plugins):
        p.add(plugin, output=FileOutput(str(directory / f"out{i}")))
    p.startup()
    for message, lsn in wal.items:
        p.feed(message, lsn)
        p.flush()
    for m in p.members:
        m.ctx.output.close()
    assert [len(list(directory.glob(f"out{i}.hold/*.hold"))) for i in range(3)] == [1, 1, 0]
    return directory


def read_held(directory: Path) -> Any:
    """Every entry of the hold directories, as a restart restores it; None if refused."""
    def read() -> Any:
        found = []
        for hold in sorted(directory.glob("*.hold")):
            for h in HoldStore(hold).load(SpoolBudget(1 << 20)):
                rels = [(r.relation_id, r.namespace, r.name, r.replica_identity, r.columns)
                        for r in h.relations.values()]
                found.append((h.kind, h.slot, h.txn, h.prepare_end, rels, h.aborted_subxids,
                              h.streamed_subxids, h.catalog_changes, h.remainder_lsns,
                              list(h.frames), h.outcome_end))
        return found
    return attempt(read, HoldError, ".hold")


def entries(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.glob("*.hold/*.hold"))


@FUZZ
@given(st.data())
def test_a_hold_entry_damaged_on_disk_is_refused_or_read_exactly(
        held: Path, data: st.DataObject) -> None:
    original = read_held(held)
    assert original is not None and len(original) == 2
    name = data.draw(st.sampled_from(entries(held)))
    damaged = data.draw(byte_damage((held / name).read_bytes()))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(held, Path(work), name, damaged)
        before = unchanged(copy)
        got = read_held(copy)
        assert got is None or got == original
        assert unchanged(copy) == before


def resigned(entry: bytes, header: str) -> bytes:
    """A hold entry with another header line, its checksum made to match."""
    body = header.encode() + b"\n" + entry[entry.index(b"\n") + 1:-12]
    return body + entry[-12:-4] + zlib.crc32(body).to_bytes(4, "big")


@FUZZ
@given(st.data())
def test_a_hold_entry_edited_by_hand_is_refused(held: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(entries(held)))
    entry = (held / name).read_bytes()
    header = json.loads(entry[:entry.index(b"\n")])
    edited = resigned(entry, data.draw(hand_edits(header)))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(held, Path(work), name, edited)
        before = unchanged(copy)
        assert read_held(copy) is None
        assert unchanged(copy) == before


# --- the Spark checkpoint ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint as the spark emitter leaves it: five batches committed (one with its
    ack held back), an initial copy under way, and a batch of snapshot rows begun (stored,
    with the snapshot's progress) that fn has not finished."""
    pa = pytest.importorskip("pyarrow")
    from plugin_framework.spark.foreachbatch.checkpoint import BatchRange, Checkpoint

    directory = tmp_path_factory.mktemp("checkpoint")
    ck = Checkpoint(directory, "s")
    ck.set_snapshot_state("copying")
    for n in range(5):
        batch = BatchRange(n, LSN(0x100 * n), LSN(0x100 * (n + 1)), 10 + n, 2)
        ck.begin(batch)
        ck.commit(batch, LSN(0x100 * n + 0x80) if n == 3 else None)
    progress = {"slot": "s", "queue": ["public.t"], "done": [], "after": {"public.t": ["9"]}}
    rows = pa.Table.from_pylist([{"id": i, "v": f"row {i}"} for i in range(10)])
    ck.begin(BatchRange(5, LSN(0x500), LSN(0x500), 10, 1, progress, True), rows)
    return directory


def read_checkpoint(directory: Path) -> Any:
    from plugin_framework.spark.foreachbatch.checkpoint import Checkpoint, CheckpointError

    def read() -> Any:
        ck = Checkpoint(directory, "s")
        stored = None if ck.pending is None else ck.stored_rows(ck.pending).to_pylist()
        return (ck.pending, ck.last_committed, ck.acked, ck.snapshot_state, ck.history(),
                ck.snapshot_progress, ck.id, stored)
    return attempt(read, CheckpointError, str(directory))


def checkpoint_files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


@FUZZ
@given(st.data())
def test_a_checkpoint_damaged_on_disk_is_refused_or_read_exactly(
        checkpointed: Path, data: st.DataObject) -> None:
    original = read_checkpoint(checkpointed)
    assert original is not None and original[0].stored and original[2] == LSN(0x500)
    name = data.draw(st.sampled_from(checkpoint_files(checkpointed)))
    written = (checkpointed / name).read_bytes()
    damaged = data.draw(byte_damage(written) if name.startswith("data/")
                        else json_damage(written))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(checkpointed, Path(work), name, damaged)
        before = unchanged(copy)
        got = read_checkpoint(copy)
        assert got is None or got == original
        assert unchanged(copy) == before


@FUZZ
@given(st.data())
def test_a_checkpoint_entry_edited_by_hand_is_refused(checkpointed: Path,
                                                      data: st.DataObject) -> None:
    name = data.draw(st.sampled_from([n for n in checkpoint_files(checkpointed)
                                      if not n.startswith("data/")]))
    document = json.loads((checkpointed / name).read_bytes())
    del document["crc32"]
    edited = data.draw(hand_edits(document))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(checkpointed, Path(work), name, edited.encode())
        before = unchanged(copy)
        assert read_checkpoint(copy) is None
        assert unchanged(copy) == before


@pytest.mark.parametrize("damage", ["an offsets entry gone", "a commits entry gone",
                                    "an entry under another batch's name",
                                    "the stored rows gone", "an ack past its batch's end",
                                    "a batch that ends before it starts"])
def test_a_checkpoint_whose_entries_do_not_agree_is_refused(
        checkpointed: Path, tmp_path: Path, damage: str) -> None:
    copy = tmp_path / "ck"
    shutil.copytree(checkpointed, copy)

    def edit(name: str, **members: Any) -> None:
        document = json.loads((copy / name).read_bytes())
        del document["crc32"]
        (copy / name).write_text(json.dumps({**document, **members}))

    says = {"an offsets entry gone": "offsets/ has no entry of batch 2",
            "a commits entry gone": "commits/ has no entry of batch 2",
            "an entry under another batch's name": '"batch_id" is 1, not one of 2',
            "the stored rows gone": "it holds the rows of batch 5, which must be delivered "
                                    "again, and cannot be read",
            "an ack past its batch's end": 'its "ack" 0/400 is past the end of its batch, 0/300',
            "a batch that ends before it starts": 'its "start" 0/400 is past its "end" 0/300',
            }[damage]
    if damage == "an offsets entry gone":
        (copy / "offsets" / "2").unlink()
    elif damage == "a commits entry gone":
        (copy / "commits" / "2").unlink()
    elif damage == "an entry under another batch's name":
        shutil.copy(copy / "offsets" / "1", copy / "offsets" / "2")
    elif damage == "the stored rows gone":
        (copy / "data" / "5.arrow").unlink()
    elif damage == "an ack past its batch's end":
        edit("commits/2", ack="0/400")
    else:
        edit("offsets/2", start="0/400")
    before = unchanged(copy)
    from plugin_framework.spark.foreachbatch.checkpoint import Checkpoint, CheckpointError

    with pytest.raises(CheckpointError) as refused:
        Checkpoint(copy, "s")
    assert says in str(refused.value)
    assert "nothing was delivered or acknowledged. Restore the checkpoint" in str(refused.value)
    assert unchanged(copy) == before


# --- a mirror table's manifest ----------------------------------------------------------------


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table's Parquet state as TableStateWriter leaves it after a few batches
    (tests/support/sinkrows.py's workload, test_spark_statefiles.py's): several files, their
    bounds, a manifest."""
    pytest.importorskip("pyarrow")
    from support.sinkrows import Workload

    from plugin_framework.spark.columns.descriptions import rows_info
    from plugin_framework.spark.mirrors.parquet import TableStateWriter

    directory = tmp_path_factory.mktemp("mirror")
    writer = TableStateWriter(str(directory), file_rows=20)
    work = Workload(seed=3)
    for batch in range(4):
        rows = work.batch(40)
        writer.apply(None, rows, rows_info("public", "t", rows), batch)
    return directory


def read_manifest(directory: Path) -> Any:
    from plugin_framework.spark.mirrors.statefiles import StateFiles

    return attempt(lambda: StateFiles.at(str(directory), "public.t").recover(),
                   StateFileError, "state-3.json")


@FUZZ
@given(st.data())
def test_a_manifest_damaged_on_disk_is_refused_or_read_exactly(
        mirrored: Path, data: st.DataObject) -> None:
    original = read_manifest(mirrored)
    assert original is not None and len(original.files) >= 2 and original.bounds
    name = "public/t/_pgdecode/state-3.json"
    damaged = data.draw(json_damage((mirrored / name).read_bytes()))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(mirrored, Path(work), name, damaged)
        before = unchanged(copy)
        got = read_manifest(copy)
        assert got is None or got == original
        assert unchanged(copy) == before


@FUZZ
@given(st.data())
def test_a_manifest_edited_by_hand_is_refused(mirrored: Path, data: st.DataObject) -> None:
    name = "public/t/_pgdecode/state-3.json"
    document = json.loads((mirrored / name).read_bytes())
    del document["crc32"]
    edited = data.draw(hand_edits(document))
    with tempfile.TemporaryDirectory() as work:
        copy = damaged_copy(mirrored, Path(work), name, edited.encode())
        before = unchanged(copy)
        assert read_manifest(copy) is None
        assert unchanged(copy) == before


def test_a_manifest_that_names_a_file_outside_its_table_is_refused(mirrored: Path,
                                                                   tmp_path: Path) -> None:
    """A file name that would have the commit's clean-up move or delete files elsewhere."""
    copy = tmp_path / "mirror"
    shutil.copytree(mirrored, copy)
    path = copy / "public/t/_pgdecode/state-3.json"
    document = json.loads(path.read_bytes())
    del document["crc32"]
    document["files"]["../../other/part-0.parquet"] = 1
    path.write_text(json.dumps(document))
    before = unchanged(copy)
    assert read_manifest(copy) is None
    assert unchanged(copy) == before


# --- captures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(pg_module_db: Any, probes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A capture of a real server's stream (``pgdecode capture``): three small transactions
    and one large enough to be streamed."""
    from support.streamkit import cli_env, create_slot, current_lsn, query, run_cli

    db = pg_module_db
    query(db.conninfo, "CREATE TABLE t (id int PRIMARY KEY, v text); "
                       "CREATE PUBLICATION p FOR TABLE t")
    slot = f"{db.dbname}_fuzz"
    create_slot(db.conninfo, slot)
    for first in (1, 11, 21):
        query(db.conninfo, "INSERT INTO t SELECT g, 'row ' || g "
                           "FROM generate_series(%s::int, %s::int) g", (first, first + 9))
    query(db.conninfo, "INSERT INTO t SELECT g, repeat('m', 500) FROM generate_series(100, 299) g")
    capture = tmp_path_factory.mktemp("capture") / "c.cap"
    result = run_cli(["capture", "-d", db.conninfo, "-S", slot, "--publication", "p", "-E",
                      str(current_lsn(db.conninfo)), "-f", str(capture)], env=cli_env(probes))
    assert result.returncode == 0, result.stderr
    return capture


def capture_frames(data: bytes) -> tuple[int, list[tuple[int, int]]]:
    """Where a capture's frames are: the end of its header, and each frame's (start, end)."""
    offset = data.index(b"\n", data.index(b"\n") + 1) + 1 + 4
    header_end, spans = offset, []
    while offset < len(data):
        end = offset + 8 + int.from_bytes(data[offset:offset + 4], "big")
        spans.append((offset, end))
        offset = end
    return header_end, spans


@st.composite
def capture_damage(draw: st.DrawFn, data: bytes) -> bytes:
    """``byte_damage``, or a frame dropped, repeated, or moved after the next one."""
    how = draw(st.sampled_from(["bytes", "drop", "repeat", "move"]))
    if how == "bytes":
        return draw(byte_damage(data))
    _, spans = capture_frames(data)
    i = draw(st.integers(0, len(spans) - 2))
    (start, end), (_, after) = spans[i], spans[i + 1]
    if how == "drop":
        return data[:start] + data[end:]
    if how == "repeat":
        return data[:end] + data[start:]
    return data[:start] + data[end:after] + data[start:end] + data[after:]


def read_recorded(path: Path) -> list[Any] | None:
    """The messages of a capture that ``verify_capture`` accepts, or None when it is refused
    (saying where, or, for its header, naming it)."""
    from plugin_framework.sources.capture import CaptureFormatError, read_capture, verify_capture

    try:
        verified = verify_capture(path)
    except CaptureFormatError as exc:
        assert str(path) in str(exc) and "header" in str(exc), str(exc)
        return None
    if verified.damage is not None:
        assert "frame" in verified.damage, verified.damage
        return None
    return list(read_capture(path)[1])


@FUZZ
@given(st.data())
def test_a_capture_damaged_on_disk_is_refused_or_read_as_a_whole_prefix(
        recorded: Path, data: st.DataObject) -> None:
    """Accepted, a damaged capture holds what was recorded up to a transaction boundary (a
    capture cut there is indistinguishable from one that stopped there), nothing else."""
    original = read_recorded(recorded)
    assert original is not None and len(original) > 40
    written = recorded.read_bytes()
    damaged = data.draw(capture_damage(written))
    with tempfile.TemporaryDirectory() as work:
        copy = Path(work) / "c.cap"
        copy.write_bytes(damaged)
        got = read_recorded(copy)
        assert got is None or got == original[:len(got)]
        assert copy.read_bytes() == damaged


def test_a_checkpoint_read_while_its_writer_goes_on_is_not_taken_for_damaged(
        tmp_path: Path) -> None:
    """Another thread (a status check, a test) reads the checkpoint while the stream's
    thread begins and commits batches with stored rows: what it reads may be a moment old,
    never refused as damage."""
    import threading

    pa = pytest.importorskip("pyarrow")
    from plugin_framework.spark.foreachbatch.checkpoint import RETAIN, BatchRange, Checkpoint

    writer = Checkpoint(tmp_path, "s")
    rows = pa.Table.from_pylist([{"id": i} for i in range(50)])
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for n in range(RETAIN + 150):  # (old entries purged too)
                batch = BatchRange(n, LSN(n), LSN(n + 1), 50, 1, None, True)
                writer.begin(batch, rows)
                writer.commit(batch)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=write)
    thread.start()
    reads = 0
    try:
        while not done.is_set():
            ck = Checkpoint(tmp_path, "s")  # (refused: CheckpointError, the test fails)
            if ck.pending is not None and ck.last_committed is not None:
                assert ck.pending.batch_id == ck.last_committed.batch_id + 1
            reads += 1
    finally:
        thread.join()
    assert not errors, errors
    assert reads > 10
