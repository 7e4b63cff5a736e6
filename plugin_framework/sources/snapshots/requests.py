"""How a snapshot is asked for while a stream runs: a request message in the WAL that the
stream reads from its slot (non-transactional, prefix ``pgdecode``; the plugins never see
it), from ``pgdecode snapshot --table`` or from a consumer that needs rows read again (a
mirror after an ALTER TABLE the stream cannot carry exactly, or rows whose TOAST values it
lacks). A request names a table, and may name keys: then only those rows are read again.

Being in the WAL, a request survives the run that made it: a restart reads it again until
the slot is acknowledged past it. A run that makes a request itself takes it at once and
knows it by its id when the stream brings it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from plugin_framework.protocol import LSN
from plugin_framework.sources.snapshots.catalog import Key, key_from_text, qualified_name

PREFIX = "pgdecode"  # of the watermark and request messages

KeyText = Sequence[str | None]  # a key's values as the stream's text has them


@dataclass(frozen=True)
class Request:
    """A request for an incremental snapshot, as read from its message in the stream."""

    table: str  # schema.table
    keys: tuple[Key, ...] | None  # None: every row
    id: str | None  # the run that made it knows it by this


def request_snapshot(conn: psycopg.Connection[Any], slot: str, table: str,
                     keys: Sequence[KeyText] | None = None,
                     request_id: str | None = None) -> LSN:
    """Ask the stream reading ``slot`` for an incremental snapshot of ``table`` (of the rows
    under ``keys`` only, if given), with a message in the WAL it reads. Returns the
    message's LSN."""
    row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text",
                       (PREFIX, request_body(slot, table, keys, request_id))).fetchone()
    assert row is not None
    return LSN(row[0])


def request_body(slot: str, table: str, keys: Sequence[KeyText] | None = None,
                 request_id: str | None = None) -> str:
    """The content of a request message (``read_request`` reads it back)."""
    body: dict[str, Any] = {"request": "snapshot", "slot": slot, "table": table}
    if keys is not None:
        body["keys"] = [list(key) for key in keys]
    if request_id is not None:
        body["id"] = request_id
    return json.dumps(body)


def read_request(body: dict[str, Any], slot: str) -> Request | None:
    """The request a message's body makes of the stream reading ``slot`` (None: it is no
    request, or one for another slot). Keys that are not lists of text or nulls are not
    taken: the whole table is read instead."""
    if body.get("request") != "snapshot" or body.get("slot") != slot:
        return None
    keys = body.get("keys")
    taken: tuple[Key, ...] | None = None
    if isinstance(keys, list) and all(
            isinstance(k, list) and all(v is None or isinstance(v, str) for v in k)
            for k in keys):
        taken = tuple(key_from_text(k) for k in keys)
    request_id = body.get("id")
    return Request(qualified_name(str(body.get("table"))), taken,
                   request_id if isinstance(request_id, str) else None)
