"""The ``Output`` protocol: where a plugin's records go (``OutputRecord``), and how far they
are durable; and the optional capabilities an output declares (``Rewinding``,
``WritingMany``, ``Resuming``, ``RecordingSnapshots``, ``Batching``), which the framework and
the sources test for with ``capable``. framework/outputs.py has the outputs themselves.

In PostgreSQL, OutputPluginWrite hands the ``out`` buffer to the walsender (or to the SQL
function's tuplestore); here each write is an ``OutputRecord`` handed to the plugin's Output.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeGuard, TypeVar, runtime_checkable

from plugin_framework._frozen import frozen_setters, new_object
from plugin_framework.framework.hold import HoldStore
from plugin_framework.protocol import LSN


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One write of a plugin: the LSN and xid it belongs to, and its bytes."""

    lsn: LSN
    xid: int | None
    data: bytes


# A record is made for every line a plugin writes, by setting its slots (see _frozen.py).
_SET_LSN, _SET_XID, _SET_DATA = frozen_setters(OutputRecord, "lsn", "xid", "data")


def new_record(lsn: LSN, xid: int | None, data: bytes) -> OutputRecord:
    """``OutputRecord(lsn, xid, data)``, faster (one is made for every line written)."""
    record: OutputRecord = new_object(OutputRecord)
    _SET_LSN(record, lsn)
    _SET_XID(record, xid)
    _SET_DATA(record, data)
    return record


def write_many(output: Output, lsn: LSN | list[LSN], xid: int | None,
               datas: list[bytes]) -> None:
    """A record of each of ``datas`` at ``lsn`` (or at its own of a list of LSNs, at the same
    index) and ``xid``, in order: in one call where the output has ``write_many``, else one
    ``write`` each."""
    if capable(output, WritingMany):
        output.write_many(lsn, xid, datas)
        return
    write = output.write
    if isinstance(lsn, list):
        for at, data in zip(lsn, datas, strict=True):
            write(new_record(at, xid, data))
        return
    for data in datas:
        write(new_record(lsn, xid, data))


class OutputError(Exception):
    """A plugin wrote outside a callback or wrote data its output type does not allow."""


class Output(Protocol):
    """Where a plugin's records go, and how far they are durable."""

    durable_lsn: LSN

    def write(self, record: OutputRecord) -> None: ...

    def mark(self, lsn: LSN) -> None:
        """Everything the plugin will ever write for WAL before ``lsn`` has been written."""

    def flush(self) -> LSN:
        """Make everything marked durable; return the new ``durable_lsn``."""

    def close(self) -> None: ...


# --- optional capabilities: an output has one by implementing it (and says so by naming it
# among its bases, so that mypy checks it); the callers test for it with isinstance ---------


@runtime_checkable
class Rewinding(Protocol):
    """Can take back what it was given: the reorder buffer takes a ``savepoint`` before it
    delivers a transaction, and calls ``rollback_to`` with it when the connection is lost
    before the transaction's end (the server sends the transaction again from its start).
    An output without it must be given whole transactions only (the sources' default)."""

    def savepoint(self) -> Any: ...

    def rollback_to(self, savepoint: Any) -> None: ...


@runtime_checkable
class WritingMany(Protocol):
    """Takes many records of one xid in one call (``write_many`` below): at one LSN, or at
    each one's (a list of LSNs at the same index as the records). Called by the fast paths
    that format runs of changes."""

    def write_many(self, lsn: LSN | list[LSN], xid: int | None, datas: list[bytes]) -> None:
        ...


@runtime_checkable
class Resuming(Protocol):
    """Holds what an earlier run delivered (FileOutput's progress file), and goes on after
    it. The source calls ``check_resume`` before startup (refuses a record from past the
    server's WAL); the pipeline, at startup, calls ``claim`` (refuses another slot's record,
    or one taken with prepared transactions decoded the other way), skips what ends at or
    before ``resume_lsn``, aborts the ``resume_open_streams`` (the server streams them again
    from their start), and restores the prepared transactions kept in ``hold``; with each
    mark it says which streams are open (``note_open_streams``)."""

    resume_lsn: LSN
    resume_open_streams: list[int]
    hold: HoldStore | None

    def check_resume(self, server_lsn: LSN) -> None: ...

    def claim(self, slot: str, two_phase: bool | None = None) -> None: ...

    def note_open_streams(self, xids: list[int]) -> None: ...


