"""Runs of row changes in a batch of XLogData messages, for the walsender source's hot loop:
instead of one trip through the pipeline per change, a run of an ordinary transaction's
changes of one relation goes to the plugins' formatters in one call (Pipeline.feed_run).

A run is what ``row_change_run`` finds from an index of a batch of raw CopyData messages (as
``ReplicationStream.read_batch`` returns them): consecutive XLogData messages whose pgoutput
payload is an Insert, Update or Delete with the same type byte and the same 32-bit field after
it (outside a stream block the relation id, inside one the xid), each payload's bytes and
its XLogData start LSN. ``row_change_run`` takes the C scanner (native/_runs.c) where it is
built; ``row_change_run_py`` is the reference it mirrors, and tests/protocol/test_runs.py
holds the two equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from plugin_framework._native import load_native
from plugin_framework.protocol.framing import (
    XLOGDATA_HEADER_SIZE,
    XLOGDATA_TAG,
    xlogdata_wal_start,
)
from plugin_framework.protocol.lsn import LSN, wire_lsn
from plugin_framework.protocol.raw import ROW_CHANGE_MIN_SIZE, ROW_CHANGE_TAGS

if TYPE_CHECKING:
    from plugin_framework.protocol.native import _runs
else:
    _runs = load_native("plugin_framework.protocol.native._runs")

__all__ = ["Run", "row_change_run", "row_change_run_py"]

# The payloads of a run, their start LSNs (at the same index), and the index of the first
# message after the run (the start index itself when there is no run there).
Run = tuple[list[bytes], list[LSN], int]

_KEY = ROW_CHANGE_MIN_SIZE  # the bytes that make a run: the type byte and the id after it


def row_change_run_py(batch: Sequence[bytes | bytearray | memoryview], start: int) -> Run:
    """The run of row changes at ``batch[start]`` (see the module's docstring); an empty run
    when ``batch[start]`` is not an XLogData message carrying a row change (or is past the
    end). A message too short for its header is no part of a run (decode_copy_data reports
    it on the way of single messages)."""
    if start < 0:
        raise ValueError("row_change_run(): start must not be negative")
    datas: list[bytes] = []
    lsns: list[LSN] = []
    key = b""
    i = start
    end = len(batch)
    while i < end:
        raw = batch[i]
        if (len(raw) < XLOGDATA_HEADER_SIZE + _KEY or raw[0] != XLOGDATA_TAG
                or raw[XLOGDATA_HEADER_SIZE] not in ROW_CHANGE_TAGS):
            break
        head = bytes(raw[XLOGDATA_HEADER_SIZE:XLOGDATA_HEADER_SIZE + _KEY])
        if not datas:
            key = head
        elif head != key:
            break
        datas.append(bytes(raw[XLOGDATA_HEADER_SIZE:]))
        lsns.append(wire_lsn(xlogdata_wal_start(raw, 1)[0]))
        i += 1
    return datas, lsns, i


def row_change_run(batch: Sequence[bytes | bytearray | memoryview], start: int) -> Run:
    """``row_change_run_py``, in C where it is built."""
    if _runs is None:
        return row_change_run_py(batch, start)
    return _runs.row_change_run(batch, start, wire_lsn)
