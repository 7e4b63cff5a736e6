"""Raw pgoutput messages from a real server through its SQL functions, and the options that
start pgoutput. Reading a slot through START_REPLICATION (``replicate``, ``LiveCapture``) is
tests/support/streamkit.py's, with the other streaming helpers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from plugin_framework.protocol import LSN


@dataclass(frozen=True)
class Captured:
    lsn: LSN  # SQL interface: the row's lsn; walsender: XLogData's wal_start
    data: bytes


def pgoutput_options(proto_version: int, *, streaming: str = "off", binary: bool = False,
                     messages: bool = True, publication: str = "pub") -> dict[str, str]:
    opts = {"proto_version": str(proto_version), "publication_names": publication}
    if messages:
        opts["messages"] = "true"
    if streaming != "off":
        opts["streaming"] = streaming
    if binary:
        opts["binary"] = "true"
    return opts


def peek(conn: psycopg.Connection[Any], slot: str, options: Mapping[str, str]) -> list[Captured]:
    """Everything the slot holds, through pg_logical_slot_peek_binary_changes (no consuming)."""
    flat = [x for kv in options.items() for x in kv]
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "VARIADIC %s::text[])",
        (slot, flat),
    ).fetchall()
    return [Captured(LSN(lsn), bytes(data)) for lsn, data in rows]
