"""The sample plugins of contrib/, on a live stream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from support.streamkit import WorkloadCapture
from support.workload import STREAM_ROWS

from contrib.audit_2pc import TwoPhaseAudit
from contrib.simple import SimplePlugin
from plugin_framework import MemoryOutput, Pipeline
from plugin_framework.framework import CallbackError


def run(capture: WorkloadCapture, plugin: Any, options: dict[str, str] | None = None) -> list[str]:
    out = MemoryOutput()
    pipeline = Pipeline(proto_version=capture.proto)
    pipeline.add(plugin, options=options, output=out)
    pipeline.startup()
    for item in capture.capture(streaming=True):
        pipeline.feed(item.data, item.lsn)
    pipeline.shutdown()
    return out.lines


def test_simple(workload_capture: WorkloadCapture) -> None:
    facts = workload_capture.facts
    lines = run(workload_capture, SimplePlugin())
    assert lines[:2] == [f"BEGIN {facts.xids['insert']}",
                         "INSERT public.items id='1' name='one' price='1.50' tags='{a,b}' "
                         f"payload='\\\\x00ff' big='{'x' * 5000}'"]
    assert lines[6].startswith("UPDATE public.items id='1' name='uno' price='1.50'")
    assert lines[6].endswith(" big=(unchanged)")
    with pytest.raises(CallbackError, match='option "x" = "1" is unknown'):
        run(workload_capture, SimplePlugin(), {"x": "1"})


def test_two_phase_audit(workload_capture: WorkloadCapture) -> None:
    facts = workload_capture.facts
    events = [orjson.loads(line) for line in run(workload_capture, TwoPhaseAudit())]
    by_gid: dict[str, list[str]] = {}
    for e in events:
        if e["gid"]:
            by_gid.setdefault(e["gid"], []).append(e["event"])
    assert by_gid == {"gid-commit": ["prepare", "commit_prepared"],
                      "gid-rollback": ["prepare", "rollback_prepared"],
                      "gid-stream": ["prepare", "commit_prepared"]}
    prepare = next(e for e in events if e["event"] == "prepare" and e["gid"] == "gid-stream")
    assert prepare["changes"] == STREAM_ROWS and prepare["tables"] == ["public.bulk"]
    assert prepare["xid"] == facts.xids["2pc_stream"]


def test_two_phase_audit_filter_prepare(workload_capture: WorkloadCapture) -> None:
    events = [orjson.loads(line) for line in run(workload_capture, TwoPhaseAudit(),
                                                   {"ignore-prefix": "gid-r"})]
    kinds = [(e["event"], e["gid"]) for e in events if e["gid"]]
    # filtered at PREPARE: decoded as an ordinary transaction at COMMIT PREPARED, and a
    # rolled-back one vanishes
    assert ("prepare", "gid-rollback") not in kinds
    assert ("rollback_prepared", "gid-rollback") not in kinds
    assert ("prepare", "gid-commit") in kinds
