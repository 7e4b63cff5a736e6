"""The spark emitter's checkpoint: which batch id covers which LSN range, and which batches
``fn`` has finished.

Laid out as Structured Streaming's own checkpoints are::

    CHECKPOINT/metadata        {"version": 1, "slot": ..., "created": ..., "id": ...}
    CHECKPOINT/offsets/17      {"batch_id": 17, "start": "0/1A2B3C8", "end": "0/1A9F000", ...}
    CHECKPOINT/commits/17      {"batch_id": 17, "end": "0/1A9F000", ...}

``offsets/N`` is written (and fsynced) before ``fn`` is called for batch N, ``commits/N`` after
it returned. A batch is the committed transactions whose end LSN lies in (start, end]; the
slot is acknowledged only up to the end of the last committed batch. After a crash, a batch
with an offsets file but no commits file is delivered again, with the same id and the same
transactions. Only the newest ``RETAIN`` entries of each are kept.

The rows of a snapshot (docs/snapshot.md) are not in the slot, so it cannot send them again:
a batch that has any is also kept as ``data/N.arrow`` (Arrow IPC) from before ``fn`` is
called until it returned, and delivered again from there. Each offsets entry records how far
the snapshot is whose rows the batches up to it hold (``snapshot_progress``: a restart goes
on from there), and ``CHECKPOINT/snapshot`` whether an initial copy is under way::

    CHECKPOINT/data/18.arrow    the rows of batch 18, while fn has not finished it
    CHECKPOINT/snapshot         {"state": "copying"} or {"state": "done"}
"""

from __future__ import annotations

import os
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from plugin_framework import LSN
from plugin_framework.framework import statecheck as check
from plugin_framework.framework.durable import create_durably, replace_durably

if TYPE_CHECKING:
    import pyarrow as pa

RETAIN = 100
T = TypeVar("T")


class CheckpointError(check.StateFileError):
    """The checkpoint directory is damaged or belongs to another slot."""


@dataclass(frozen=True)
class BatchRange:
    batch_id: int
    start: LSN
    end: LSN
    rows: int = 0
    transactions: int = 0
    # how far the snapshot is whose rows the batches up to this one hold (the form of
    # sources/snapshots/incremental.py's record; None: no snapshot on record)
    snapshot_progress: dict[str, Any] | None = None
    # the rows are kept in data/N.arrow until fn has finished them (a snapshot's rows)
    stored: bool = False


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    replace_durably(path, lambda f: f.write(check.dump_state(data)))


def _damaged(path: Path, what: object) -> CheckpointError:
    return CheckpointError(
        f"{path} is damaged ({what}): the checkpoint cannot be trusted, so nothing was "
        "delivered or acknowledged. Restore the checkpoint directory from a backup; to start "
        "afresh instead, remove it (and what its batches were written to) and create a new "
        "slot")


def _read(path: Path, read: Callable[..., T], *args: Any) -> T:
    """An entry, checked whole by ``read`` (statecheck's reader of its kind)."""
    try:
        return read(path.read_bytes(), *args)
    except (OSError, check.Damage) as exc:
        raise _damaged(path, exc) from None


def _ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


