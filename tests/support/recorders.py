"""Recording output plugins for the framework tests, and the transformations that turn what
a streaming or two-phase plugin saw into what an ordinary plugin should have seen."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from plugin_framework import OutputPlugin
from plugin_framework.framework import LoadedPlugin

Event = tuple[Any, ...]


def change_event(relation: Any, change: Any) -> Event:
    return (
        "change", relation.name, str(change.action),
        None if change.new is None else tuple(change.new.texts().items()),
        None if change.old is None else tuple(change.old.texts().items()),
        change.old_is_key,
    )


def changes_by_transaction(events: Sequence[Event]) -> list[list[Event]]:
    """A Recorder's change and truncate events, transaction by transaction, leaving out the
    transactions that have none (and whatever is outside a transaction)."""
    out: list[list[Event]] = []
    current: list[Event] | None = None
    for ev in events:
        if ev[0] == "begin":
            current = []
        elif ev[0] == "commit":
            if current:
                out.append(current)
            current = None
        elif current is not None and ev[0] in ("change", "truncate"):
            current.append(ev)
    return out


class Recorder(OutputPlugin):
    """Ordinary callbacks only: what every plugin must at least be able to see."""

    name = "recorder"

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        self.events: list[Event] = []
        self.is_init = is_init

    def begin(self, ctx: Any, txn: Any) -> None:
        self.events.append(("begin", txn.xid))

    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self.events.append(change_event(relation, change))

    def truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        self.events.append(("truncate", tuple(sorted(r.name for r in relations)),
                            change.cascade, change.restart_identity))

    def message(self, ctx: Any, txn: Any, message_lsn: Any, transactional: bool, prefix: str,
                message: bytes) -> None:
        self.events.append(("message", transactional, prefix, bytes(message), int(message_lsn)))

    def commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self.events.append(("commit", txn.xid, int(commit_lsn)))


class StreamRecorder(Recorder):
    name = "stream-recorder"

    def stream_start(self, ctx: Any, txn: Any) -> None:
        self.events.append(("stream_start", txn.xid))

    def stream_stop(self, ctx: Any, txn: Any) -> None:
        self.events.append(("stream_stop", txn.xid))

    def stream_change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        self.events.append(("stream_change", txn.xid, change.xid, change_event(relation, change)))

    def stream_truncate(self, ctx: Any, txn: Any, relations: Any, change: Any) -> None:
        self.events.append(("stream_truncate", txn.xid, change.xid,
                            ("truncate", tuple(sorted(r.name for r in relations)),
                             change.cascade, change.restart_identity)))

    def stream_message(self, ctx: Any, txn: Any, message_lsn: Any, transactional: bool,
                       prefix: str, message: bytes) -> None:
        self.events.append(("stream_message", txn.xid, txn.xid,
                            ("message", transactional, prefix, bytes(message), int(message_lsn))))

    def stream_abort(self, ctx: Any, txn: Any, abort_lsn: Any) -> None:
        top = txn.toptxn.xid if txn.toptxn is not None else txn.xid
        self.events.append(("stream_abort", top, txn.xid))

    def stream_commit(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self.events.append(("stream_commit", txn.xid, int(commit_lsn)))


class TwoPhaseRecorder(Recorder):
    name = "2pc-recorder"

    def __init__(self, filter_gids: tuple[str, ...] = ()) -> None:
        self.filter_gids = filter_gids

    def filter_prepare(self, ctx: Any, xid: int, gid: str) -> bool:
        return gid in self.filter_gids

    def begin_prepare(self, ctx: Any, txn: Any) -> None:
        self.events.append(("begin_prepare", txn.xid, txn.gid))

    def prepare(self, ctx: Any, txn: Any, prepare_lsn: Any) -> None:
        self.events.append(("prepare", txn.xid, txn.gid))

    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self.events.append(("commit_prepared", txn.xid, txn.gid, int(commit_lsn)))

    def rollback_prepared(self, ctx: Any, txn: Any, prepare_end_lsn: Any,
                          prepare_time: Any) -> None:
        self.events.append(("rollback_prepared", txn.xid, txn.gid))


class StreamTwoPhaseRecorder(StreamRecorder, TwoPhaseRecorder):
    name = "stream-2pc-recorder"

    def stream_prepare(self, ctx: Any, txn: Any, prepare_lsn: Any) -> None:
        self.events.append(("stream_prepare", txn.xid, txn.gid))


def apply_streams(events: list[Event]) -> list[Event]:
    """What an ordinary plugin should see, given what a streaming plugin saw: streamed changes
    collected per transaction, subtransaction aborts applied, delivered at stream_commit (or
    held until commit_prepared after a stream_prepare)."""
    out: list[Event] = []
    pending: dict[int, list[tuple[int, Event]]] = {}
    prepared: dict[str, list[Event]] = {}
    for ev in events:
        kind = ev[0]
        if kind in ("stream_start", "stream_stop"):
            pending.setdefault(ev[1], [])
        elif kind in ("stream_change", "stream_truncate", "stream_message"):
            pending.setdefault(ev[1], []).append((ev[2], ev[3]))
        elif kind == "stream_abort":
            top, sub = ev[1], ev[2]
            if top == sub:
                pending.pop(top, None)
            else:
                pending[top] = [(x, e) for x, e in pending.get(top, []) if x != sub]
        elif kind == "stream_commit":
            xid = ev[1]
            out += [("begin", xid), *(e for _, e in pending.pop(xid, [])), ("commit", xid, ev[2])]
        elif kind == "stream_prepare":
            prepared[ev[2]] = [("begin_prepare", ev[1], ev[2]),
                               *(e for _, e in pending.pop(ev[1], [])), ("prepare", ev[1], ev[2])]
            out += prepared[ev[2]]
        else:
            out.append(ev)
    return out


def apply_two_phase(events: list[Event]) -> list[Event]:
    """What a plugin without two-phase callbacks should see, given what a two-phase plugin
    saw: each prepared transaction as an ordinary one at commit_prepared, nothing for a
    rolled-back one."""
    out: list[Event] = []
    prepared: dict[str, list[Event]] = {}
    current: list[Event] | None = None
    for ev in events:
        kind = ev[0]
        if kind == "begin_prepare":
            current = [("begin", ev[1])]
        elif kind == "prepare":
            assert current is not None
            prepared[ev[2]] = current
            current = None
        elif kind == "commit_prepared":
            out += [*prepared.pop(ev[2]), ("commit", ev[1], ev[3])]
        elif kind == "rollback_prepared":
            prepared.pop(ev[2])
        elif current is not None:
            current.append(ev)
        else:
            out.append(ev)
    return out


def with_fast_path(plugin: Any, counts: Counter[str], fast: bool = True,
                   batch: bool = True, seen: list[Any] | None = None) -> LoadedPlugin:
    """``plugin`` loaded with its ``fast_change`` callback counting in ``counts`` the changes
    its formatters write ("fast") and decline ("declined"), and the changes written by their
    ``lines`` ("batched", counted in "fast" too); with ``fast`` false, loaded without it
    (every change through its change callback); with ``batch`` false, its formatters without
    ``lines`` (one call per change). ``seen`` receives each formatter, wrapped: its
    ``write``, and the ``calls`` (data, lsn, txn) of it one change at a time."""
    loaded = LoadedPlugin(plugin)
    compile_ = loaded.callbacks.get("fast_change")
    assert compile_ is not None, f"{plugin.name} has no fast path: is its C module built?"
    if not fast:
        del loaded.callbacks["fast_change"]
        return loaded

    class Counted:
        def __init__(self, write: Any) -> None:
            self.write = write
            self.calls: list[tuple[bytes, Any, Any]] = []
            if batch and hasattr(write, "lines"):
                self.lines = self._lines

        def __call__(self, data: bytes, lsn: Any, txn: Any) -> bytes | None:
            self.calls.append((data, lsn, txn))
            line = self.write(data, lsn, txn)
            counts["fast" if line is not None else "declined"] += 1
            return line

        def _lines(self, datas: list[bytes], start: int, lsn: Any,
                   txn: Any) -> tuple[list[bytes], int]:
            records, taken = self.write.lines(datas, start, lsn, txn)
            counts["fast"] += taken - start  # (a formatter that keeps them writes none)
            counts["batched"] += taken - start
            if taken < len(datas):
                counts["declined"] += 1
            return records, taken

    def compiled(ctx: Any, relation: Any) -> Any:
        write = compile_(ctx, relation)
        if write is None:  # no formatter for this relation (in this transaction)
            return None
        counted = Counted(write)
        if seen is not None:
            seen.append(counted)
        return counted

    loaded.callbacks["fast_change"] = compiled
    return loaded
