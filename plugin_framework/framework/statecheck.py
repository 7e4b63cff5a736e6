"""The state files pgdecode reads back, checked whole before anything is cut, replayed or
acknowledged (docs/sources.md, "State files"): FILE.progress (``read_progress``), a hold
entry's header (``read_hold_header``), the Spark checkpoint's entries and a mirror's manifest
(``read_checkpoint_*``, ``read_manifest``), and the order of a capture's messages
(``TransactionBounds``). A check says what is wrong (``Damage``); its caller names the file
and says what to do (``StateFileError``).

The JSON files carry a CRC-32 of their content (``dump_state``; the member ``crc32``): a file
whose bytes changed after it was written (a flipped bit, a digit of an LSN) is refused, not
read as other values. Files written before the checksum are read with the same checks of
every member's type, range and consistency, but a change that keeps them valid goes
unnoticed there.
"""

from __future__ import annotations

import itertools
import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from plugin_framework.protocol import LSN, MessageTag

T = TypeVar("T")

CHECKSUM = "crc32"  # the member that holds the checksum of the others
MAX_XID = (1 << 32) - 1

# Where an output's initial snapshot stands (docs/snapshot.md): its copy under way, going on
# as an incremental snapshot after an interruption, complete (None: no initial snapshot).
SNAPSHOT_STATES = ("copying", "incremental", "done")


class StateFileError(Exception):
    """A state file refused: the message names it, says what is wrong and what to do."""


class Damage(ValueError):
    """What is wrong with a state file's content (the caller names the file)."""


# --- JSON with a checksum ------------------------------------------------------------------------


