"""What plugins see: transactions, relations, rows and changes (PostgreSQL's ReorderBufferTXN,
RelationData and ReorderBufferChange, in Python).

Column values stay as the bytes the server sent until asked for; ``Row.value`` converts with
psycopg's loader for the column's type, ``Row.text`` only decodes the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any

from psycopg import pq
from psycopg.abc import Loader
from psycopg.adapt import Transformer

from plugin_framework._frozen import frozen_setters, new_object
from plugin_framework.pgtypes import format_type
from plugin_framework.protocol import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED_TOAST,
    LSN,
    UNCHANGED_TOAST,
    RelationMessage,
    TupleData,
)

_transformer = Transformer()


@dataclass(slots=True)
class Transaction:
    """A transaction as a plugin sees it (ReorderBufferTXN).

    ``final_lsn`` is the commit (or prepare) record's LSN, ``end_lsn`` the end of that record.
    ``toptxn`` is set on the subtransactions that ``stream_abort`` reports.
    """

    xid: int
    final_lsn: LSN | None = None
    end_lsn: LSN | None = None
    commit_time: datetime | None = None
    origin: str | None = None
    origin_lsn: LSN | None = None
    gid: str | None = None
    prepare_time: datetime | None = None
    prepare_lsn: LSN | None = None  # for a transaction that went through PREPARE
    toptxn: Transaction | None = None
    first_lsn: LSN | None = None  # where the transaction's first message came from
    is_streamed: bool = False
    is_prepared: bool = False
    # a transaction of the initial snapshot's rows (read-only: inserts only; xid 0, at the
    # slot's consistent point): docs/snapshot.md
    is_snapshot: bool = False
    # in such a transaction, the table whose initial copy it begins (its first rows, or
    # none: the table is empty): before it the copy held nothing of the table, so a copy of
    # the table starts empty here (the Spark emitter's mirrors do)
    snapshot_starts: Relation | None = None
    output_plugin_private: Any = None


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a Relation, with its type's name as the server prints it."""

    name: str
    type_oid: int
    type_modifier: int
    is_key: bool
    type_name: str  # as format_type prints it, e.g. "character varying(10)"


@dataclass(frozen=True, eq=False)
class Relation:
    """A table as described by the server's last Relation message for it (the Relation, a
    pointer to RelationData, that the C callbacks receive)."""

    relation_id: int
    namespace: str  # "pg_catalog" where the server sends ""
    name: str
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]
    index: dict[str, int] = field(repr=False)

    @classmethod
    def from_message(cls, message: RelationMessage,
                     type_names: dict[int, tuple[str, str]]) -> Relation:
        columns = tuple(
            Column(c.name, c.type_oid, c.type_modifier, c.is_key,
                   format_type(c.type_oid, c.type_modifier, type_names=type_names))
            for c in message.columns
        )
        return cls(message.relation_id, message.namespace or "pg_catalog", message.name,
                   message.replica_identity, columns,
                   {c.name: i for i, c in enumerate(columns)})

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @cached_property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_key)

    def loader(self, index: int, binary: bool) -> Loader:
        """psycopg's loader for a column (cached per relation, column and format)."""
        cache: dict[tuple[int, bool], Loader] = self.__dict__.setdefault("_loaders", {})
        loader = cache.get((index, binary))
        if loader is None:
            fmt = pq.Format.BINARY if binary else pq.Format.TEXT
            loader = cache[index, binary] = _transformer.get_loader(
                self.columns[index].type_oid, fmt
            )
        return loader


