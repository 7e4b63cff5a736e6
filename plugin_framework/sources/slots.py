"""Replication slot management: create (optionally if not exists), drop, list."""

from __future__ import annotations

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
from plugin_framework.sources.replication import ReplicationStream


@dataclass(frozen=True)
class SlotInfo:
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
    existing = list_slots(conn, name)
    if existing:
        if if_not_exists:
            return existing[0], False
        raise psycopg.errors.DuplicateObject(f'replication slot "{name}" already exists')
    if failover and conn.info.server_version < 170000:
        raise ValueError("failover slots need PostgreSQL 17 or later")
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
    snapshot (the initial copy reads with it; sources/snapshot.py)."""
    temp = " TEMPORARY" if temporary else ""
    if server_version >= 150000:
        snapshot = "SNAPSHOT 'export'" if export else "SNAPSHOT 'nothing'"
        options = [snapshot] + (["TWO_PHASE"] if two_phase else [])
        return (f"CREATE_REPLICATION_SLOT {quote_ident_always(name)}{temp} LOGICAL pgoutput "
                f"({', '.join(options)})")
    return (f"CREATE_REPLICATION_SLOT {quote_ident_always(name)}{temp} LOGICAL pgoutput "
            + ("EXPORT_SNAPSHOT" if export else "NOEXPORT_SNAPSHOT"))


def check_slot(repl: ReplicationStream, slot: str, *, temporary: bool,
               previous_pid: int | None) -> tuple[bool, LSN | None]:
    """That the slot can be streamed from on this replication connection (it exists, is a
    pgoutput slot of this database, was not invalidated, and no other consumer holds it),
    else SourceError saying what to do. Returns its two_phase and confirmed_flush_lsn.
    ``previous_pid``: the walsender of our last connection, which may not be gone yet."""
    why_lost = "invalidation_reason" if repl.conn.info.server_version >= 170000 else "NULL"
    rows = repl.command(
        "SELECT plugin, database, wal_status, active_pid, confirmed_flush_lsn::text, "
        f"{why_lost}, two_phase FROM pg_replication_slots "
        f"WHERE slot_name = {quote_standard_literal(slot)}")
    if not rows:
        raise SlotUnusable(
            f'replication slot "{slot}" does not exist: create it with `pgdecode slot '
            f"create -S {slot} ...` or pass --create-slot")
    plugin, database, wal_status, pid, confirmed, reason, two_phase = rows[0]
    if plugin != "pgoutput":
        raise SourceError(
            f'replication slot "{slot}" uses output plugin "{plugin}"; pgdecode reads '
            "pgoutput slots: create one with `pgdecode slot create`")
    if database != repl.conn.info.dbname:
        raise SourceError(
            f'replication slot "{slot}" belongs to database "{database}", not '
            f'"{repl.conn.info.dbname}": connect to that database with -d')
    if wal_status == "lost":
        why = f" ({reason})" if reason else ""
        raise SlotUnusable(
            f'replication slot "{slot}" was invalidated{why} and cannot be used '
            f"again: {invalidated_advice(slot, reason)}")
    if pid is not None and not temporary:
        if pid == previous_pid:  # our own previous walsender, not yet gone: try again shortly
            raise ConnectionLost(f'replication slot "{slot}" is still active for PID {pid}')
        raise SourceError(
            f'replication slot "{slot}" is active for PID {pid}: another consumer is '
            "reading it; stop it, or use another slot (each consumer needs its own)")
    return bool(two_phase), LSN(confirmed) if confirmed else None
