"""The wal2json emitter's private data (wal2json's JsonDecodingData): the options' values, a
plan per table (Rel, made by relation.compile_relation) and what is kept across callbacks;
the commit time and origin id of a transaction."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from emitters.wal2json.options import ACTIONS, SelectTable
from plugin_framework import LSN
from plugin_framework.framework import Relation, Spool, Transaction
from plugin_framework.pgtypes import timestamptz_to_str

log = logging.getLogger("pgdecode.wal2json")

Converter = Callable[[bytes], bytes]
"""How a column's value prints: the server's text of it in, JSON out."""


# --- per relation: everything that does not depend on the row ---------------------------------


@dataclass(eq=False, slots=True)
class Col:
    """A column's plan: its name, type and surroundings as each format version prints them."""

    name: bytes  # JSON
    convert: Converter  # how its value prints
    v1_type: bytes  # JSON of the type as v1 prints it (keytypes/columntypes)
    v1_pk_type: bytes  # JSON of the type as v1's pk object prints it
    v1_oid: bytes  # the type OID v1 prints
    v2_change: tuple[bytes, bytes]  # v2: text before and after the value, in "columns"
    v2_identity: bytes  # v2: text before the value, in "identity"
    v2_pk: bytes  # v2: the whole object, in "pk"
    v1_position: bytes
    v1_optional: bytes
    v1_default: bytes


@dataclass(eq=False, slots=True)
class Rel:
    """A table's plan, for the Relation message it was made from."""

    relation: Relation
    selected: bool  # passes add-tables and filter-tables
    cols: list[Col]
    key: list[int]  # replica identity columns (pgoutput's key flag)
    has_identity: bool  # wal2json's "rd_replidindex is valid or REPLICA IDENTITY FULL"
    v1_pk: bool  # v1 prints "pk": a primary key that is the replica identity
    pk: list[int] | None  # v2: primary key columns, None when the table has none
    schema_table: bytes  # v2: ,"schema":...,"table":...
    v1_heads: dict[str, bytes] = field(default_factory=dict)  # per action: "kind" to "table"
    v1_columns_head: bytes = b""  # v1: names, types... up to "columnvalues":[
    v1_pk_blocks: tuple[bytes, bytes] = (b"", b"")  # without and with a trailing comma
    converters: list[Converter | None] = field(default_factory=list)  # None: a string
    v2_columns: list[bytes] = field(default_factory=list)  # v2: what goes between the values
    # the C formatter (emitters.wal2json.fast) and, in v2, the transaction fields it prints
    fast: tuple[bytes, Any] | None = None


class State:
    """The plugin's private data (wal2json's JsonDecodingData)."""

    def __init__(self, values: dict[str, Any], catalog: Any) -> None:
        self.version: int = values["format-version"]
        self.include_transaction: bool = values["include-transaction"]
        self.include_xids: bool = values["include-xids"]
        self.include_timestamp: bool = values["include-timestamp"]
        self.include_origin: bool = values["include-origin"]
        self.include_schemas: bool = values["include-schemas"]
        self.include_types: bool = values["include-types"]
        self.include_type_oids: bool = values["include-type-oids"]
        self.include_typmod: bool = values["include-typmod"]
        self.include_domain_data_type: bool = values["include-domain-data-type"]
        self.include_column_positions: bool = values["include-column-positions"]
        self.include_not_null: bool = values["include-not-null"]
        self.include_default: bool = values["include-default"]
        self.include_pk: bool = values["include-pk"]
        self.include_lsn: bool = values["include-lsn"]
        self.pretty: bool = values["pretty-print"]
        self.chunks: bool = values["write-in-chunks"]
        self.numeric_as_string: bool = values["numeric-data-types-as-string"]
        actions = values["actions"]
        selected = set(ACTIONS) if actions is None else set(actions)
        self.do_insert = "insert" in selected
        self.do_update = "update" in selected
        self.do_delete = "delete" in selected
        self.do_truncate = "truncate" in selected
        self.filter_origins: list[int] = values["filter-origins"]
        self.filter_tables: list[SelectTable] = values["filter-tables"]
        self.add_tables: list[SelectTable] = values["add-tables"]
        self.filter_msg_prefixes: list[str] = values["filter-msg-prefixes"]
        self.add_msg_prefixes: list[str] = values["add-msg-prefixes"]
        self.catalog = catalog
        if self.pretty:
            self.ht, self.nl, self.sp = b"\t", b"\n", b" "
        else:
            self.ht = self.nl = self.sp = b""
        self.comma = b"," + self.sp
        self.zone: tzinfo = UTC
        if self.include_timestamp and catalog is not None:
            self.zone = session_zone(catalog)

        self.nr_changes = 0  # wal2json's counter: changes and messages of the transaction
        self.rels: dict[int, Rel] = {}
        self.generation = 0
        self.warned: set[tuple[int, str]] = set()  # (table, option) warned of (relation.py)
        self.txn_fields = b""  # v2: ,"xid":..,"timestamp":..,"origin":.. of the transaction
        self.v1_parts: list[bytes] = []  # v1 without chunks: the document being built
        self.held: Spool | None = None  # output awaiting the commit (include-lsn)
        self.held_begin: tuple[LSN, int | None] | None = None
        self.origin_ids: dict[str, int] = {}
        self.origin_reads = 0


def session_zone(catalog: Any) -> tzinfo:
    name = str(catalog.query("SELECT current_setting('TimeZone')")[0][0])
    try:
        return ZoneInfo(name)
    except (ValueError, OSError):
        log.warning('wal2json: time zone "%s" is not an IANA zone name; printing commit '
                    "times in UTC", name)
        return UTC


def txn_timestamp(st: State, txn: Transaction) -> bytes:
    if txn.commit_time is None:
        raise ValueError(f"include-timestamp: transaction {txn.xid} has no commit time")
    return timestamptz_to_str(txn.commit_time, st.zone).encode()


def origin_id(st: State, origin: str, option: str) -> int:
    ident = st.origin_ids.get(origin)
    if ident is None:
        if st.catalog is None:
            raise ValueError(
                f'{option}: a transaction comes from replication origin "{origin}"; pgoutput '
                "sends origin names and wal2json prints origin ids: run with a database "
                "connection for catalog lookups"
            )
        # every origin at once, read again (a new query text) when one is not known yet
        st.origin_reads += 1
        rows = st.catalog.query("SELECT roname, roident FROM pg_replication_origin "
                                f"/* read {st.origin_reads} */")
        st.origin_ids.update((str(name), int(ident)) for name, ident in rows)
        found = st.origin_ids.get(origin)
        if found is None:
            raise ValueError(f'{option}: replication origin "{origin}" does not exist (any '
                             "more), its id is unknown")
        ident = found
    return ident


def txn_origin_id(st: State, txn: Transaction) -> int:
    return 0 if not txn.origin else origin_id(st, txn.origin, "include-origin")
