"""A logical replication connection over psycopg 3: START_REPLICATION and the COPY_BOTH stream.

This is the I/O edge: it moves CopyData payloads and standby status updates, and leaves their
meaning to ``plugin_framework.protocol``. Reads never block for longer than asked.
"""

from __future__ import annotations

import select
import time
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import psycopg

from plugin_framework.pgtypes import quote_ident_always, quote_standard_literal
from plugin_framework.protocol import (
    LSN,
    PrimaryKeepalive,
    StandbyStatusUpdate,
    XLogData,
    decode_copy_data,
    encode_copy_data,
)
from plugin_framework.sources.libpq import ReadCopyData, copy_data_reader, failed_result

_BATCH = 512  # read_batch returns at most this many payloads



class ReplicationError(Exception):
    """The replication stream ended; ``sqlstate`` is the server's error code, if it sent one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def start_replication_command(slot: str, start_lsn: LSN, options: Mapping[str, str]) -> str:
    opts = ", ".join(f"{quote_ident_always(k)} {quote_standard_literal(v)}"
                     for k, v in options.items())
    command = f"START_REPLICATION SLOT {quote_ident_always(slot)} LOGICAL {start_lsn}"
    return f"{command} ({opts})" if opts else command


class ReplicationStream:
    """One walsender session: open, start streaming from a slot, read, acknowledge, close."""

    def __init__(self, conninfo: str, **connect_kwargs: Any) -> None:
        self.conn: psycopg.Connection[Any] = psycopg.connect(
            conninfo, replication="database", autocommit=True, **connect_kwargs
        )
        self._streaming = False
        self._copy_ended = False  # read_batch saw the end of the copy, not yet reported
        self._pending: deque[bytes | memoryview] = deque()  # read a batch at a time
        # The C reader of buffered messages where it is built and bound to psycopg's libpq
        # (sources/libpq.py), else None: psycopg.pq's get_copy_data, its reference, reads.
        self._read_buffered: ReadCopyData | None = copy_data_reader()

    def identify_system(self) -> tuple[str, int, LSN, str | None]:
        """(system id, timeline, current WAL flush LSN, database name)."""
        row = self.conn.execute("IDENTIFY_SYSTEM").fetchone()
        assert row is not None
        return str(row[0]), int(row[1]), LSN(str(row[2])), row[3]

    def command(self, text: str) -> list[tuple[Any, ...]]:
        """Run a replication command (CREATE_REPLICATION_SLOT, ...) and return its rows."""
        cur = self.conn.execute(text)
        return cur.fetchall() if cur.description else []

    def start(self, slot: str, start_lsn: LSN, options: Mapping[str, str]) -> None:
        self.conn.execute(start_replication_command(slot, start_lsn, options))
        self._streaming = True

    def read(self, timeout: float) -> XLogData | PrimaryKeepalive | None:
        """The next message from the server, or None if none arrived within ``timeout`` s."""
        if not self._pending:
            self._pending.extend(self.read_batch(timeout))
            if not self._pending:
                return None
        return decode_copy_data(self._pending.popleft())

    def read_batch(self, timeout: float) -> list[bytes | memoryview]:
        """Every CopyData payload buffered now, raw ('w' XLogData or 'k' keepalive, see
        plugin_framework.protocol.framing); waits up to ``timeout`` s for the first. Empty if
        none arrived in time. Reading in batches takes the per-message bookkeeping (clock,
        stop requests) out of the hot loop; the C reader (``_read_buffered``) takes what libpq
        has buffered in one call, as bytes (get_copy_data's are memoryviews)."""
        if self._pending:  # what read() took from the last batch and has not returned yet
            left = list(self._pending)
            self._pending.clear()
            return left
        pgconn = self.conn.pgconn
        get = pgconn.get_copy_data
        read = self._read_buffered
        batch: list[bytes | memoryview] = []
        if self._copy_ended:
            self._copy_ended = self._streaming = False
            self._raise_copy_end()
        while True:
            # the PGconn's address (psycopg's PGconn has it, its abc does not; None closed)
            ptr: int | None = None if read is None else getattr(pgconn, "pgconn_ptr", None)
            if ptr is not None and read is not None:
                got, nbytes = read(ptr, _BATCH - len(batch))
                batch += got
                if nbytes > 0:  # _BATCH of them
                    return batch
            else:
                nbytes, data = get(1)
                if nbytes > 0:
                    batch.append(data)
                    if len(batch) < _BATCH:
                        continue
                    return batch
            if nbytes < 0:
                if batch:  # deliver these first; the next call reports the end
                    self._copy_ended = True
                    return batch
                self._streaming = False
                self._raise_copy_end()
            if batch:
                return batch
            ready, _, _ = select.select([pgconn.socket], [], [], timeout)
            if not ready:
                return batch
            pgconn.consume_input()
            timeout = 0.0

    def send_status(self, written: LSN, flushed: LSN, applied: LSN,
                    reply_requested: bool = False) -> None:
        update = StandbyStatusUpdate(written, flushed, applied, datetime.now(UTC), reply_requested)
        pgconn = self.conn.pgconn
        if pgconn.put_copy_data(encode_copy_data(update)) != 1 or pgconn.flush() < 0:
            raise ReplicationError(
                f"could not send a standby status update: {pgconn.get_error_message()}"
            )

    def end(self, timeout: float = 10.0) -> None:
        """End streaming cleanly, as pg_recvlogical does: send CopyDone, then drain what the
        server still sends until it ends the COPY too. The walsender processes every status
        update sent before the CopyDone, so the last acknowledgement is not lost to a
        connection closed while the server was writing. Gives up after ``timeout`` s."""
        if not self._streaming:
            return
        self._streaming = False
        pgconn = self.conn.pgconn
        if pgconn.put_copy_end() != 1 or pgconn.flush() < 0:
            raise ReplicationError(f"could not end the stream: {pgconn.get_error_message()}")
        deadline = time.monotonic() + timeout
        while True:
            nbytes, _ = pgconn.get_copy_data(1)
            if nbytes < 0:
                break
            if nbytes > 0:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplicationError("the server did not end the stream in time")
            ready, _, _ = select.select([pgconn.socket], [], [], left)
            if ready:
                pgconn.consume_input()
        error = None
        while (result := pgconn.get_result()) is not None:
            if error is None:
                error = failed_result(result)
        if error is not None and error[0]:
            raise ReplicationError(error[0])

    def _raise_copy_end(self) -> None:
        pgconn = self.conn.pgconn
        result = pgconn.get_result()
        while pgconn.get_result() is not None:
            pass
        failed = failed_result(result)
        if failed is not None:
            raise ReplicationError(*failed)
        raise ReplicationError("the server ended the replication stream")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ReplicationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