def _canonical(state: Mapping[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def dump_state(state: Mapping[str, Any], *, ensure_ascii: bool = True) -> bytes:
    """``state`` as a JSON object, with the CRC-32 of its members as its last member."""
    crc = zlib.crc32(_canonical(state))
    return json.dumps({**state, CHECKSUM: crc}, ensure_ascii=ensure_ascii,
                      allow_nan=False).encode()


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise Damage(f'member "{_short(key)}" appears twice')
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise Damage(f"it has {name}, which is not a JSON number")


def load_state(data: bytes) -> tuple[dict[str, Any], bool]:
    """A JSON object as ``dump_state`` wrote it, and whether it had a checksum (verified,
    then taken out; a file written before checksums has none)."""
    try:
        raw = json.loads(data.decode("utf-8"), object_pairs_hook=_pairs,
                         parse_constant=_no_constant)
    except Damage:
        raise
    except UnicodeDecodeError:
        raise Damage("it is not UTF-8 text") from None
    except RecursionError:
        raise Damage("it is nested too deeply to be one of pgdecode's files") from None
    except ValueError as exc:
        raise Damage(f"it is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise Damage(f"it is a JSON {_kind(raw)}, not an object")
    if CHECKSUM not in raw:
        return raw, False
    stored = raw.pop(CHECKSUM)
    try:
        actual = zlib.crc32(_canonical(raw))
    except RecursionError:
        raise Damage("it is nested too deeply to be one of pgdecode's files") from None
    except ValueError:
        raise Damage("it holds a number out of range") from None
    if type(stored) is not int or stored != actual:
        raise Damage("its checksum does not match its content (it was damaged or changed "
                     "after it was written)")
    return raw, True


def _kind(value: Any) -> str:
    return ("null" if value is None else "true or false" if isinstance(value, bool)
            else "number" if isinstance(value, int | float) else "string"
            if isinstance(value, str) else "array" if isinstance(value, list) else "object")


def _short(value: Any) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(value)
    except (ValueError, RecursionError):
        text = f"a {_kind(value)}"
    return text if len(text) <= 40 else text[:37] + "..."


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        return f"a deeply nested {_kind(value)}"
    return text if len(text) <= 40 else f"{text[:37]}..."


# --- members, each checked --------------------------------------------------------------------

Check = Callable[[Any, str], T]  # a member's value and its name (a path: "txn.gid")


def _bad(name: str, value: Any, wanted: str) -> Damage:
    return Damage(f'"{name}" is {_shown(value)}, not {wanted}')


def is_lsn(value: Any, name: str) -> LSN:
    if isinstance(value, str):
        try:
            lsn = LSN(value)
        except ValueError:
            pass
        else:
            if str(lsn) == value:  # as pgdecode writes it
                return lsn
    raise _bad(name, value, 'an LSN written as "0/16B3748"')


def is_count(value: Any, name: str) -> int:
    if type(value) is int and value >= 0:
        return value
    raise _bad(name, value, "a count (a whole number, 0 or more)")


def is_xid(value: Any, name: str) -> int:
    if type(value) is int and 0 < value <= MAX_XID:
        return value
    raise _bad(name, value, "a transaction id or OID")


def is_text(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    raise _bad(name, value, "a string")


def is_flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _bad(name, value, "true or false")


def is_time(value: Any, name: str) -> str:
    if isinstance(value, str):
        try:
            if datetime.fromisoformat(value).tzinfo is not None:
                return value
        except ValueError:
            pass
    raise _bad(name, value, "a time with its time zone")


def list_of(item: Check[T], length: int | None = None, wanted: str = "an array"
            ) -> Check[list[T]]:
    """An array of ``item``s (of ``length`` items, if given)."""
    def check(value: Any, name: str) -> list[T]:
        if not isinstance(value, list) or (length is not None and len(value) != length):
            raise _bad(name, value, wanted)
        return [item(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return check


def map_of(item: Check[T]) -> Check[dict[str, T]]:
    def check(value: Any, name: str) -> dict[str, T]:
        if not isinstance(value, dict):
            raise _bad(name, value, "an object")
        return {k: item(v, f"{name}.{_short(k)}") for k, v in value.items()}
    return check


def optional(item: Check[T]) -> Check[T | None]:
    def check(value: Any, name: str) -> T | None:
        return None if value is None else item(value, name)
    return check


def one_of(*choices: Any) -> Check[Any]:
    def check(value: Any, name: str) -> Any:
        if any(type(value) is type(c) and value == c for c in choices):
            return value
        raise _bad(name, value, "one of " + ", ".join(json.dumps(c) for c in choices))
    return check


class Fields:
    """The members of a JSON object, each taken once and checked; ``close`` refuses the
    members nobody took (a damaged name, or a file of another kind)."""

    def __init__(self, raw: Any, where: str = "") -> None:
        if not isinstance(raw, dict):
            raise _bad(where, raw, "an object")
        self._raw, self._where = raw, where
        self._taken: set[str] = set()

    def _name(self, member: str) -> str:
        return f"{self._where}.{member}" if self._where else member

    def take(self, member: str, check: Check[T]) -> T:
        """A member that must be there."""
        self._taken.add(member)
        if member not in self._raw:
            raise Damage(f'it has no "{self._name(member)}"')
        return check(self._raw[member], self._name(member))

    def get(self, member: str, check: Check[T], default: T) -> T:
        """A member that may be left out (``default``), or be null where ``check`` allows."""
        self._taken.add(member)
        if member not in self._raw:
            return default
        return check(self._raw[member], self._name(member))

    def close(self) -> None:
        extra = [k for k in self._raw if k not in self._taken]
        if extra:
            raise Damage(f'it has an unknown member "{self._name(_short(extra[0]))}"')


# --- FILE.progress -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """What FILE.progress records: the output is durable up to ``lsn``, where the file had
    ``size`` bytes (``start``: its size when pgdecode began writing it, if not empty)."""

    lsn: LSN
    size: int
    start: int = 0
    slot: str | None = None
    two_phase: bool | None = None
    open_streams: tuple[int, ...] = ()
    incremental: dict[str, Any] | None = None
    snapshot: str | None = None


def read_progress(data: bytes) -> Progress:
    """FILE.progress, every member checked (Damage says what is wrong)."""
    raw, _ = load_state(data)
    f = Fields(raw)
    progress = Progress(
        lsn=f.take("lsn", is_lsn), size=f.take("size", is_count),
        start=f.get("start", is_count, 0), slot=f.get("slot", is_text, None),
        two_phase=f.get("two_phase", is_flag, None),
        open_streams=tuple(f.get("open_streams", list_of(is_xid), [])),
        incremental=f.get("incremental", optional(check_incremental), None),
        snapshot=f.get("snapshot", one_of(*SNAPSHOT_STATES), None))
    f.close()
    if progress.start > progress.size:
        raise Damage(f'"start" ({progress.start}) is past "size" ({progress.size})')
    return progress


def write_progress(progress: Progress) -> bytes:
    """FILE.progress's content (read back by ``read_progress``)."""
    state: dict[str, Any] = {"lsn": str(progress.lsn), "size": progress.size}
    if progress.start:
        state["start"] = progress.start
    if progress.slot is not None:
        state["slot"] = progress.slot
    if progress.two_phase is not None:
        state["two_phase"] = progress.two_phase
    if progress.open_streams:
        state["open_streams"] = list(progress.open_streams)
    if progress.incremental is not None:
        state["incremental"] = progress.incremental
    if progress.snapshot is not None:
        state["snapshot"] = progress.snapshot
    return dump_state(state)


def ends_a_line(path: Path, size: int) -> bool:
    """Whether the first ``size`` bytes of ``path`` end with a newline, as every size a
    FileOutput records durable does (it marks at transaction ends, after a line's "\\n")."""
    if size == 0:
        return True
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1) == b"\n"


# An incremental snapshot's record (sources/snapshots/incremental.py ``progress``; an initial
# copy's, snapshots/ledger.py ``CopyLedger.record``): in FILE.progress and the Spark
# checkpoint's offsets.

_key = list_of(optional(is_text), wanted="a key (an array of texts)")
_range = list_of(optional(_key), 2, "a range [after, upto]")
_names = list_of(is_text)


def check_incremental(value: Any, name: str = "incremental") -> dict[str, Any]:
    """An incremental snapshot's record, checked whole; returned as it is."""
    f = Fields(value, name)
    f.take("slot", is_text)
    queue = f.take("queue", _names)
    f.take("done", _names)
    f.get("after", map_of(_key), dict[str, Any]())
    table = f.get("table", optional(is_text), None)
    f.get("ranges", optional(map_of(list_of(_range))), None)
    f.get("starts", _names, list[str]())
    f.get("moved", map_of(list_of(_key)), dict[str, Any]())
    f.get("initial", one_of(True), None)
    f.get("keys_only", _names, list[str]())
    f.get("requests_lsn", is_lsn, None)
    f.get("asked", _names, list[str]())
    f.close()
    # a table asked for while it is read is queued again, to be read whole after it: at most
    # twice, never twice in the queue after the one under way
    under_way = ([table] if table is not None else []) + queue
    if any(under_way.count(t) > 2 for t in under_way) or (
            table is not None and len(set(queue)) != len(queue)):
        raise Damage(f'"{name}" has a table more than once among those queued')
    return dict(value)


# --- hold entries ------------------------------------------------------------------------------


_TXN_LSNS = ("final_lsn", "end_lsn", "origin_lsn", "prepare_lsn", "first_lsn")
_TXN_TIMES = ("commit_time", "prepare_time")
_TXN_FLAGS = ("is_streamed", "is_prepared", "is_snapshot")


def _column(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != 5:
        raise _bad(name, value, "a column [name, type, typmod, key, type name]")
    if type(value[2]) is not int:
        raise _bad(f"{name}[2]", value[2], "a type modifier")
    return [is_text(value[0], f"{name}[0]"), is_xid(value[1], f"{name}[1]"), value[2],
            is_flag(value[3], f"{name}[3]"), is_text(value[4], f"{name}[4]")]


def _relation(value: Any, name: str) -> dict[str, Any]:
    f = Fields(value, name)
    f.take("id", is_xid)
    f.take("namespace", is_text)
    f.take("name", is_text)
    f.take("identity", one_of("d", "n", "f", "i"))
    f.take("columns", list_of(_column))
    f.close()
    return dict(value)


def _txn(value: Any, name: str) -> dict[str, Any]:
    f = Fields(value, name)
    f.take("xid", is_xid)
    f.take("gid", is_text)
    for member in _TXN_LSNS:
        f.get(member, is_lsn, None)
    for member in _TXN_TIMES:
        f.get(member, is_time, None)
    for member in _TXN_FLAGS:
        f.get(member, is_flag, False)
    f.get("origin", is_text, None)
    f.close()
    return dict(value)


def read_hold_header(line: bytes, version: int, whole: str, stream: str) -> dict[str, Any]:
    """The JSON header of a hold entry (framework/hold.py: ``version``, and its kinds of
    entry ``whole`` and ``stream``), every member checked."""
    raw, _ = load_state(line)
    f = Fields(raw)
    f.take("version", one_of(version))
    kind = f.take("kind", one_of(whole, stream))
    f.take("slot", optional(is_text))
    txn = f.take("txn", _txn)
    prepare_end = f.take("prepare_end", is_lsn)
    relations = f.take("relations", list_of(_relation))
    f.take("aborted_subxids", list_of(is_xid))
    f.take("streamed_subxids", list_of(is_xid))
    f.take("catalog_changes", is_flag)
    remainder = f.take("remainder", optional(list_of(is_lsn, 2, "a block [start, stop]")))
    f.close()
    ids = [r["id"] for r in relations]
    if len(set(ids)) != len(ids):
        raise Damage('"relations" describes a relation twice')
    if remainder is not None and (remainder[0] > remainder[1] or kind == whole):
        raise Damage(f'"remainder" is {_shown(raw["remainder"])}, not the block of an entry '
                     f'of kind "{stream}"')
    if txn.get("prepare_lsn") is not None and LSN(txn["prepare_lsn"]) > prepare_end:
        raise Damage('"txn.prepare_lsn" is past "prepare_end"')
    return raw


# --- the Spark checkpoint and the mirror's manifests -------------------------------------------


def read_checkpoint_metadata(data: bytes) -> dict[str, Any]:
    raw, _ = load_state(data)
    f = Fields(raw)
    f.take("version", one_of(1))
    f.get("slot", optional(is_text), None)
    f.take("created", is_time)
    f.get("id", is_text, None)
    f.close()
    return raw


def read_checkpoint_offsets(data: bytes, batch_id: int) -> dict[str, Any]:
    """``offsets/N``: batch N's LSN range, recorded before ``fn`` saw it."""
    raw, _ = load_state(data)
    f = Fields(raw)
    f.take("batch_id", one_of(batch_id))
    start, end = f.take("start", is_lsn), f.take("end", is_lsn)
    f.get("rows", is_count, 0)
    f.get("transactions", is_count, 0)
    f.get("snapshot_progress", optional(check_incremental), None)
    stored = f.get("stored", is_flag, False)
    crc = f.get("stored_crc32", optional(is_count), None)
    f.get("created", is_time, None)
    f.close()
    if start > end:
        raise Damage(f'its "start" {start} is past its "end" {end}')
    if crc is not None and not stored:
        raise Damage('it has "stored_crc32" for a batch whose rows are not stored')
    return raw


def read_checkpoint_commit(data: bytes, batch_id: int) -> dict[str, Any]:
    """``commits/N``: ``fn`` finished batch N; the slot may be acknowledged to ``ack``."""
    raw, _ = load_state(data)
    f = Fields(raw)
    f.take("batch_id", one_of(batch_id))
    end = f.take("end", is_lsn)
    ack = f.get("ack", is_lsn, end)
    f.get("committed", is_time, None)
    consistent = f.get("consistent", optional(is_lsn), None)
    f.get("reread", optional(is_lsn), None)
    f.get("inexact", optional(list_of(is_text)), None)
    f.close()
    if consistent is not None and consistent > end:
        raise Damage(f'its "consistent" {consistent} is past the end of its batch, {end}')
    if ack > end:
        raise Damage(f'its "ack" {ack} is past the end of its batch, {end}')
    return raw


def read_checkpoint_snapshot(data: bytes) -> str:
    raw, _ = load_state(data)
    f = Fields(raw)
    state: str = f.take("state", one_of(*SNAPSHOT_STATES))
    f.close()
    return state


def check_batch_ids(offsets: list[int], commits: list[int]) -> None:
    """The batch ids a checkpoint's entries are named by (sorted): each kind a run with no
    gap (older ones are removed from the lowest up), no commit of a batch without its
    offsets entry, no batch begun before the one before it was committed."""
    for kind, ids in (("offsets", offsets), ("commits", commits)):
        gap = next((b for a, b in itertools.pairwise(ids) if b != a + 1), None)
        if gap is not None:
            raise Damage(f"{kind}/ has no entry of batch {gap - 1}, between batches it has")
    if commits and (not offsets or commits[-1] > offsets[-1]):
        raise Damage(f"commits/{commits[-1]} has no offsets entry")
    uncommitted = [b for b in offsets[:-1] if not commits or b > commits[-1]]
    if uncommitted:
        raise Damage(f"batch {uncommitted[0]} has an offsets entry and no commits entry, "
                     "though a later batch was begun")


def _file_name(value: Any, name: str) -> str:
    text = is_text(value, name)
    if "/" in text or "\\" in text or text.startswith(("_", ".")) \
            or not text.endswith(".parquet"):
        raise _bad(name, value, "the name of a Parquet file of the state")
    return text


def _file_bound(value: Any, name: str) -> list[Any]:
    wanted = "a file's bounds [low, high, has_nulls]"
    if not isinstance(value, list) or len(value) != 3 or not isinstance(value[2], bool):
        raise _bad(name, value, wanted)
    low, high = value[0], value[1]
    if (low is None) != (high is None) or (
            low is not None and not (type(low) is type(high) and type(low) in (int, str)
                                     and low <= high)):
        raise _bad(name, value, wanted)
    return value


_description = list_of(list_of(is_text, 2, "a column [name, type]"))


def read_manifest(data: bytes, batch: int | None = None) -> dict[str, Any]:
    """A mirror table's manifest (spark/statefiles.py), every member checked; ``batch``:
    the batch its file name says."""
    raw, _ = load_state(data)
    f = Fields(raw)
    f.take("batch", is_count if batch is None else one_of(batch))
    files = f.take("files", map_of(is_count))
    for name in files:
        _file_name(name, "files")
    f.take("description", optional(_description))
    bounds = f.get("bounds", map_of(_file_bound), dict[str, Any]())
    f.get("bounded", optional(is_text), None)
    f.get("query", optional(is_text), None)
    f.get("consistent", optional(is_count), None)
    f.close()
    stray = sorted(set(bounds) - set(files))
    if stray:
        raise Damage(f'"bounds" has file {_short(stray[0])}, which "files" does not list')
    return raw


# --- the order of a capture's messages --------------------------------------------------------


_ENDS = {MessageTag.COMMIT: MessageTag.BEGIN, MessageTag.PREPARE: MessageTag.BEGIN_PREPARE}
_WHOLE = frozenset({MessageTag.STREAM_COMMIT, MessageTag.STREAM_ABORT,
                    MessageTag.STREAM_PREPARE, MessageTag.COMMIT_PREPARED,
                    MessageTag.ROLLBACK_PREPARED})
_ROWS = frozenset({MessageTag.INSERT, MessageTag.UPDATE, MessageTag.DELETE,
                   MessageTag.TRUNCATE})


class TransactionBounds:
    """The messages of a replication stream, followed by their tags: ``add`` refuses
    (Damage) a transaction begun inside another, an end without its beginning, a row change
    outside any transaction; ``inside``: the stream so far ends inside a transaction or a
    stream block (a capture cut there holds part of it)."""

    def __init__(self) -> None:
        self.began: int | None = None  # the tag that began the transaction under way
        self.streaming = False

    @property
    def inside(self) -> bool:
        return self.began is not None or self.streaming

    def add(self, tag: int) -> None:
        if tag in (MessageTag.BEGIN, MessageTag.BEGIN_PREPARE, MessageTag.STREAM_START) \
                or tag in _WHOLE:
            if self.inside:
                raise Damage(f"a {MessageTag(tag).title} inside a transaction or stream block "
                             "(a message is missing or repeated)")
            if tag == MessageTag.STREAM_START:
                self.streaming = True
            elif tag not in _WHOLE:
                self.began = tag
        elif tag in _ENDS:
            if self.began != _ENDS[MessageTag(tag)]:
                raise Damage(f"a {MessageTag(tag).title} with no transaction to end (a message "
                             "is missing or repeated)")
            self.began = None
        elif tag == MessageTag.STREAM_STOP:
            if not self.streaming:
                raise Damage("a Stream Stop with no stream block to end (a message is missing "
                             "or repeated)")
            self.streaming = False
        elif tag in _ROWS and not self.inside:
            raise Damage(f"a row change ({MessageTag(tag).title}) outside any transaction (a "
                         "message is missing)")
