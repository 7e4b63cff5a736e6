"""The slot's keeper beside a running stream: it reads the slot's row of pg_replication_slots
every ``poll_interval`` seconds and warns in the log when the slot nears
``max_slot_wal_keep_size``; with ``heartbeat``, it also writes a heartbeat into the WAL of the
slot's database every so many seconds (``pgdecode stream --heartbeat``).

Both run in a daemon thread over short ordinary connections, never on the replication
connection, so that nothing here can hold up the stream. The metrics collector
(metrics.py) reads the last row polled here.

The heartbeat is a non-transactional logical message with the prefix ``pgdecode``, which
the walsender source takes out of the stream (snapshots/incremental.py), so plugins never see it. It
gives an idle database's slot WAL of its own to pass: the walsender decodes it, and the
acknowledgement after it moves the slot's ``confirmed_flush_lsn`` and, with it, the
``restart_lsn`` that decides how much WAL the server keeps.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import psycopg

from plugin_framework.sources.errors import SourceError
from plugin_framework.sources.slots import slot_health

__all__ = ["NEAR_LIMIT", "SlotMonitor", "near_limit"]

log = logging.getLogger("pgdecode.slot")

# A slot is near max_slot_wal_keep_size when less than this fraction of it is left
# (pg_replication_slots.safe_wal_size), or when its wal_status is "unreserved".
NEAR_LIMIT = 0.2
# the prefix the walsender source swallows (snapshots/incremental.py)
_HEARTBEAT_PREFIX = "pgdecode"


def near_limit(row: dict[str, Any], limit: int | None) -> str | None:
    """Why the slot of ``row`` (slot_health) is in danger of invalidation by
    ``max_slot_wal_keep_size`` (``limit`` bytes; None: unlimited), or None."""
    if row.get("wal_status") == "lost":
        return ("its WAL was removed past max_slot_wal_keep_size: it is invalidated, and the "
                "stream cannot go on from it")
    if row.get("wal_status") == "unreserved":
        return ("its WAL is past max_slot_wal_keep_size: the server will invalidate it at a "
                "checkpoint unless the consumer catches up first")
    safe = row.get("safe_wal_size")
    if limit and safe is not None and safe < NEAR_LIMIT * limit:
        return (f"{safe / 2**20:.0f} MB of WAL left before max_slot_wal_keep_size "
                f"({limit / 2**20:.0f} MB) invalidates it")
    return None


class SlotMonitor:
    """Polls one slot's health (and writes heartbeats) while a source runs."""

    def __init__(self, conninfo: str, slot: str, *, poll_interval: float = 10.0,
                 heartbeat: float | None = None) -> None:
        self.conninfo = conninfo
        self.slot = slot
        self.poll_interval = poll_interval
        self.heartbeat = heartbeat
        self.row: dict[str, Any] | None = None  # the last row polled
        self.limit: int | None = None  # max_slot_wal_keep_size in bytes; None: unlimited
        self.poll_errors = 0
        self.heartbeats = 0  # heartbeats written
        self.heartbeat_lsn: str | None = None  # where the last one went
        self.warning: str | None = None  # the danger the slot is in, as last polled
        self._polled = -float("inf")
        self._beat = -float("inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Write the first heartbeat now (a role that may not is told at once), then poll
        and beat in a daemon thread until ``stop()``."""
        if self.heartbeat is not None:
            try:
                self._write_heartbeat(first=True)
            except psycopg.Error as exc:  # the stream itself says what is wrong, and retries
                log.warning("slot %s: cannot write a heartbeat: %s", self.slot,
                            _first_line(exc))
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pgdecode-slot", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            if self.heartbeat is not None \
                    and time.monotonic() - self._beat >= self.heartbeat:
                try:
                    self._write_heartbeat()
                except psycopg.Error as exc:
                    log.warning("slot %s: cannot write a heartbeat: %s", self.slot,
                                _first_line(exc))
            wait = self.poll_interval if self.heartbeat is None \
                else min(self.poll_interval, self.heartbeat)
            self._stop.wait(wait)

    def poll(self) -> dict[str, Any] | None:
        """The slot's row, read again when older than ``poll_interval``; the last one read
        if the server cannot be asked."""
        with self._lock:
            if time.monotonic() - self._polled < self.poll_interval:
                return self.row
            self._polled = time.monotonic()
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute("SET default_transaction_read_only = on")
                    rows = slot_health(conn, self.slot)
                    setting = conn.execute(
                        "SELECT CASE WHEN setting::bigint < 0 THEN NULL "
                        "ELSE pg_size_bytes(setting || coalesce(unit, '')) END "
                        "FROM pg_settings WHERE name = 'max_slot_wal_keep_size'").fetchone()
                self.row = rows[0] if rows else None
                self.limit = None if setting is None or setting[0] is None else int(setting[0])
            except psycopg.Error as exc:
                self.poll_errors += 1
                log.warning("slot %s: cannot read pg_replication_slots: %s", self.slot,
                            _first_line(exc))
                return self.row
            self._judge()
            return self.row

    def _judge(self) -> None:
        """Warn once when the slot comes near its limit (or is lost); say so when it is no
        longer. A slot not found says nothing either way: the stream reports that."""
        if self.row is None:
            return
        danger = near_limit(self.row, self.limit)
        if danger is not None and self.warning is None:
            log.warning('slot "%s": %s. Let the consumer catch up, or raise '
                        "max_slot_wal_keep_size; an invalidated slot must be dropped and the "
                        "tables copied again (docs/operations.md)", self.slot, danger)
        elif danger is None and self.warning is not None:
            log.info('slot "%s": no longer near max_slot_wal_keep_size', self.slot)
        self.warning = danger

    def _write_heartbeat(self, *, first: bool = False) -> None:
        """One heartbeat. The ``first`` tells a server or role that can never take one
        (SourceError) from a failure to retry (psycopg.Error)."""
        self._beat = time.monotonic()
        body = json.dumps({"heartbeat": self.slot})
        with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
            if first:
                _refuse_a_standby(conn)
            try:
                row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text",
                                   (_HEARTBEAT_PREFIX, body)).fetchone()
            except psycopg.errors.InsufficientPrivilege as exc:
                if not first:
                    raise
                flush = ", boolean" if conn.info.server_version >= 170000 else ""
                raise SourceError(
                    f"--heartbeat: {_first_line(exc)}. The heartbeats are written with "
                    "pg_logical_emit_message(): GRANT EXECUTE ON FUNCTION "
                    f"pg_logical_emit_message(boolean, text, text{flush}) TO the stream's "
                    "role, or leave out --heartbeat") from None
            except psycopg.errors.ReadOnlySqlTransaction as exc:
                if not first:
                    raise
                raise SourceError(f"--heartbeat: {_first_line(exc)}. A heartbeat is written "
                                  "into the database, which must accept writes: leave out "
                                  "--heartbeat") from None
        self.heartbeats += 1
        self.heartbeat_lsn = None if row is None else row[0]
        log.debug("slot %s: heartbeat at %s", self.slot, self.heartbeat_lsn)


def _refuse_a_standby(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    if row is not None and row[0]:
        raise SourceError("--heartbeat: the server is a standby, where nothing can be "
                          "written; the heartbeats go to the primary (or leave out "
                          "--heartbeat)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
