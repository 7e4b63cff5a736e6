"""Replication slots: the one check of a slot that every source and command runs before it
uses one (``usable_slot``: exists, logical, pgoutput, this database, not invalidated, not read
by another consumer; two-phase decoding as the run expects), and their management: create
(optionally if not exists), drop, list."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import psycopg

from plugin_framework.pgtypes import quote_ident_always, quote_standard_literal
from plugin_framework.protocol import LSN
from plugin_framework.sources.errors import (
    ConnectionLost,
    SlotUnusable,
    SourceError,
    invalidated_advice,
)

log = logging.getLogger("pgdecode.source")

# Runs one query (no parameters: a replication connection takes only the simple protocol)
# and returns its rows: ``ReplicationStream.command``, or ``sql_query(conn)``.
Query = Callable[[str], list[tuple[Any, ...]]]


# The walsenders of replication connections this process closed, by server and slot, and
# when. A walsender holds its slot for a moment after its connection is gone; a stream this
# process starts on the slot meanwhile (ForeachBatchStream run again after an error, a
# notebook's next query, a reconnect) waits for it instead of taking it for another consumer.
# A minute is far more than a walsender takes to go; past it, the PID may be another's.
_GONE_WITHIN = 60.0
_closed: dict[tuple[str, str], dict[int, float]] = {}
_closed_lock = threading.Lock()


def closed_walsender(server: str, slot: str, pid: int) -> None:
    """Note that this process closed its connection to walsender ``pid`` of ``server``
    (host and port), which was reading ``slot``."""
    now = time.monotonic()
    with _closed_lock:
        pids = _closed.setdefault((server, slot), {})
        for old in [p for p, when in pids.items() if now - when > _GONE_WITHIN]:
            del pids[old]
        pids[pid] = now


def own_walsenders(server: str, slot: str) -> frozenset[int]:
    """The walsenders of ``slot`` whose connections this process closed lately."""
    now = time.monotonic()
    with _closed_lock:
        pids = _closed.get((server, slot), {})
        return frozenset(p for p, when in pids.items() if now - when <= _GONE_WITHIN)


def sql_query(conn: psycopg.Connection[Any]) -> Query:
    """A Query on an ordinary connection."""
    def run(text: str) -> list[tuple[Any, ...]]:
        cursor = conn.execute(text)  # (text: built with quote_standard_literal)
        return cursor.fetchall() if cursor.description else []
    return run


@dataclass(frozen=True)
class SlotInfo:
    """A replication slot as pg_replication_slots shows it."""

    name: str
    plugin: str | None
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    two_phase: bool
    confirmed_flush_lsn: LSN | None
    restart_lsn: LSN | None
    wal_status: str | None
    failover: bool | None  # PostgreSQL 17 and later
    invalidation_reason: str | None  # PostgreSQL 17 and later
    slot_type: str = "logical"


def list_slots(conn: psycopg.Connection[Any], name: str | None = None) -> list[SlotInfo]:
    version = conn.info.server_version
    extra = ", failover, invalidation_reason" if version >= 170000 else ", NULL, NULL"
    rows = conn.execute(
        "SELECT slot_name, plugin, database, temporary, active, active_pid, two_phase, "
        f"confirmed_flush_lsn::text, restart_lsn::text, wal_status{extra} "
        "FROM pg_replication_slots WHERE slot_type = 'logical' "
        "AND (%s::text IS NULL OR slot_name = %s) ORDER BY slot_name",
        (name, name),
    ).fetchall()
    return [
        SlotInfo(r[0], r[1], r[2], r[3], r[4], r[5], r[6],
                 LSN(r[7]) if r[7] else None, LSN(r[8]) if r[8] else None, r[9], r[10], r[11])
        for r in rows
    ]


# pg_replication_slots' columns that came later than PostgreSQL 15, the oldest pgdecode reads
_SINCE_17 = ("failover", "inactive_since", "invalidation_reason")


def slot_health(conn: psycopg.Connection[Any], name: str | None = None) -> list[dict[str, Any]]:
    """What ``pgdecode status`` reports of each logical slot (or of ``name``), from
    pg_replication_slots: the columns below, ``lag_bytes`` (the server's WAL position, or
    on a standby its replay position, minus ``confirmed_flush_lsn``), ``retained_bytes``
    (the same minus ``restart_lsn``: the WAL the slot holds back) and, for two-phase
    slots, ``prepared``: the prepared transactions of the slot's database
    (pg_prepared_xacts), which the slot's consumer may be holding until they end."""
    later = ", ".join(f"s.{c}" if conn.info.server_version >= 170000 else f"NULL AS {c}"
                      for c in _SINCE_17)
    cursor = conn.execute(
        "WITH here AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
        "ELSE pg_current_wal_lsn() END AS lsn) "
        "SELECT s.slot_name AS slot, s.plugin, s.database, s.temporary, s.active_pid, "
        "s.two_phase, s.confirmed_flush_lsn::text AS confirmed_flush_lsn, "
        "s.restart_lsn::text AS restart_lsn, "
        "pg_wal_lsn_diff(here.lsn, s.confirmed_flush_lsn)::bigint AS lag_bytes, "
        "pg_wal_lsn_diff(here.lsn, s.restart_lsn)::bigint AS retained_bytes, "
        f"s.wal_status, s.safe_wal_size, {later}, "
        "CASE WHEN s.two_phase THEN (SELECT count(*) FROM pg_prepared_xacts p "
        "WHERE p.database = s.database) END AS prepared "
        "FROM pg_replication_slots s, here WHERE s.slot_type = 'logical' "
        "AND (%s::text IS NULL OR s.slot_name = %s) ORDER BY s.slot_name", (name, name))
    names = [d.name for d in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def create_slot(conn: psycopg.Connection[Any], name: str, *, two_phase: bool = False,
                failover: bool = False, temporary: bool = False,
                if_not_exists: bool = False) -> tuple[SlotInfo, bool]:
    """Create a pgoutput slot; returns it and whether it was created now. A temporary slot
    lasts as long as ``conn``'s session."""
    query = sql_query(conn)
    existing = lookup_slot(query, name, conn.info.server_version)
    if existing is not None:
        if if_not_exists:  # one pgdecode can use
            return check_usable(existing, name, dbname=conn.info.dbname, reader=False), False
        raise psycopg.errors.DuplicateObject(f'replication slot "{name}" already exists')
    if failover and conn.info.server_version < 170000:
        raise ValueError("failover slots need PostgreSQL 17 or later")
    note_slot_wait(query, name)
    if conn.info.server_version >= 170000:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', %s, %s, %s)",
                     (name, temporary, two_phase, failover))
    else:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', %s, %s)",
                     (name, temporary, two_phase))
    return list_slots(conn, name)[0], True


