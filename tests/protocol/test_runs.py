"""Runs of row changes in a batch of XLogData messages (protocol/runs.py): what a run is, and
the C scanner (protocol/native/_runs.c) equal to the Python reference it mirrors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin_framework.protocol import LSN
from plugin_framework.protocol.framing import (
    PrimaryKeepalive,
    XLogData,
    decode_copy_data,
    encode_copy_data,
)
from plugin_framework.protocol.runs import row_change_run, row_change_run_py

_WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _xlogdata(payload: bytes, lsn: int) -> bytes:
    return encode_copy_data(XLogData(LSN(lsn), LSN(lsn + len(payload)), _WHEN, payload))


def _keepalive(lsn: int) -> bytes:
    return encode_copy_data(PrimaryKeepalive(LSN(lsn), _WHEN, False))


# Payloads that make runs and break them: row changes of two ids and three tags (long and
# at the shortest), other pgoutput messages, and a payload too short for a run's key.
_PAYLOAD = st.one_of(
    st.builds(lambda tag, ident, body: tag + ident.to_bytes(4, "big") + body,
              st.sampled_from([b"I", b"U", b"D"]), st.sampled_from([16384, 16390]),
              st.binary(max_size=12)),
    st.builds(lambda tag, body: tag + body, st.sampled_from([b"B", b"C", b"R", b"M", b"S"]),
              st.binary(max_size=12)),
    st.binary(max_size=4),
)
_MESSAGE = st.one_of(
    st.builds(_xlogdata, _PAYLOAD, st.integers(0, 2**64 - 2**20)),
    st.builds(_keepalive, st.integers(0, 2**64 - 1)),
    st.binary(max_size=30),  # a CopyData message of neither kind, or cut short
)


def _runs(batch: list[bytes]) -> list[tuple[list[bytes], list[LSN], int, int]]:
    """Every run of the batch found by walking it as the source does: (payloads, lsns, start,
    next) for each non-empty run."""
    found = []
    i = 0
    while i < len(batch):
        datas, lsns, nxt = row_change_run_py(batch, i)
        if datas:
            found.append((datas, lsns, i, nxt))
            i = nxt
        else:
            i += 1
    return found


@given(st.lists(_MESSAGE, max_size=25))
def test_a_run_is_the_consecutive_row_changes_with_one_tag_and_id(batch: list[bytes]) -> None:
    """Each run holds the payloads and start LSNs that decode_copy_data reads from its
    messages; its messages share the type byte and the id after it; a run ends only where
    the next message could not extend it; every row-change XLogData message is in a run."""
    in_runs = set()
    for datas, lsns, start, nxt in _runs(batch):
        assert nxt - start == len(datas) == len(lsns)
        for k, i in enumerate(range(start, nxt)):
            message = decode_copy_data(batch[i])
            assert isinstance(message, XLogData)
            assert (datas[k], lsns[k]) == (message.data, message.wal_start)
            assert type(lsns[k]) is LSN and type(datas[k]) is bytes
            assert datas[k][:5] == datas[0][:5] and datas[k][:1] in (b"I", b"U", b"D")
            in_runs.add(i)
        if nxt < len(batch):  # what stopped it is not one more change of the run
            raw = batch[nxt]
            assert not (len(raw) >= 30 and raw[:1] == b"w" and raw[25:30] == datas[0][:5])
    for i, raw in enumerate(batch):
        if len(raw) >= 30 and raw[:1] == b"w" and raw[25:26] in (b"I", b"U", b"D"):
            assert i in in_runs


def test_a_run_of_memoryviews_as_the_replication_stream_returns_them() -> None:
    """read_batch gives memoryviews of psycopg's buffers: the same run as from bytes."""
    rows = [_xlogdata(b"I" + (16384).to_bytes(4, "big") + b"N" + bytes([i]), 100 + 10 * i)
            for i in range(3)]
    batch = [*rows, _xlogdata(b"C" + bytes(8), 200), *rows]
    expected = row_change_run_py(batch, 0)
    assert row_change_run([memoryview(b) for b in batch], 0) == expected
    assert expected[1] == [LSN(100), LSN(110), LSN(120)] and expected[2] == 3
    assert row_change_run(batch, 3) == ([], [], 3)
    assert row_change_run(batch, 4)[2] == len(batch)
    with pytest.raises(ValueError):
        row_change_run(batch, -1)


@pytest.mark.native
def test_the_c_run_scanner_is_built() -> None:
    """`pip install` compiles it; without it, the test below would compare nothing."""
    from plugin_framework.protocol import runs

    assert runs._runs is not None


@pytest.mark.native
@settings(max_examples=1500, deadline=None)
@given(st.lists(_MESSAGE, max_size=25), st.integers(0, 27), st.booleans())
def test_c_run_scanner_equals_the_python_one(batch: list[bytes], start: int,
                                             views: bool) -> None:
    from plugin_framework.protocol import runs

    assert runs._runs is not None
    given_batch = [memoryview(b) for b in batch] if views else batch
    found = runs._runs.row_change_run(given_batch, start, runs.wire_lsn)
    expected = row_change_run_py(batch, start)
    assert found == expected
    assert all(type(d) is bytes for d in found[0]) and all(type(x) is LSN for x in found[1])
