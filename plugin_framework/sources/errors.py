"""Errors of the sources, each saying what went wrong and what to do about it.

Server errors arrive as psycopg exceptions; ``explain`` turns the ones a user can act on into
a SourceError with advice. Connection details are shown without their password.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

from plugin_framework.sources.replication import ReplicationError

# Connection exceptions, operator intervention (shutdown, restart, starting up), resources.
_TRANSIENT_CLASSES = ("08", "57", "53")


class SourceError(Exception):
    """A source cannot go on; the message says why and what to do."""


class ConnectionLost(SourceError):
    """The connection dropped; the source may reconnect and resume from the slot."""


def describe_conninfo(conninfo: str) -> str:
    """host/port/database/user of a conninfo, never its password."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "(unparsable connection string)"
    shown = [f"{k}={params[k]}" for k in ("host", "port", "dbname", "user") if params.get(k)]
    return " ".join(shown) or "(PG* environment defaults)"


def _redact(text: str, conninfo: str) -> str:
    try:
        password = conninfo_to_dict(conninfo).get("password")
    except psycopg.ProgrammingError:
        return text
    return text.replace(str(password), "********") if password else text


def explain(exc: BaseException, conninfo: str, slot: str | None = None,
            proto_version: int | None = None) -> SourceError:
    """A SourceError with advice for a server or connection error."""
    where = describe_conninfo(conninfo)
    message = _redact(str(exc).strip(), conninfo)
    sqlstate = getattr(exc, "sqlstate", None)
    lower = message.lower()
    if sqlstate and sqlstate[:2] in _TRANSIENT_CLASSES:
        return ConnectionLost(f"connection to {where} lost: {message}")
    if isinstance(exc, psycopg.OperationalError | ReplicationError) and sqlstate is None:
        if "connection" in lower and ("failed" in lower or "refused" in lower
                                      or "could not" in lower or "timeout" in lower):
            return ConnectionLost(f"cannot connect to {where}: {message}")
        return ConnectionLost(f"connection to {where} lost: {message}")
    if "wal_level" in lower:
        return SourceError(
            f"{message}. Logical decoding needs wal_level = logical on the server: run "
            "ALTER SYSTEM SET wal_level = logical; and restart the server."
        )
    if sqlstate == "42704" and slot and "replication slot" in lower:
        return SourceError(
            f'{message}. Create it with `pgdecode slot create -d ... -S {slot}`, or pass '
            "--create-slot."
        )
    if sqlstate == "42704" and "publication" in lower:
        return SourceError(
            f"{message}. Create it on the source database (CREATE PUBLICATION name FOR ALL "
            "TABLES, or FOR TABLE ...), or pass the name of an existing one with --publication."
        )
    if sqlstate == "55006" or "is active for pid" in lower:
        return SourceError(
            f"{message}. Another consumer is reading this slot: stop it, or use another slot "
            "(each consumer needs its own)."
        )
    if "can no longer get changes" in lower or "invalidated" in lower:
        return SourceError(
            f"{message}. The slot was invalidated and cannot be used again: drop it "
            f"(`pgdecode slot drop -S {slot}`), create a new one, and re-copy the tables; the "
            "changes in between are lost (raise max_slot_wal_keep_size to prevent this)."
        )
    if sqlstate == "42501" or "permission denied" in lower or "must be superuser" in lower:
        return SourceError(
            f"{message}. The role needs the REPLICATION attribute (ALTER ROLE name "
            "REPLICATION) or superuser, and pg_hba.conf must allow it."
        )
    if "proto_version" in lower or "protocol version" in lower:
        hint = f" (asked for {proto_version})" if proto_version else ""
        return SourceError(
            f"{message}{hint}. Ask for a version the server supports with --proto-version "
            "(PostgreSQL 14: 2, 15: 3, 16 and later: 4), or leave it out to negotiate."
        )
    return SourceError(f"{where}: {message}")
