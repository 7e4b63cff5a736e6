"""The batch log's metadata (its id, its slot) is made once: a stream and a reader of its
checkpoint (a monitor, a test) starting at once agree on it, and the stream's slot is
recorded even where a reader made the directory first."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from plugin_framework.spark.foreachbatch.checkpoint import Checkpoint, CheckpointError


def open_at_once(directory: Path, slots: list[str | None]) -> tuple[list[Checkpoint],
                                                                     list[BaseException]]:
    """Checkpoint(directory, slot) for each slot, in threads let go at the same moment."""
    start = threading.Barrier(len(slots))
    opened: list[Checkpoint] = []
    errors: list[BaseException] = []

    def open_it(slot: str | None) -> None:
        start.wait()
        try:
            opened.append(Checkpoint(directory, slot))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=open_it, args=(slot,)) for slot in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return opened, errors


def test_checkpoints_opened_at_once_share_one_metadata(tmp_path: Path) -> None:
    """One stream (its slot) and five readers open a new checkpoint at the same moment."""
    for round_ in range(20):
        directory = tmp_path / f"ck{round_}"
        slots: list[str | None] = [None] * 6
        slots[round_ % 6] = "s"
        opened, errors = open_at_once(directory, slots)
        assert errors == []
        assert len({c.id for c in opened}) == 1, "two ids for one checkpoint"
        assert Checkpoint(directory).slot == "s"
        assert not list(directory.glob("*.tmp"))


def test_a_reader_first_leaves_the_slot_to_the_stream(tmp_path: Path) -> None:
    reader = Checkpoint(tmp_path / "ck")
    assert reader.slot is None
    stream = Checkpoint(tmp_path / "ck", "s")
    assert (stream.slot, stream.id) == ("s", reader.id)
    with pytest.raises(CheckpointError, match='belongs to slot "s"'):
        Checkpoint(tmp_path / "ck", "t")
