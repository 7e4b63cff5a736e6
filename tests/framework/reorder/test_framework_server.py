"""The reorder buffer's contract (framework/reorder/) on real streams from each server version."""

from __future__ import annotations

from typing import Any

import pytest
from support.recorders import (
    Event,
    Recorder,
    StreamRecorder,
    StreamTwoPhaseRecorder,
    TwoPhaseRecorder,
    apply_streams,
    apply_two_phase,
)
from support.streamkit import WorkloadCapture

from plugin_framework import UNCHANGED_TOAST, MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.framework import CallbackError


def run(capture: WorkloadCapture, plugins: list[OutputPlugin], *, streaming: bool = True,
        memory_limit: int | None = None) -> Pipeline:
    kwargs = {} if memory_limit is None else {"memory_limit": memory_limit}
    pipeline = Pipeline(proto_version=capture.proto, **kwargs)
    for plugin in plugins:
        pipeline.add(plugin, output=MemoryOutput())
    pipeline.startup()
    for item in capture.capture(streaming):
        pipeline.feed(item.data, item.lsn)
    assert not pipeline.in_flight
    pipeline.shutdown()
    return pipeline


def table_state(events: list[Event], key: dict[str, tuple[str, ...]]) -> dict[str, dict[Any, Any]]:
    """Apply ordinary change events to per-table dicts, as a subscriber would."""
    tables: dict[str, dict[Any, Any]] = {}
    for ev in events:
        if ev[0] == "truncate":
            for name in ev[1]:
                tables[name] = {}
        if ev[0] != "change":
            continue
        _, table, action, new, old, _old_is_key = ev
        rows = tables.setdefault(table, {})
        cols = key[table]

        def k(items: tuple[tuple[str, Any], ...], cols: tuple[str, ...] = cols) -> Any:
            d = dict(items)
            return tuple(d[c] for c in cols) if cols else tuple(sorted(d.items()))

        if action in ("UPDATE", "DELETE"):
            before = old if old is not None else new
            previous = rows.pop(k(before), None)
        if action in ("INSERT", "UPDATE"):
            row = dict(new)
            for col, value in row.items():
                if value is UNCHANGED_TOAST:
                    row[col] = previous[col]
            rows[k(tuple(row.items()))] = row
    return tables


KEYS = {"items": ("id",), "bulk": ("id",), "moods": ("id",), "fulltab": (), "parent": ("id",),
        "child": ("id",)}


def server_state(db: Any, table: str) -> dict[Any, Any]:
    cols = [r[0] for r in db.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (table,))]
    select = ", ".join(f"{c}::text" for c in cols)
    out = {}
    for values in db.execute(f"SELECT {select} FROM {table}"):
        row = dict(zip(cols, values, strict=True))
        keycols = KEYS[table]
        out[tuple(row[c] for c in keycols) if keycols else tuple(sorted(row.items()))] = row
    return out


def test_ordinary_plugin_sees_exactly_the_committed_data(workload_capture: WorkloadCapture) -> None:
    (rec,) = [m.plugin.plugin for m in run(workload_capture, [Recorder()]).members]
    assert isinstance(rec, Recorder)
    state = table_state(rec.events, KEYS)
    for table in ("items", "bulk", "moods", "fulltab", "parent", "child"):
        assert state.get(table, {}) == server_state(workload_capture.db, table), table
    xids = {ev[1] for ev in rec.events if ev[0] == "begin"}
    assert workload_capture.facts.xids["stream_abort"] not in xids
    assert workload_capture.facts.xids["2pc_rollback"] not in xids
    assert workload_capture.facts.xids["2pc_commit"] in xids
    assert workload_capture.facts.xids["stream"] in xids


def test_reassembled_streams_equal_the_unstreamed_delivery(
        workload_capture: WorkloadCapture) -> None:
    streamed = run(workload_capture, [Recorder()], streaming=True).members[0].plugin.plugin
    whole = run(workload_capture, [Recorder()], streaming=False).members[0].plugin.plugin
    assert streamed.events == whole.events  # type: ignore[attr-defined]