@runtime_checkable
class RecordingSnapshots(Protocol):
    """Records the initial copy's state and the incremental snapshots' progress with what
    it delivered, so that a run after an interruption goes on with the copy, or is refused
    (sources/snapshots). Only such outputs take ``--snapshot``. The sources read
    ``snapshot_state`` (framework.statecheck.SNAPSHOT_STATES; None: no copy was taken) and
    ``resume_incremental`` before they stream; the pipeline calls ``begin_snapshot`` before
    the first copied rows, ``note_incremental`` before the snapshot rows its state goes with,
    ``snapshot_checkpoint`` when the rows so far are whole transactions, ``continue_snapshot``
    when a copy cut short goes on inside the stream, and ``end_snapshot`` when it is
    complete."""

    @property
    def snapshot_state(self) -> str | None: ...

    @property
    def resume_incremental(self) -> dict[str, Any] | None: ...

    def begin_snapshot(self) -> None: ...

    def note_incremental(self, state: dict[str, Any] | None) -> None: ...

    def snapshot_checkpoint(self) -> None: ...

    def continue_snapshot(self) -> None: ...

    def end_snapshot(self) -> None: ...


@runtime_checkable
class Batching(Protocol):
    """Delivers in batches (the Spark emitter's): ``attach`` gives it its pipeline member's
    context when the plugin is added (its options say where its checkpoint is, which the
    source asks about before startup); ``drain`` delivers what it holds now (a source calls
    it before its last status update, and at --endpos). ``copy_must_resume``: what it
    delivered cannot be taken back, so an initial copy that could not go on after an
    interruption (a table copied out of key order) is refused."""

    copy_must_resume: bool

    def attach(self, ctx: Any) -> None: ...

    def drain(self) -> None: ...


@runtime_checkable
class DeliversElsewhere(Protocol):
    """A plugin (not an output) that brings its own Output: the emitter's runner gives
    each such plugin ``make_output()`` instead of a FileOutput on ``-f`` (the Spark
    emitter's batches)."""

    def make_output(self) -> Output: ...


C = TypeVar("C")
_capable: dict[tuple[type, type], bool] = {}
_ABSENT = object()


def _members(capability: type) -> frozenset[str]:
    """The public names a protocol declares (its methods, properties and attributes), with
    those of the protocols it extends."""
    names: set[str] = set()
    for base in capability.__mro__:
        if base.__module__ not in ("typing", "builtins"):
            names.update(vars(base), getattr(base, "__annotations__", {}))
    return frozenset(n for n in names if not n.startswith("_"))


def _has(output: object, capability: type) -> bool:
    """Whether ``output`` declares ``capability`` (names it as a base) or has every member
    of it, looked up without running any: typing's isinstance on Python 3.11 reads each
    member with hasattr, which runs a property (RecordingSnapshots.snapshot_state opened the
    Spark emitter's checkpoint before the stream gave it its slot)."""
    if capability in type(output).__mro__:
        return True
    return all(inspect.getattr_static(output, name, _ABSENT) is not _ABSENT
               for name in _members(capability))


def capable(output: object, capability: type[C]) -> TypeGuard[C]:
    """Whether ``output`` has ``capability`` (one of the protocols above), remembered for
    the output's class (the pipeline asks for every transaction); a module (a plugin of
    hook functions) is asked each time, modules being of one class."""
    if isinstance(output, ModuleType):
        return _has(output, capability)
    key = (type(output), capability)
    known = _capable.get(key)
    if known is None:
        known = _capable[key] = _has(output, capability)
    return known
