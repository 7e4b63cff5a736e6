"""FileOutput's FILE.progress, damaged for real on disk: what it records is checked against the
file before anything is cut back, written or acknowledged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.scripted import StreamTwoPhaseRec, Wal, emitting, feed, ins, pipeline

from plugin_framework import LSN, FileOutput
from plugin_framework.framework import MemoryOutput, OutputError
from plugin_framework.framework.outputs import OutputRecord, new_record
from plugin_framework.sources.errors import SourceError
from plugin_framework.sources.snapshots.ledger import check_snapshot_outputs


def written(path: Path, lines: int) -> dict[str, object]:
    """A file with ``lines`` records made durable at LSN 0/100+n; its progress as saved."""
    out = FileOutput(path)
    for n in range(lines):
        out.write(new_record(LSN(0x100 + n), 700 + n, f"line {n}".encode()))
        out.mark(LSN(0x100 + n))
        out.flush()
    out.close()
    progress: dict[str, object] = json.loads(Path(f"{path}.progress").read_text())
    return progress


def test_a_file_is_resumed_and_cut_back_to_its_durable_size(tmp_path: Path) -> None:
    path = tmp_path / "out"
    progress = written(path, 3)
    with path.open("ab") as f:
        f.write(b"torn tail of a transaction cut short")
    out = FileOutput(path)
    out.claim("s")  # first use, once the source has checked the slot
    out.close()
    assert out.resume_lsn == LSN(0x102)
    assert path.stat().st_size == progress["size"]
    assert path.read_bytes().splitlines() == [b"line 0", b"line 1", b"line 2"]


def test_a_file_opened_but_never_used_is_left_as_it_was(tmp_path: Path) -> None:
    """A run refused before streaming (the slot active elsewhere, say) opened the file but
    must not have cut or recorded anything: that happens at first use."""
    path = tmp_path / "out"
    written(path, 3)
    with path.open("ab") as f:
        f.write(b"torn tail")
    before, progress = path.read_bytes(), Path(f"{path}.progress").read_bytes()
    FileOutput(path).close()
    assert path.read_bytes() == before
    assert Path(f"{path}.progress").read_bytes() == progress
    fresh = tmp_path / "fresh"
    FileOutput(fresh).close()
    assert not Path(f"{fresh}.progress").exists()
    assert not fresh.exists()  # the file it had to create is not left behind, empty


def test_a_file_shorter_than_its_progress_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "out"
    progress = written(path, 3)
    size = int(progress["size"])  # type: ignore[call-overload]
    with path.open("r+b") as f:
        f.truncate(size - 7)  # the last line lost after it was acknowledged
    with pytest.raises(OutputError) as info:
        FileOutput(path)
    message = str(info.value)
    assert f"{path} has {size - 7} bytes" in message
    assert f"records {size} bytes" in message
    assert "re-create the slot" in message
    assert path.stat().st_size == size - 7  # neither cut nor extended
    assert json.loads(Path(f"{path}.progress").read_text()) == progress


def test_a_missing_file_with_progress_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out"
    written(path, 2)
    path.unlink()
    with pytest.raises(OutputError, match="has 0 bytes"):
        FileOutput(path)
    assert not path.exists()


@pytest.mark.parametrize("size", [-1, "12", 1.5, True, None])
def test_a_recorded_size_that_is_no_byte_count_is_damage(tmp_path: Path, size: object) -> None:
    """As a progress file written before checksums (or edited by hand) has it."""
    path = tmp_path / "out"
    progress = written(path, 1)
    del progress["crc32"]
    Path(f"{path}.progress").write_text(json.dumps({**progress, "size": size}))
    with pytest.raises(OutputError, match=rf'is damaged: "size" is {json.dumps(size)}, not a '
                                          r"count .*Nothing was cut.* re-create the slot"):
        FileOutput(path)


def test_a_file_cut_by_another_program_is_not_recorded_durable(tmp_path: Path) -> None:
    """The lock is advisory: a program that ignores it and cuts the file must not have
    FILE.progress record the size pgdecode wrote (which would disable the repair of a torn
    tail), nor the LSN reported durable."""
    path = tmp_path / "out"
    out = FileOutput(path)
    out.write(new_record(LSN(0x10), 1, b"first"))
    out.mark(LSN(0x10))
    assert out.flush() == LSN(0x10)
    progress = Path(f"{path}.progress").read_text()
    with path.open("r+b") as f:
        f.truncate(0)
    out.write(new_record(LSN(0x20), 2, b"second"))
    out.mark(LSN(0x20))
    # (appended at the new end: 7 bytes, where pgdecode counts 13)
    with pytest.raises(OutputError, match=r"has 7 bytes, fewer than the 13 written to it"):
        out.flush()
    with pytest.raises(OutputError, match="fewer than"):
        out.flush()  # nor later
    out.close()  # nor at close
    assert out.durable_lsn == LSN(0x10)
    assert Path(f"{path}.progress").read_text() == progress


def test_outputs_opened_before_a_failing_one_are_released(tmp_path: Path) -> None:
    """build_pipeline refused at the second file: the first is closed again (its lock
    released), not left open and locked for the rest of the process."""
    from plugin_framework import OutputPlugin
    from plugin_framework.app import PlannedEmitter, build_pipeline

    class Quiet(OutputPlugin):
        name = "quiet"

        def begin(self, ctx: object, txn: object) -> None: ...

        def change(self, ctx: object, txn: object, relation: object, change: object) -> None: ...

        def commit(self, ctx: object, txn: object, commit_lsn: object) -> None: ...

    first, second = tmp_path / "a", tmp_path / "missing" / "b"
    with pytest.raises(OutputError, match="cannot open"):
        build_pipeline([PlannedEmitter(Quiet(), {}, str(first)),
                        PlannedEmitter(Quiet(), {}, str(second))])
    FileOutput(first).close()
    assert not Path(f"{first}.progress").exists()  # never used: nothing recorded


def test_a_copy_begun_again_takes_back_its_record_with_its_rows(tmp_path: Path) -> None:
    """An initial copy this process began, then began again (a lost connection under
    --snapshot only copies again with a new slot): the file is cut back to where the first
    began, and so is what its progress records, at once; a run killed right then finds a
    record it can go on from (not one past the file's end, nor the first copy's keys)."""
    path = tmp_path / "out"
    written(path, 2)
    out = FileOutput(path)
    out.claim("s")
    before = path.stat().st_size
    out.begin_snapshot()
    for n in range(50):
        out.write(new_record(LSN(0x200), 0, f"copied row {n}".encode()))
    out.note_incremental({"slot": "s", "initial": True, "after": {"public.t": ["50"]}})
    out.snapshot_checkpoint()
    out.flush()
    copying = json.loads(Path(f"{path}.progress").read_text())
    assert copying["size"] > before and copying["incremental"]["after"]  # the case is there
    out.begin_snapshot()  # copied again: "killed" here, before anything more is written
    progress = json.loads(Path(f"{path}.progress").read_text())
    assert path.stat().st_size == before
    assert progress["size"] == before and progress["snapshot"] == "copying"
    assert "incremental" not in progress
    # what the next run does with them (a copy of both: this process still holds them)
    killed = tmp_path / "killed"
    killed.write_bytes(path.read_bytes())
    Path(f"{killed}.progress").write_bytes(Path(f"{path}.progress").read_bytes())
    resumed = FileOutput(killed)
    resumed.claim("s")
    assert resumed.resume_incremental is None and resumed.snapshot_state == "copying"
    resumed.close()
    out.close()


class OnlyRequired:
    """An Output with the protocol's required members only: none of the optional
    capabilities (outputs.Rewinding, Resuming, RecordingSnapshots, Batching, WritingMany)."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.durable_lsn = LSN(0)
        self._marked = LSN(0)

    def write(self, record: OutputRecord) -> None:
        self.records.append(record.data)

    def mark(self, lsn: LSN) -> None:
        self._marked = max(self._marked, lsn)

    def flush(self) -> LSN:
        self.durable_lsn = self._marked
        return self.durable_lsn

    def close(self) -> None:
        pass


def test_an_output_without_optional_capabilities_takes_every_kind_of_transaction() -> None:
    """Ordinary, streamed and prepared transactions reach an output that has none of the
    optional capabilities, line for line as they reach a MemoryOutput, and it is
    acknowledged to the end; --snapshot is refused for it (it cannot record an unfinished
    copy)."""
    wal = Wal()
    wal.table("t", "id")
    wal.txn(1200, ins("t", "1"))
    wal.block(1210, ins("t", "2"))
    wal.block(1210, ins("t", "3"))
    wal.stream_commit(1210)
    wal.prepared(1220, "g", ins("t", "4"))
    end, _ = wal.commit_prepared(1220, "g")
    plain = OnlyRequired()
    p, [reference, _] = pipeline(emitting(StreamTwoPhaseRec)(), emitting(StreamTwoPhaseRec)(),
                                 outputs=[MemoryOutput(), plain])
    feed(p, wal.items)
    assert [r.data for r in reference.records] == plain.records and plain.records
    assert p.flush() >= end
    with pytest.raises(SourceError, match="cannot record a copy"):
        check_snapshot_outputs(p)