def test_every_plugin_kind_sees_the_same_transactions(workload_capture: WorkloadCapture) -> None:
    plugins = [Recorder(), StreamRecorder(), TwoPhaseRecorder(),
               TwoPhaseRecorder(filter_gids=("gid-commit", "gid-stream")),
               StreamTwoPhaseRecorder()]
    run(workload_capture, plugins)
    events: list[list[Event]] = [p.events for p in plugins]  # type: ignore[attr-defined]
    assert any(e[0] == "stream_abort" and e[1] != e[2] for e in events[1])  # a subxact abort
    assert apply_streams(events[1]) == events[0]
    assert apply_two_phase(events[2]) == events[0]
    assert apply_two_phase(events[3]) == events[0]
    assert apply_two_phase(apply_streams(events[4])) == events[0]
    # filter_prepare: those gids were decoded as ordinary transactions, the other one was not
    prepared_gids = {e[2] for e in events[3] if e[0] == "begin_prepare"}
    assert prepared_gids == {"gid-rollback"}
    assert {e[2] for e in events[4] if e[0] == "stream_prepare"} == {"gid-stream"}


def test_spilled_reassembly_delivers_the_same(workload_capture: WorkloadCapture) -> None:
    small = run(workload_capture, [Recorder(), TwoPhaseRecorder()], memory_limit=16 * 1024)
    assert small.budget.spilled_bytes > 100_000
    big = run(workload_capture, [Recorder(), TwoPhaseRecorder()])
    assert big.budget.spilled_bytes == 0
    for a, b in zip(small.members, big.members, strict=True):
        assert a.plugin.plugin.events == b.plugin.plugin.events  # type: ignore[attr-defined]


class OriginFilter(Recorder):
    def __init__(self, origin: str) -> None:
        self.origin = origin

    def filter_by_origin(self, ctx: Any, origin: str) -> bool:
        return origin == self.origin


def test_filter_by_origin_skips_whole_transactions(workload_capture: WorkloadCapture) -> None:
    plain, filtering = Recorder(), OriginFilter(workload_capture.facts.origin)
    run(workload_capture, [plain, filtering])
    origin_xid = workload_capture.facts.xids["origin"]
    assert ("begin", origin_xid) in plain.events
    expected = []
    skipping = False
    for ev in plain.events:
        if ev == ("begin", origin_xid):
            skipping = True
        if not skipping:
            expected.append(ev)
        if ev[0] == "commit" and ev[1] == origin_xid:
            skipping = False
    assert filtering.events == expected


def test_truncate_and_messages(workload_capture: WorkloadCapture) -> None:
    rec = Recorder()
    run(workload_capture, [rec])
    assert ("truncate", ("child", "parent"), True, True) in rec.events
    f = workload_capture.facts
    msgs = [e for e in rec.events if e[0] == "message"]
    assert ("message", True, "pgdecode", "transactional €".encode(), f.message_lsns["tx"]) in msgs
    assert ("message", False, "pgdecode", b"at once", f.message_lsns["nontx"]) in msgs


class Exploding(Recorder):
    def change(self, ctx: Any, txn: Any, relation: Any, change: Any) -> None:
        if relation.name == "fulltab":
            raise RuntimeError("boom")


def test_callback_errors_carry_postgresql_style_context(workload_capture: WorkloadCapture) -> None:
    with pytest.raises(CallbackError) as info:
        run(workload_capture, [Exploding()])
    text = str(info.value)
    assert text.startswith('output plugin "recorder", in the change callback, associated LSN ')
    assert text.endswith("RuntimeError: boom")
    lsn = text.split("associated LSN ")[1].split(":")[0]
    assert "/" in lsn and int(lsn.split("/")[1], 16) > 0


class StreamingDeclined(StreamRecorder):
    """Has stream callbacks but turns streaming off in startup, as test_decoding's
    stream-changes=0 does: it must then get reassembled transactions."""

    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        super().startup(ctx, options, is_init)
        ctx.streaming = False


class TwoPhaseDeclined(TwoPhaseRecorder):
    def startup(self, ctx: Any, options: Any, is_init: bool) -> None:
        super().startup(ctx, options, is_init)
        ctx.twophase = False


def test_startup_can_decline_streaming_and_two_phase(workload_capture: WorkloadCapture) -> None:
    plugins = [Recorder(), StreamingDeclined(), TwoPhaseDeclined()]
    run(workload_capture, plugins)
    ordinary, no_stream, no_2pc = (p.events for p in plugins)  # type: ignore[attr-defined]
    assert no_stream == ordinary and no_2pc == ordinary
