"""Prepared transactions held durably beside an output file (``FILE.hold/``), so that the
slot can be acknowledged past their PREPARE.

A plugin without two-phase callbacks gets a prepared transaction at COMMIT PREPARED, which
may come hours later. Until then its changes exist only in the pipeline's spool, and the
slot cannot be confirmed past the PREPARE: the server would not send them again. That
blocks a fast shutdown (the walsender waits for the client to confirm all it sent) and holds
WAL back. So a file output keeps each such transaction in an *entry* of its hold directory,
written and fsynced at PREPARE, before the output is marked past it; the acknowledgement
then moves on, and a later run (a restart, a crash) restores the transaction from the entry
and delivers it when the server sends its COMMIT or ROLLBACK PREPARED.

An entry is one file: a JSON header line (the transaction, the relations its changes need,
what else the reorder buffer knew of it), the raw pgoutput messages it holds (the spool's
frame format), and a CRC-32 of all of it. Once the outcome is delivered, a small ``.done``
file beside the entry records the outcome's end LSN; the entry goes when the output is
durable past it (at the next flush, or at the next start if the process died first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from plugin_framework.framework.durable import replace_durably
from plugin_framework.framework.model import Column, Relation, Transaction
from plugin_framework.framework.spool import _ENTRY, Entry, Run, Spool, SpoolBudget, file_runs
from plugin_framework.framework.statecheck import Damage, StateFileError, read_hold_header
from plugin_framework.protocol import LSN

_VERSION = 1
_SUFFIX = ".hold"
_DONE = ".done"

WHOLE = "whole"  # the member gets the whole transaction at COMMIT PREPARED
STREAM = "stream"  # it had stream blocks; it gets the rest (the remainder) at the outcome


class HoldError(StateFileError):
    """A hold directory that cannot be read or written."""


@dataclass
class HeldTransaction:
    """What a restart needs to deliver a prepared transaction held for one output."""

    kind: str  # WHOLE or STREAM
    slot: str | None
    txn: Transaction
    prepare_end: LSN  # where the PREPARE record ends: the output was marked past it
    relations: dict[int, Relation]  # the definitions the first frames are read with
    aborted_subxids: set[int] = field(default_factory=set)
    streamed_subxids: set[int] = field(default_factory=set)
    catalog_changes: bool = False
    remainder_lsns: tuple[LSN, LSN] | None = None  # a STREAM entry's block: start, stop
    frames: Iterable[Entry] = ()  # what it holds: written from a spool, read back lazily
    outcome_end: LSN | None = None  # the end of its COMMIT/ROLLBACK PREPARED, once delivered
    path: Path | None = None


class HeldSpool(Spool):
    """The frames of an entry, read from its file when replayed (nothing is kept in memory
    until then, however large the transaction)."""

    def __init__(self, budget: SpoolBudget, path: Path, offset: int, count: int) -> None:
        super().__init__(budget)
        self._path, self._offset, self.count = path, offset, count

    def append(self, lsn: LSN, xid: int, in_stream: bool, raw: bytes) -> None:
        raise HoldError("a held transaction's spool is read-only")

    def append_run(self, lsns: Sequence[LSN], xid: int, in_stream: bool,
                   raws: Sequence[bytes]) -> None:
        raise HoldError("a held transaction's spool is read-only")

    def __iter__(self) -> Iterator[Entry]:
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            for _ in range(self.count):
                lsn, xid, in_stream, length = _ENTRY.unpack(f.read(_ENTRY.size))
                yield LSN(lsn), xid, bool(in_stream), f.read(length)

    def runs(self, strip: bool) -> Iterator[Run]:
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            yield from file_runs(f, strip, self.count)


class HoldStore:
    """The hold directory of one output file."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._outcomes: dict[Path, LSN] = {}  # entries whose outcome was delivered

    def _path(self, gid: str, xid: int) -> Path:
        # one entry per prepared transaction; a gid can be used again once it is finished
        digest = hashlib.sha256(gid.encode()).hexdigest()[:24]
        return self.directory / f"{digest}-{xid}{_SUFFIX}"

    def save(self, held: HeldTransaction) -> Path:
        """Write an entry durably (a crash leaves the old one or the new one, whole);
        returns its path."""
        txn = held.txn
        assert txn.gid is not None
        path = self._path(txn.gid, txn.xid)

        def write_entry(f: IO[bytes]) -> None:
            crc = 0
            count = 0

            def write(data: bytes) -> None:
                nonlocal crc
                f.write(data)
                crc = zlib.crc32(data, crc)

            write(_header(held))
            frames = bytearray()
            for lsn, xid, in_stream, raw in held.frames:
                frames += _ENTRY.pack(lsn, xid, in_stream, len(raw))
                frames += raw
                count += 1
                if len(frames) >= 1 << 20:
                    write(bytes(frames))
                    frames.clear()
            write(bytes(frames))
            f.write(count.to_bytes(8, "big") + crc.to_bytes(4, "big"))

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            replace_durably(path, write_entry)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.with_name(path.name + ".tmp").unlink(missing_ok=True)
            raise HoldError(
                f'could not save prepared transaction "{txn.gid}" (xid {txn.xid}) in {path}, '
                f"where it is held until its COMMIT PREPARED: {exc.strerror or exc}. Nothing "
                "was acknowledged past its PREPARE, so the server sends it again. Make room "
                f"in {self.directory} (or repair the disk), then run the same command again"
            ) from None
        return path

    def outcome(self, path: Path, end_lsn: LSN) -> None:
        """The entry's outcome was delivered (its end is ``end_lsn``): it goes once the
        output is durable past that. Recorded beside it too, not fsynced: if that is lost,
        a restart restores an entry whose outcome the server does not send again, which
        only waits (it holds nothing back) until its gid is used again."""
        self._outcomes[path] = end_lsn
        with contextlib.suppress(OSError):
            path.with_name(path.name + _DONE).write_text(str(end_lsn))

    def release(self, durable: LSN) -> None:
        """Remove the entries whose outcome the output now holds durably."""
        for path, end in list(self._outcomes.items()):
            if end <= durable:
                _remove(path)
                del self._outcomes[path]

    def load(self, budget: SpoolBudget) -> list[HeldTransaction]:
        """Every entry of the directory (damaged ones refused), oldest PREPARE first."""
        if not self.directory.is_dir():
            return []
        entries = []
        for path in sorted(self.directory.glob("*" + _SUFFIX)):
            held = _read(path, budget)
            done = path.with_name(path.name + _DONE)
            with contextlib.suppress(OSError, ValueError):
                held.outcome_end = LSN(done.read_text().strip())
            entries.append(held)
        for tmp in self.directory.glob("*.tmp"):  # a save a crash cut short
            tmp.unlink(missing_ok=True)
        return sorted(entries, key=lambda h: h.prepare_end)

    def discard(self, held: HeldTransaction) -> None:
        """Remove an entry a restart does not need (see Holding._restore_held)."""
        if held.path is not None:
            _remove(held.path)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + _DONE).unlink(missing_ok=True)


