"""wal2json 2.5, as an emitter: the JSON that the wal2json output plugin prints, from pgoutput.

Format version 1 (the default: one JSON document per transaction, optionally written in chunks
and pretty-printed) and format version 2 (one JSON object per change, "B"/"C" objects for the
transaction boundaries) with every option of wal2json 2.5, plus ``numeric-data-types-as-string``
of wal2json 2.6. The output is byte for byte what wal2json prints for the same transactions,
quirks included (docs/emitters-wal2json.md lists them, and where pgoutput cannot tell what
wal2json sees).

What pgoutput does not send is read from ``ctx.catalog`` when there is one: NOT NULL flags,
defaults, column positions, domain base types, the primary key of tables whose replica identity
is not the primary key, replication origin ids, the exact names of non-built-in types, and the
session time zone. Options that need it are rejected without a catalog.

The modules, in import order: ``options`` (the option table and ``read_options``), ``state``
(the plugin's private data and a plan per table), ``relation`` (a table's plan, made once per
Relation message, and how values print as JSON), ``v1`` and ``v2`` (the two formats), ``fast``
(the glue to format 2's C formatter, emitters/wal2json/native/_wal2jsonrow.c, made from a
table's plan), and ``emitter`` (the callbacks).
"""

from __future__ import annotations

from emitters.wal2json.emitter import HOLD_MEMORY, Wal2JsonEmitter
from emitters.wal2json.options import (
    ALL_TABLES,
    FORMAT_MIN_VERSION,
    FORMAT_VERSION,
    OPTIONS,
    SelectTable,
    read_options,
)
from emitters.wal2json.relation import escape_json

__all__ = [
    "ALL_TABLES", "FORMAT_MIN_VERSION", "FORMAT_VERSION", "HOLD_MEMORY", "OPTIONS", "SelectTable",
    "Wal2JsonEmitter", "escape_json", "read_options",
]