class Row:
    """One tuple of a change, bound to its relation. Values convert only when read.

    ReorderBufferChange's ``newtuple`` / ``oldtuple`` (a HeapTuple since PostgreSQL 17, a
    ReorderBufferTupleBuf before).
    """

    __slots__ = ("data", "relation")

    def __init__(self, relation: Relation, data: TupleData) -> None:
        self.relation = relation
        self.data = data

    def _index(self, column: int | str) -> int:
        return column if isinstance(column, int) else self.relation.index[column]

    def kind(self, column: int | str) -> str:
        """'n' null, 'u' unchanged TOAST, 't' text, 'b' binary."""
        return chr(self.data.kinds[self._index(column)])

    def is_null(self, column: int | str) -> bool:
        return self.data.kinds[self._index(column)] == KIND_NULL

    def is_unchanged_toast(self, column: int | str) -> bool:
        return self.data.kinds[self._index(column)] == KIND_UNCHANGED_TOAST

    def raw(self, column: int | str) -> bytes | None:
        return self.data.values[self._index(column)]

    def text(self, column: int | str) -> Any:
        """The server's text for a column: str, None for null, UNCHANGED_TOAST, or bytes for
        a binary-format value."""
        i = self._index(column)
        kind = self.data.kinds[i]
        value = self.data.values[i]
        if kind == KIND_TEXT and value is not None:
            return value.decode()
        if kind == KIND_UNCHANGED_TOAST:
            return UNCHANGED_TOAST
        return value

    def value(self, column: int | str) -> Any:
        """The column as a Python value (psycopg's loader for its type)."""
        i = self._index(column)
        kind = self.data.kinds[i]
        value = self.data.values[i]
        if value is None:
            return UNCHANGED_TOAST if kind == KIND_UNCHANGED_TOAST else None
        return self.relation.loader(i, kind == KIND_BINARY).load(value)

    def texts(self) -> dict[str, Any]:
        return {c.name: self.text(i) for i, c in enumerate(self.relation.columns)}

    def values(self) -> dict[str, Any]:
        return {c.name: self.value(i) for i, c in enumerate(self.relation.columns)}

    @property
    def unchanged_toast_columns(self) -> list[str]:
        cols = self.relation.columns
        return [cols[i].name for i, k in enumerate(self.data.kinds) if k == KIND_UNCHANGED_TOAST]

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Row({self.relation.qualified_name}, {self.texts()!r})"


class Action(StrEnum):
    """A row change's kind (ReorderBufferChangeType's row values)."""

    INSERT = "INSERT"  # REORDER_BUFFER_CHANGE_INSERT
    UPDATE = "UPDATE"  # REORDER_BUFFER_CHANGE_UPDATE
    DELETE = "DELETE"  # REORDER_BUFFER_CHANGE_DELETE


@dataclass(frozen=True, slots=True)
class Change:
    """An INSERT, UPDATE or DELETE (ReorderBufferChange).

    ``old`` is the old row when the server sent one: only the replica identity columns
    (others null) when ``old_is_key``, the whole row under REPLICA IDENTITY FULL otherwise.
    """

    action: Action
    relation: Relation
    new: Row | None
    old: Row | None
    old_is_key: bool
    lsn: LSN
    xid: int | None = None  # the (sub)transaction that made it, inside stream blocks


# The reorder buffer builds a Change for every row change, by setting its slots (see _frozen.py).
(_SET_ACTION, _SET_RELATION, _SET_NEW, _SET_OLD, _SET_OLD_IS_KEY, _SET_LSN, _SET_XID) = (
    frozen_setters(Change, "action", "relation", "new", "old", "old_is_key", "lsn", "xid"))


def new_change(action: Action, relation: Relation, new: Row | None, old: Row | None,
               old_is_key: bool, lsn: LSN, xid: int | None) -> Change:
    """``Change(...)``, faster (for the reorder buffer's hot path)."""
    change: Change = new_object(Change)
    _SET_ACTION(change, action)
    _SET_RELATION(change, relation)
    _SET_NEW(change, new)
    _SET_OLD(change, old)
    _SET_OLD_IS_KEY(change, old_is_key)
    _SET_LSN(change, lsn)
    _SET_XID(change, xid)
    return change


@dataclass(frozen=True, slots=True)
class TruncateChange:
    """A TRUNCATE (ReorderBufferChange of REORDER_BUFFER_CHANGE_TRUNCATE): its options."""

    cascade: bool
    restart_identity: bool
    lsn: LSN
    xid: int | None = None