# --- the header: JSON --------------------------------------------------------------------------

_TXN_LSNS = ("final_lsn", "end_lsn", "origin_lsn", "prepare_lsn", "first_lsn")
_TXN_TIMES = ("commit_time", "prepare_time")
_TXN_SKIP = ("toptxn", "output_plugin_private")


def _header(held: HeldTransaction) -> bytes:
    txn: dict[str, Any] = {}
    for f in fields(Transaction):
        value = getattr(held.txn, f.name)
        if f.name in _TXN_SKIP or value is None:
            continue
        txn[f.name] = (str(value) if f.name in _TXN_LSNS
                       else value.isoformat() if f.name in _TXN_TIMES else value)
    state = {
        "version": _VERSION, "kind": held.kind, "slot": held.slot, "txn": txn,
        "prepare_end": str(held.prepare_end),
        "relations": [_relation_json(r) for r in held.relations.values()],
        "aborted_subxids": sorted(held.aborted_subxids),
        "streamed_subxids": sorted(held.streamed_subxids),
        "catalog_changes": held.catalog_changes,
        "remainder": (None if held.remainder_lsns is None
                      else [str(held.remainder_lsns[0]), str(held.remainder_lsns[1])]),
    }
    return json.dumps(state, separators=(",", ":")).encode() + b"\n"


