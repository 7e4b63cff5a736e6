"""``capable``: whether an output has an optional capability, decided without running any
of its members (typing's isinstance on Python 3.11 reads each with hasattr, which runs a
property: the Spark emitter's checkpoint was opened, without its slot, by the question)."""

from __future__ import annotations

from typing import Any

from plugin_framework.framework.output_protocol import (
    RecordingSnapshots,
    Rewinding,
    WritingMany,
    capable,
)


class Explodes(Exception):
    pass


class Recording:
    """Every member of RecordingSnapshots, structurally (not naming it), its properties
    raising when read."""

    @property
    def snapshot_state(self) -> str | None:
        raise Explodes("snapshot_state read")

    @property
    def resume_incremental(self) -> dict[str, Any] | None:
        raise Explodes("resume_incremental read")

    def begin_snapshot(self) -> None: ...
    def note_incremental(self, state: dict[str, Any] | None) -> None: ...
    def snapshot_checkpoint(self) -> None: ...
    def continue_snapshot(self) -> None: ...
    def end_snapshot(self) -> None: ...


class Declared(RecordingSnapshots):
    """Names the protocol as its base (as pgdecode's outputs do), its properties raising."""

    @property
    def snapshot_state(self) -> str | None:
        raise Explodes("snapshot_state read")


class Partial:
    """Some members of RecordingSnapshots, not all."""

    @property
    def snapshot_state(self) -> str | None:
        raise Explodes("snapshot_state read")

    def begin_snapshot(self) -> None: ...


class Rewinds:
    def __init__(self) -> None:
        self.savepoint = lambda: 0  # an attribute of the instance counts too

    def rollback_to(self, savepoint: Any) -> None: ...


def test_a_capability_is_found_without_reading_a_property() -> None:
    assert capable(Recording(), RecordingSnapshots)
    assert capable(Declared(), RecordingSnapshots)
    assert not capable(Partial(), RecordingSnapshots)


def test_members_of_the_instance_count_and_missing_ones_say_no() -> None:
    assert capable(Rewinds(), Rewinding)
    assert not capable(Rewinds(), WritingMany)
    assert not capable(object(), Rewinding)