def drop_slot(conn: psycopg.Connection[Any], name: str, *, if_exists: bool = False) -> bool:
    if not list_slots(conn, name):
        if if_exists:
            return False
        raise psycopg.errors.UndefinedObject(f'replication slot "{name}" does not exist')
    conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    return True


def create_replication_slot_command(name: str, *, temporary: bool, two_phase: bool,
                                    server_version: int, export: bool = False) -> str:
    """CREATE_REPLICATION_SLOT for a replication connection (needed for temporary slots,
    which live as long as the connection that created them). ``export``: export the slot's
    snapshot (the initial copy reads with it; sources/snapshots/copy.py)."""
    temp = " TEMPORARY" if temporary else ""
    if server_version >= 150000:
        snapshot = "SNAPSHOT 'export'" if export else "SNAPSHOT 'nothing'"
        options = [snapshot] + (["TWO_PHASE"] if two_phase else [])
        return (f"CREATE_REPLICATION_SLOT {quote_ident_always(name)}{temp} LOGICAL pgoutput "
                f"({', '.join(options)})")
    return (f"CREATE_REPLICATION_SLOT {quote_ident_always(name)}{temp} LOGICAL pgoutput "
            + ("EXPORT_SNAPSHOT" if export else "NOEXPORT_SNAPSHOT"))


def lookup_slot(query: Query, slot: str, server_version: int) -> SlotInfo | None:
    """The slot's row of pg_replication_slots, whatever its type (None: there is none)."""
    later = ("failover, invalidation_reason" if server_version >= 170000 else "NULL, NULL")
    rows = query(
        "SELECT plugin, database, temporary, active, active_pid, two_phase, "
        f"confirmed_flush_lsn::text, restart_lsn::text, wal_status, {later}, slot_type "
        f"FROM pg_replication_slots WHERE slot_name = {quote_standard_literal(slot)}")
    if not rows:
        return None
    r = rows[0]
    return SlotInfo(slot, r[0], r[1], bool(r[2]), bool(r[3]), r[4], bool(r[5]),
                    LSN(r[6]) if r[6] else None, LSN(r[7]) if r[7] else None, r[8], r[9],
                    r[10], r[11])


