"""``SessionRecorder``, what ``pgdecode capture`` writes a session's stream with, ended after
any message (a lost connection, an error): the capture replay's check accepts, holding the
stream exactly up to the last transaction boundary before the end."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scripted import Wal, dele, ins, upd

from plugin_framework import LSN
from plugin_framework.protocol import PrimaryKeepalive, XLogData
from plugin_framework.sources.capture import (
    CaptureHeader,
    SessionRecorder,
    read_capture,
    verify_capture,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def scripted_session() -> tuple[list[XLogData | PrimaryKeepalive], list[int]]:
    """A session's messages (ordinary, streamed, prepared transactions, a non-transactional
    message, keepalives inside and between them), and the number of messages sent at each
    boundary between transactions and stream blocks (as the script knows it, not as
    statecheck's TransactionBounds works it out)."""
    wal = Wal()
    wal.table("t", "id", "v")
    boundaries = [0]
    keepalives: set[int] = set()

    def done() -> None:
        boundaries.append(len(wal.items))

    wal.txn(700, ins("t", "1", "a"), ins("t", "2", "b"))
    done()
    wal.nontx("audit", b"between")
    done()
    wal.block(701, ins("t", "3", "c"), upd("t", "1", "1", "aa"))
    done()
    keepalives.add(len(wal.items))  # between stream blocks
    wal.txn(702, dele("t", "2"))
    done()
    wal.block(701, ins("t", "4", "d"))
    done()
    wal.stream_commit(701)
    done()
    keepalives.add(len(wal.items) - 1)  # inside the next transaction
    wal.prepared(703, "g", ins("t", "5", "e"), ins("t", "6", "f"))
    done()
    wal.commit_prepared(703, "g")
    done()
    messages: list[XLogData | PrimaryKeepalive] = []
    at_boundary = []  # message counts
    for i, (data, lsn) in enumerate(wal.items):
        if i in boundaries:
            at_boundary.append(len(messages))
        if i in keepalives:
            messages.append(PrimaryKeepalive(LSN(lsn), NOW, False))
            if i in boundaries:  # a keepalive between transactions ends one too
                at_boundary.append(len(messages))
        messages.append(XLogData(lsn, lsn, NOW, data))
    return messages, [*at_boundary, len(messages)]


MESSAGES, BOUNDARIES = scripted_session()


@settings(max_examples=len(MESSAGES) + 1, deadline=None)
@given(st.integers(0, len(MESSAGES)))
def test_a_capture_ended_after_any_message_holds_the_stream_to_the_boundary_before(
        end: int) -> None:
    kept = max(b for b in BOUNDARIES if b <= end)
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "c.pgd"
        out = open(path, "ab")  # noqa: SIM115  (the recorder closes it)
        recorder = SessionRecorder(out, lambda: CaptureHeader(proto_version=4))
        for message in MESSAGES[:end]:
            recorder.write(message)
        cut = recorder.close()
        if end == 0:  # nothing recorded: not even a header
            assert cut is None and path.read_bytes() == b""
            return
        assert (cut is None) == (kept == end)
        assert verify_capture(path).damage is None
        recorded = [m.data for m in read_capture(path)[1] if isinstance(m, XLogData)]
        assert recorded == [m.data for m in MESSAGES[:kept] if isinstance(m, XLogData)]
        assert cut is None or path.stat().st_size == cut
