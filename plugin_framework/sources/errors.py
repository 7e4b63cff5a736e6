"""Errors of the sources, each saying what went wrong and what to do about it.

Server errors arrive as psycopg exceptions; ``explain`` turns the ones a user can act on into
a SourceError with advice. Connection details are shown without their password.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from plugin_framework.sources.replication import ReplicationError

# Connection exceptions, operator intervention (shutdown, restart, starting up), resources.
_TRANSIENT_CLASSES = ("08", "57", "53")
# ...except a cancelled statement (statement_timeout, pg_cancel_backend), which a retry
# only repeats, and a dropped database.
_NOT_TRANSIENT = ("57014", "57P04")


class SourceError(Exception):
    """A source cannot go on; the message says why and what to do."""


class ConnectionLost(SourceError):
    """The connection dropped; the source may reconnect and resume from the slot."""


class SlotUnusable(SourceError):
    """The slot does not exist or was invalidated: the stream cannot go on from it (the
    command's exit status is 3, so that a supervisor can tell this from other errors and
    stop restarting the consumer)."""


_URI_SCHEMES = ("postgresql://", "postgres://")  # as libpq spells them (case matters)
# In a URI's user name or password: "/" and "@" end it early, and "%" must start %XX.
_UNENCODED = re.compile(r"[/@]|%(?![0-9A-Fa-f]{2})")
_PERCENT_ENCODE = ("percent-encode special characters in the user name and password of a "
                   "URI (/ as %2F, @ as %40, % as %25, and the same in the database name), "
                   "or give the password with PGPASSWORD or ~/.pgpass")


class ConninfoError(ValueError):
    """A connection string that cannot be used as written; the message shows none of it."""


def _uri_userinfo(conninfo: str) -> str | None:
    """The user-info part of a URI (``user:password``) as its writer meant it: whatever
    precedes the last "@" ahead of the query string. libpq stops at the first "@" or "/"
    instead, so an unencoded one in the password turns the rest into host, port or
    database. None when the string is not a URI or has no user info."""
    for scheme in _URI_SCHEMES:
        if conninfo.startswith(scheme):
            head = conninfo[len(scheme):].split("?", 1)[0]
            at = head.rfind("@")
            return head[:at] if at >= 0 else None
    return None


def check_conninfo(conninfo: str) -> None:
    """Refuse (ConninfoError) a connection string that psycopg cannot parse, or a URI whose
    user info has an unencoded "/", "@" or "%" (libpq would read part of the password as a
    host, port or database name, and print it). Neither message shows any of the string:
    it may hold a password."""
    if _misread(conninfo):
        raise ConninfoError(
            "the connection URI given with -d has an unencoded /, @ or % before its host: "
            f"{_PERCENT_ENCODE}")
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        raise ConninfoError(
            "the connection string given with -d cannot be parsed (it is not shown: it may "
            f"hold a password): check its syntax, quote values with spaces in single quotes "
            f"in a key=value string, and {_PERCENT_ENCODE}") from None


def _misread(conninfo: str) -> bool:
    """Whether libpq would read another password than the one its writer meant (or none)."""
    userinfo = _uri_userinfo(conninfo)
    return userinfo is not None and _UNENCODED.search(userinfo) is not None


_KV_PASSWORD = re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)")


def _password_candidates(conninfo: str) -> list[str]:
    """What may be the password of a connection string libpq cannot parse (or misreads): a
    URI's user info and what follows its first ":", raw and decoded; the value of a
    password= key, quoted and not."""
    found: list[str] = []
    userinfo = _uri_userinfo(conninfo)
    if userinfo:
        found.append(userinfo)
        password = userinfo.partition(":")[2]
        found += [password, unquote(password)]
    for match in _KV_PASSWORD.finditer(conninfo):
        value = match.group(1)
        found += [value, re.sub(r"\\(.)", r"\1", value.strip("'"))]
    return [f for f in found if f]


def _redact(text: str, conninfo: str) -> str:
    """``text`` (a message about ``conninfo``) without the password. A string that
    ``check_conninfo`` refuses may have been misread, and libpq's message may echo any part
    of it: then the string itself, whatever may be a password, every value libpq read
    from it, and every quoted fragment of it are hidden."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        params = {}
    else:
        if not _misread(conninfo):
            password = params.get("password")
            return text.replace(str(password), "********") if password else text
    if conninfo:
        text = text.replace(conninfo, "(the connection string)")
    hidden = _password_candidates(conninfo) + [str(v) for v in params.values() if v]
    for candidate in sorted(set(hidden), key=len, reverse=True):
        text = text.replace(candidate, "********")
    return re.sub(r"""(["'])([^"']+)\1""",
                  lambda m: f"{m.group(1)}...{m.group(1)}" if m.group(2) in conninfo
                  else m.group(0), text)


def conninfo_without_password(conninfo: str) -> str | None:
    """``conninfo`` with its password masked, to show where the string itself is shown (a
    process title); None when it holds no password. A string libpq reads is written back as
    key=value pairs (a URI's percent-encoding and query string make masking it in place
    unreliable); one it cannot read is hidden whole."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "(connection string hidden)" if _password_candidates(conninfo) else None
    if _misread(conninfo):
        return "(connection string hidden)"
    if not params.get("password"):
        return None
    return make_conninfo("", **{**params, "password": "********"})


def describe_conninfo(conninfo: str) -> str:
    """host/port/database/user of a conninfo, never its password."""
    try:
        check_conninfo(conninfo)
        params = conninfo_to_dict(conninfo)
    except (ConninfoError, psycopg.ProgrammingError):
        return "(a connection string that cannot be read as written)"
    shown = [f"{k}={params[k]}" for k in ("host", "port", "dbname", "user") if params.get(k)]
    return " ".join(shown) or "(PG* environment defaults)"


def _user(conninfo: str) -> str:
    """The role a conninfo connects as, for advice (a placeholder when it is not given)."""
    try:
        user = conninfo_to_dict(conninfo).get("user")
    except psycopg.ProgrammingError:
        user = None
    return str(user) if user else "name"


def _advise(message: str, advice: str) -> str:
    """The server's message, then what to do about it."""
    return f"{message.rstrip().rstrip('.')}. {advice}"


