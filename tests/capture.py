"""Capture raw pgoutput streams from a real server, through both of its interfaces."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from workload import END_PREFIX

from plugin_framework.protocol import LSN, XLogData
from plugin_framework.sources.replication import ReplicationStream


@dataclass(frozen=True)
class Captured:
    lsn: LSN  # SQL interface: the row's lsn; walsender: XLogData's wal_start
    data: bytes


def pgoutput_options(proto_version: int, *, streaming: str = "off", binary: bool = False,
                     messages: bool = True, publication: str = "pub") -> dict[str, str]:
    opts = {"proto_version": str(proto_version), "publication_names": publication}
    if messages:
        opts["messages"] = "true"
    if streaming != "off":
        opts["streaming"] = streaming
    if binary:
        opts["binary"] = "true"
    return opts


def peek(conn: psycopg.Connection[Any], slot: str, options: Mapping[str, str]) -> list[Captured]:
    """Everything the slot holds, through pg_logical_slot_peek_binary_changes (no consuming)."""
    flat = [x for kv in options.items() for x in kv]
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "VARIADIC %s::text[])",
        (slot, flat),
    ).fetchall()
    return [Captured(LSN(lsn), bytes(data)) for lsn, data in rows]


def stream(conninfo: str, slot: str, options: Mapping[str, str],
           timeout: float = 60.0, ready: threading.Event | None = None) -> list[Captured]:
    """The slot's changes through START_REPLICATION, up to the workload's end marker."""
    marker = END_PREFIX.encode() + b"\0"
    out: list[Captured] = []
    deadline = time.monotonic() + timeout
    with ReplicationStream(conninfo) as repl:
        repl.start(slot, LSN(0), options)
        if ready is not None:
            ready.set()
        while time.monotonic() < deadline:
            msg = repl.read(1.0)
            if isinstance(msg, XLogData):
                out.append(Captured(msg.wal_start, msg.data))
                if msg.data[:1] == b"M" and marker in msg.data:
                    return out
    raise TimeoutError(f"no end marker from slot {slot} within {timeout} s")


class LiveCapture(threading.Thread):
    """Streams a slot in the background while a workload runs, up to the end marker."""

    def __init__(self, conninfo: str, slot: str, options: Mapping[str, str]) -> None:
        super().__init__(daemon=True)
        self.args_ = (conninfo, slot, options)
        self.captured: list[Captured] = []
        self.error: BaseException | None = None
        self.started_streaming = threading.Event()

    def run(self) -> None:
        try:
            self.captured = stream(*self.args_, ready=self.started_streaming)
        except BaseException as exc:  # re-raised in result()
            self.error = exc
            self.started_streaming.set()

    def result(self, timeout: float = 120.0) -> list[Captured]:
        self.join(timeout)
        if self.error is not None:
            raise self.error
        if self.is_alive():
            raise TimeoutError("live capture did not finish")
        return self.captured