def check_usable(info: SlotInfo | None, slot: str, *, dbname: str, reader: bool = True,
                 temporary: bool = False, own_pids: Collection[int] = (),
                 two_phase: bool = False) -> SlotInfo:
    """That pgdecode can use the slot (``info``, from lookup_slot), else SourceError with
    one message that says what to do (SlotUnusable: missing or invalidated). ``reader``:
    the caller reads the slot, so no other consumer may (``own_pids``: walsenders of this
    process's closed connections, which may not be gone yet: ConnectionLost, to try again
    shortly; ``temporary``: a slot this connection made). ``two_phase``: the run asked for
    a two-phase slot (--two-phase), which an existing slot made without one cannot become:
    said as a warning."""
    if info is None:
        raise SlotUnusable(
            f'replication slot "{slot}" does not exist: create it with `pgdecode slot '
            f"create -S {slot} ...` or pass --create-slot")
    if info.slot_type != "logical":
        raise SourceError(
            f'replication slot "{slot}" is a {info.slot_type} slot; pgdecode reads logical '
            "slots of output plugin pgoutput: create one with `pgdecode slot create -S NAME` "
            "(or --create-slot)")
    if info.plugin != "pgoutput":
        raise SourceError(
            f'replication slot "{slot}" uses output plugin "{info.plugin}", not pgoutput, '
            "which pgdecode reads: create a slot of its own for pgdecode (`pgdecode slot "
            "create -S NAME`, or --create-slot), and leave this one to its consumer")
    if info.database != dbname:
        raise SourceError(
            f'replication slot "{slot}" belongs to database "{info.database}", not '
            f'"{dbname}": connect to that database with -d')
    if info.wal_status == "lost" or info.invalidation_reason is not None:
        why = f" ({info.invalidation_reason})" if info.invalidation_reason else ""
        raise SlotUnusable(
            f'replication slot "{slot}" was invalidated{why} and cannot be used '
            f"again: {invalidated_advice(slot, info.invalidation_reason)}")
    pid = info.active_pid
    if reader and pid is not None and not temporary:
        if pid in own_pids:
            raise ConnectionLost(f'replication slot "{slot}" is still active for PID {pid}')
        raise SourceError(
            f'replication slot "{slot}" is active for PID {pid}: another consumer is '
            "reading it; stop it, or use another slot (each consumer needs its own)")
    if two_phase and not info.two_phase:
        log.warning('replication slot "%s" was created without two-phase decoding, which '
                    "pgdecode never turns on for an existing slot: prepared transactions "
                    "arrive at COMMIT PREPARED. For them at PREPARE, create a new slot with "
                    "--two-phase", slot)
    return info


def usable_slot(query: Query, slot: str, *, dbname: str, server_version: int,
                reader: bool = True, temporary: bool = False,
                own_pids: Collection[int] = (), two_phase: bool = False) -> SlotInfo:
    """The slot, looked up and checked (``check_usable``)."""
    return check_usable(lookup_slot(query, slot, server_version), slot, dbname=dbname,
                        reader=reader, temporary=temporary, own_pids=own_pids,
                        two_phase=two_phase)


def note_slot_wait(query: Query, slot: str) -> None:
    """Before a slot is created: say that it waits for the transactions in progress, the
    prepared ones included, which may stay open for hours."""
    rows = query("SELECT count(*), string_agg(quote_literal(gid), ', ' ORDER BY prepared) "
                 "FROM pg_prepared_xacts")
    count, gids = rows[0] if rows else (0, None)
    if count:
        log.warning('creating replication slot "%s" waits until the %d prepared '
                    "transaction%s of the server (%s) %s committed or rolled back (COMMIT "
                    "PREPARED or ROLLBACK PREPARED; see pg_prepared_xacts): a slot starts "
                    "only once every transaction begun before it has ended", slot, count,
                    "" if count == 1 else "s", gids, "is" if count == 1 else "are")
    else:
        log.info('creating replication slot "%s" (once the transactions in progress have '
                 "ended)", slot)