def _relation_json(rel: Relation) -> dict[str, Any]:
    return {"id": rel.relation_id, "namespace": rel.namespace, "name": rel.name,
            "identity": rel.replica_identity,
            "columns": [[c.name, c.type_oid, c.type_modifier, c.is_key, c.type_name]
                        for c in rel.columns]}


def _relation(data: dict[str, Any]) -> Relation:
    columns = tuple(Column(str(n), int(t), int(m), bool(k), str(tn))
                    for n, t, m, k, tn in data["columns"])
    return Relation(int(data["id"]), str(data["namespace"]), str(data["name"]),
                    str(data["identity"]), columns, {c.name: i for i, c in enumerate(columns)})


def _read(path: Path, budget: SpoolBudget) -> HeldTransaction:
    """An entry, checked whole (its checksum, its header's members, its frames) before
    anything of it is used: a damaged entry is refused, since it may be the only copy of a
    transaction the server will not send again."""
    try:
        data = path.read_bytes()
        if len(data) < 12:
            raise Damage("it is shorter than its trailer")
        count = int.from_bytes(data[-12:-4], "big")
        if zlib.crc32(data[:-12]) != int.from_bytes(data[-4:], "big"):
            raise Damage("its checksum does not match")
        end = data.find(b"\n") + 1
        if not end:
            raise Damage("it has no header line")
        state = read_hold_header(data[:end], _VERSION, WHOLE, STREAM)
        _check_frames(data, end, count)
        values: dict[str, Any] = {
            k: (LSN(v) if k in _TXN_LSNS else datetime.fromisoformat(v) if k in _TXN_TIMES
                else v) for k, v in state["txn"].items()}
        remainder = state["remainder"]
        return HeldTransaction(
            kind=state["kind"], slot=state["slot"], txn=Transaction(**values),
            prepare_end=LSN(state["prepare_end"]),
            relations={r["id"]: _relation(r) for r in state["relations"]},
            aborted_subxids=set(state["aborted_subxids"]),
            streamed_subxids=set(state["streamed_subxids"]),
            catalog_changes=state["catalog_changes"],
            remainder_lsns=None if remainder is None else (LSN(remainder[0]),
                                                           LSN(remainder[1])),
            frames=HeldSpool(budget, path, end, count), path=path,
        )
    except (OSError, Damage) as exc:
        raise HoldError(
            f"{path} is damaged ({exc}): it holds a prepared transaction that the slot has "
            "been acknowledged past, so the server will not send it again. Nothing was "
            "written or acknowledged. Restore the file from a backup; to give the "
            "transaction up instead, remove it (its changes then never reach this output)"
        ) from None


def _check_frames(data: bytes, offset: int, count: int) -> None:
    """The ``count`` frames from ``offset`` fill the entry up to its trailer exactly."""
    end = len(data) - 12
    for number in range(count):
        if offset + _ENTRY.size > end:
            raise Damage(f"it holds {number} of the {count} frames its trailer counts")
        _lsn, _xid, in_stream, length = _ENTRY.unpack_from(data, offset)
        offset += _ENTRY.size + length
        if in_stream > 1 or offset > end:
            raise Damage(f"its frame {number + 1} runs past its end")
    if offset != end:
        raise Damage(f"it holds more than the {count} frames its trailer counts")