class Checkpoint:
    """The batch log of one emitter."""

    def __init__(self, directory: str | os.PathLike[str], slot: str | None = None) -> None:
        self.directory = Path(directory)
        self.offsets = self.directory / "offsets"
        self.commits = self.directory / "commits"
        self.data = self.directory / "data"
        self.offsets.mkdir(parents=True, exist_ok=True)
        self.commits.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(exist_ok=True)
        meta = self.directory / "metadata"
        metadata: dict[str, Any] = {"version": 1, "slot": slot, "id": uuid.uuid4().hex,
                                    "created": datetime.now(UTC).isoformat()}
        # made once: a reader of the checkpoint and its stream starting at once agree on it
        if meta.exists() or not create_durably(
                meta, lambda f: f.write(check.dump_state(metadata))):
            metadata = _read(meta, check.read_checkpoint_metadata)
            recorded = metadata.get("slot")
            if slot is not None and recorded is not None and recorded != slot:
                raise CheckpointError(
                    f'checkpoint {self.directory} belongs to slot "{recorded}", not "{slot}": '
                    "each slot needs a checkpoint directory of its own"
                )
            if slot is not None and recorded is None:  # made by a reader: the stream's now
                metadata = {**metadata, "slot": slot}
                _write_atomic(meta, metadata)
        # which batches its ids number (the sinks tell a target's query by it); a checkpoint
        # made before ids has its creation time
        self.id = str(metadata.get("id") or metadata.get("created"))
        self.slot: str | None = metadata.get("slot")  # the slot whose batches it logs
        self.last_committed: BatchRange | None = None
        self.pending: BatchRange | None = None
        self.acked = LSN(0)  # the ack recorded with the last committed batch
        # the targets equal the source as of this, once the last committed batch is in them
        self.consistent: LSN | None = None
        # the newest request for rows read again that a batch made (the LSN of its message):
        # no batch ending before the stream has read it is consistent, after a restart too
        self.reread: LSN | None = None
        # tables a batch wrote with values known not to be the source's, not read again
        # since (a documented policy applied): no batch is consistent while there are any
        self.inexact: frozenset[str] = frozenset()
        for again in reversed(range(10)):
            listed = (_ids(self.offsets), _ids(self.commits))
            try:
                self._load(*listed)
                break
            except CheckpointError:
                # Read while the process that writes it went on (a batch committed, its
                # stored rows removed, old entries purged): read again, else it is damage
                if not again or (_ids(self.offsets), _ids(self.commits)) == listed:
                    raise
                self.pending = self.last_committed = None
                self.acked = LSN(0)
        snapshot = self.directory / "snapshot"
        self.snapshot_state: str | None = None  # an initial copy's (SNAPSHOT_STATES)
        if snapshot.exists():
            self.snapshot_state = _read(snapshot, check.read_checkpoint_snapshot)

    def _entry(self, batch_id: int) -> BatchRange:
        data = _read(self.offsets / str(batch_id), check.read_checkpoint_offsets, batch_id)
        return BatchRange(batch_id, LSN(data["start"]), LSN(data["end"]), data.get("rows", 0),
                          data.get("transactions", 0), data.get("snapshot_progress"),
                          data.get("stored", False))

    def _load(self, offsets: list[int], commits: list[int]) -> None:
        """Every entry checked, and their ids, before anything is delivered again."""
        if offsets:  # (commits older than every offsets entry: a purge cut short)
            commits = [c for c in commits if c >= offsets[0]]
        try:
            check.check_batch_ids(offsets, commits)
        except check.Damage as exc:
            raise _damaged(self.directory, exc) from None
        if not offsets:
            return
        latest, newest = offsets[-1], commits[-1] if commits else None
        if newest != latest:
            self.pending = self._entry(latest)
            if self.pending.stored:
                self.stored_rows(self.pending)  # there, and readable, before anything else
        if newest is not None:
            done = _read(self.commits / str(newest), check.read_checkpoint_commit, newest)
            self.last_committed = self._entry(newest)
            self.acked = LSN(done.get("ack", done["end"]))
            consistent = done.get("consistent")
            self.consistent = None if consistent is None else LSN(consistent)
            reread = done.get("reread")
            self.reread = None if reread is None else LSN(reread)
            self.inexact = frozenset(done.get("inexact") or ())
        for directory, ids, read in ((self.offsets, offsets[:-1], check.read_checkpoint_offsets),
                                     (self.commits, commits[:-1], check.read_checkpoint_commit)):
            for i in ids:  # the older entries too
                try:
                    _read(directory / str(i), read, i)
                except CheckpointError:
                    # removed meanwhile by the process writing it (the oldest go first)?
                    if (directory / str(i)).exists() or min(_ids(directory), default=i) <= i:
                        raise

    @property
    def next_batch_id(self) -> int:
        if self.pending is not None:
            return self.pending.batch_id
        return 0 if self.last_committed is None else self.last_committed.batch_id + 1

    @property
    def delivered(self) -> LSN:
        """The end of the last batch ``fn`` finished: transactions ending at or before it were
        delivered."""
        return LSN(0) if self.last_committed is None else self.last_committed.end

    @property
    def snapshot_progress(self) -> dict[str, Any] | None:
        """How far the snapshot is whose rows the newest batch holds (a pending batch counts:
        it is delivered again whole, from ``data/``, or holds no snapshot rows)."""
        newest = self.pending or self.last_committed
        return None if newest is None else newest.snapshot_progress

    def set_snapshot_state(self, state: str) -> None:
        """Record, durably, that an initial copy is under way ("copying") or complete."""
        _write_atomic(self.directory / "snapshot", {"state": state})
        self.snapshot_state = state

    def begin(self, batch: BatchRange, table: pa.Table | None = None) -> None:
        """Record a batch before ``fn`` sees it; its rows too (``table``) if ``stored``."""
        assert batch.stored == (table is not None)
        entry: dict[str, Any] = {
            "batch_id": batch.batch_id, "start": str(batch.start), "end": str(batch.end),
            "rows": batch.rows, "transactions": batch.transactions,
            "snapshot_progress": batch.snapshot_progress, "stored": batch.stored,
            "created": datetime.now(UTC).isoformat()}
        if table is not None:
            import pyarrow as pa

            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            data = sink.getvalue().to_pybytes()
            entry["stored_crc32"] = zlib.crc32(data)

            def write(f: IO[bytes]) -> None:
                f.write(data)

            replace_durably(self.data / f"{batch.batch_id}.arrow", write)
        _write_atomic(self.offsets / str(batch.batch_id), entry)
        self.pending = batch

    def stored_rows(self, batch: BatchRange) -> pa.Table:
        """The rows kept for a batch (``stored``)."""
        import pyarrow as pa

        path = self.data / f"{batch.batch_id}.arrow"
        crc = _read(self.offsets / str(batch.batch_id), check.read_checkpoint_offsets,
                    batch.batch_id).get("stored_crc32")
        try:
            data = path.read_bytes()
            if crc is not None and zlib.crc32(data) != crc:
                raise ValueError("its checksum does not match the one its offsets entry "
                                 "records")
            table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
            table.validate(full=True)
            return table
        except (OSError, ValueError, pa.ArrowException) as exc:  # ArrowInvalid: a ValueError
            raise _damaged(path, f"it holds the rows of batch {batch.batch_id}, which must "
                           f"be delivered again, and cannot be read: {exc}") from None

    def commit(self, batch: BatchRange, ack: LSN | None = None,
               consistent: LSN | None = None, reread: LSN | None = None,
               inexact: frozenset[str] = frozenset()) -> None:
        """Record that ``fn`` returned for a batch, how far the slot may then be acknowledged
        (``ack``: the batch's end, or less while a prepared transaction before it is
        undecided), as of which LSN its targets then equal the source (``consistent``;
        None: not known to), the newest request for rows read again made so far
        (``reread``: its message's LSN) and the tables written inexactly since
        (``inexact``)."""
        ack = batch.end if ack is None else ack
        _write_atomic(self.commits / str(batch.batch_id), {
            "batch_id": batch.batch_id, "end": str(batch.end), "ack": str(ack),
            "committed": datetime.now(UTC).isoformat(),
            "consistent": None if consistent is None else str(consistent),
            "reread": None if reread is None else str(reread),
            "inexact": sorted(inexact),
        })
        self.last_committed = batch
        self.acked = ack
        self.consistent = consistent
        self.reread = reread
        self.inexact = inexact
        self.pending = None
        if batch.stored:
            (self.data / f"{batch.batch_id}.arrow").unlink(missing_ok=True)
        self._purge(batch.batch_id)

    def settle(self) -> None:
        """Record that the targets equal the source as of the end of the last committed
        batch, known only after it (the rows it asked for read again, and nothing of
        them or since to deliver)."""
        last = self.last_committed
        assert last is not None and self.pending is None
        self.commit(last, self.acked, last.end, self.reread, self.inexact)

    def _purge(self, newest: int) -> None:
        for path in self.data.glob("*.arrow"):  # left by a crash between commit and unlink
            if path.stem.isdigit() and int(path.stem) <= newest:
                path.unlink(missing_ok=True)
        for directory in (self.offsets, self.commits):
            for batch_id in _ids(directory):
                if batch_id <= newest - RETAIN:
                    (directory / str(batch_id)).unlink(missing_ok=True)
                else:
                    break

    def history(self) -> list[BatchRange]:
        """Committed batches still on record, oldest first."""
        done = set(_ids(self.commits))
        return [self._entry(i) for i in _ids(self.offsets) if i in done]