# Connection failures no retry can fix: (words of the server's or libpq's message, advice).
_FATAL_AT_CONNECT = (
    (("permission denied to start wal sender", "must be superuser or replication role"),
     "The role needs the REPLICATION attribute (ALTER ROLE {user} REPLICATION) or "
     "superuser."),
    (("password authentication failed", "authentication failed", "no password supplied"),
     "Check the user name and the password (PGPASSWORD, ~/.pgpass, or password= in -d)."),
    (("no pg_hba.conf entry", "pg_hba.conf rejects"),
     "Add a pg_hba.conf line that lets this user connect to this database from this host, "
     "and reload the server."),
    (("does not exist",),
     "Check the database and user names in -d."),
    (("invalid connection option", "for connection option", "invalid integer value"),
     "Check the connection string given with -d."),
)

# libpq's words for a connection that could not be made (rather than one that broke).
_CANNOT_CONNECT = ("connection failed", "could not connect", "connection refused",
                   "could not translate host name", "timeout expired", "no route to host",
                   "network is unreachable", "no such file or directory")


# Why PostgreSQL invalidates a slot (pg_replication_slots.invalidation_reason, 17+), and how
# to prevent it.
_INVALIDATION_CAUSES = {
    "wal_removed": "raise max_slot_wal_keep_size, or keep the consumer running",
    "rows_removed": "on a standby, use a physical slot with hot_standby_feedback = on",
    "wal_level_insufficient": "keep wal_level = logical on the primary",
    "idle_timeout": "raise idle_replication_slot_timeout, or keep the consumer running",
}


def invalidated_advice(slot: str, reason: str | None) -> str:
    """What to do about an invalidated slot (``reason``: its invalidation_reason, if known)."""
    prevent = _INVALIDATION_CAUSES.get(reason or "wal_removed",
                                       "see pg_replication_slots.invalidation_reason")
    return (f"drop it (`pgdecode slot drop -S {slot}`), create a new one, and re-copy the "
            f"tables; the changes in between are lost. To prevent this, {prevent}.")


def explain(exc: BaseException, conninfo: str, slot: str | None = None,
            proto_version: int | None = None) -> SourceError:
    """A SourceError with advice for a server or connection error."""
    where = describe_conninfo(conninfo)
    message = _redact(str(exc).strip(), conninfo)
    sqlstate = getattr(exc, "sqlstate", None)
    lower = message.lower()
    if sqlstate == "57014":
        return SourceError(_advise(
            message, "A statement_timeout (or pg_cancel_backend) cancelled it. Reading a "
            "slot can take long: turn the timeout off for this role (ALTER ROLE "
            f"{_user(conninfo)} SET statement_timeout = 0), or put options='-c "
            "statement_timeout=0' in -d."))
    if sqlstate and sqlstate[:2] in _TRANSIENT_CLASSES and sqlstate not in _NOT_TRANSIENT:
        return ConnectionLost(f"connection to {where} lost: {message}")
    if isinstance(exc, psycopg.OperationalError | ReplicationError) and sqlstate is None:
        for words, advice in _FATAL_AT_CONNECT:
            if any(w in lower for w in words):
                advice = advice.format(user=_user(conninfo))
                return SourceError(f"cannot connect to {where}: {_advise(message, advice)}")
        if lower.startswith(_CANNOT_CONNECT):
            return ConnectionLost(f"cannot connect to {where}: {message}")
        return ConnectionLost(f"connection to {where} lost: {message}")
    if "wal_level" in lower:
        return SourceError(_advise(
            message, "Logical decoding needs wal_level = logical on the server: run "
            "ALTER SYSTEM SET wal_level = logical; and restart the server."))
    if sqlstate == "42704" and slot and "replication slot" in lower:
        return SlotUnusable(_advise(
            message, f"Create it with `pgdecode slot create -d ... -S {slot}`, or pass "
            "--create-slot."))
    if sqlstate == "42704" and "publication" in lower:
        return SourceError(_advise(
            message, "Create it on the source database (CREATE PUBLICATION name FOR ALL "
            "TABLES, or FOR TABLE ...), or pass the name of an existing one with --publication."))
    if sqlstate == "55006" or "is active for pid" in lower:
        return SourceError(_advise(
            message, "Another consumer is reading this slot: stop it, or use another slot "
            "(each consumer needs its own)."))
    if "can no longer" in lower or "invalidated" in lower:
        reason = next((r for r in _INVALIDATION_CAUSES if r in lower), None)
        return SlotUnusable(_advise(
            message, "The slot was invalidated and cannot be used again: "
            + invalidated_advice(slot or "SLOT", reason)))
    if sqlstate == "42501" or "permission denied" in lower or "must be superuser" in lower:
        return SourceError(_advise(
            message, f"The role needs the REPLICATION attribute (ALTER ROLE {_user(conninfo)} "
            "REPLICATION) or superuser, and pg_hba.conf must allow it."))
    if "proto_version" in lower or "protocol version" in lower:
        hint = f" (asked for {proto_version})" if proto_version else ""
        return SourceError(_advise(
            message + hint, "Ask for a version the server supports with --proto-version "
            "(PostgreSQL 14: 2, 15: 3, 16 and later: 4), or leave it out to negotiate."))
    return SourceError(f"{where}: {message}")
