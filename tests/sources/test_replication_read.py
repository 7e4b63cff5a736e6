"""The replication stream's reader of the messages libpq has buffered (read_copy_data in
sources/native/_copyrow.c) against psycopg.pq's get_copy_data, the reference it mirrors: the
same messages, in the same order, from two slots over the same WAL."""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.capture import pgoutput_options
from support.streamkit import create_slot, create_tables, query, run_options_workload
from support.workload import END_PREFIX

from plugin_framework import LSN
from plugin_framework.protocol import XLogData, decode_copy_data
from plugin_framework.sources.replication import _BATCH, ReplicationStream
from plugin_framework.sources.session import highest_proto_version


def _read_all(conninfo: str, slot: str, options: dict[str, str], c_reader: bool
              ) -> tuple[list[tuple[LSN, bytes]], int]:
    """Every XLogData message of the slot up to the end marker, (start LSN, payload), read
    with the C reader or without it; and the size of the largest batch read."""
    marker = END_PREFIX.encode() + b"\0"
    out: list[tuple[LSN, bytes]] = []
    largest = 0
    deadline = time.monotonic() + 120
    with ReplicationStream(conninfo) as repl:
        if c_reader:
            assert repl._read_buffered is not None
        else:
            repl._read_buffered = None  # psycopg.pq's get_copy_data, the reference
        repl.start(slot, LSN(0), options)
        while time.monotonic() < deadline:
            batch = repl.read_batch(1.0)
            largest = max(largest, len(batch))
            for raw in batch:
                assert type(raw) is (bytes if c_reader else memoryview)
                message = decode_copy_data(raw)
                if isinstance(message, XLogData):
                    out.append((message.wal_start, message.data))
                    if message.data[:1] == b"M" and marker in message.data:
                        return out, largest
    raise TimeoutError(f"no end marker from slot {slot}")


@pytest.mark.native
def test_the_c_reader_reads_what_get_copy_data_reads(db: Any) -> None:
    create_tables(db.conninfo)
    for slot in ("c_reader", "py_reader"):
        create_slot(db.conninfo, slot)
    run_options_workload(db.conninfo)  # a streamed transaction among others
    query(db.conninfo, "SELECT pg_logical_emit_message(false, %s, '')", (END_PREFIX,))
    options = pgoutput_options(highest_proto_version(db.major_version * 10000),
                               streaming="on", publication="p1,p2")
    got, largest = _read_all(db.conninfo, "c_reader", options, c_reader=True)
    expected, _ = _read_all(db.conninfo, "py_reader", options, c_reader=False)
    assert got == expected
    assert len(got) > 3000  # the workload's large transaction, at least
    assert 1 < largest <= _BATCH  # read in batches, never longer than asked
