"""Typed, immutable forms of every logical replication protocol message (versions 1 to 4).

Field names follow PostgreSQL's ``LogicalRep*Data`` structs. ``xid`` on the messages that
can appear inside a stream block is set only there (outside, the wire format has no xid).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, TypeAlias

from plugin_framework.protocol.lsn import LSN
from plugin_framework.protocol.tags import TupleKind

# Column kinds in TupleData, as their byte values (plain ints: the hot paths compare with ==).
KIND_NULL: Final = int(TupleKind.NULL)  # 'n'
KIND_UNCHANGED_TOAST: Final = int(TupleKind.UNCHANGED_TOAST)  # 'u'
KIND_TEXT: Final = int(TupleKind.TEXT)  # 't'
KIND_BINARY: Final = int(TupleKind.BINARY)  # 'b'

# Replica identity settings (pg_class.relreplident).
REPLICA_IDENTITY_DEFAULT: Final = "d"
REPLICA_IDENTITY_NOTHING: Final = "n"
REPLICA_IDENTITY_FULL: Final = "f"
REPLICA_IDENTITY_INDEX: Final = "i"

ReplicaIdentity: TypeAlias = Literal["d", "n", "f", "i"]


class _UnchangedToast:
    """The value of a TOASTed column that the change did not touch: the server did not send it."""

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

# The decoder builds TupleData, Insert, Update and Delete without calling their __init__ (it
# sets their slots directly, for speed): give them no __post_init__.


@dataclass(frozen=True, slots=True)
class TupleData:
    """A row as sent by the server: a kind per column and the raw bytes of valued columns.

    ``kinds`` holds one of ``b"n"`` (null), ``b"u"`` (unchanged TOAST), ``b"t"`` (text),
    ``b"b"`` (binary) per column; ``values`` holds the raw bytes of text and binary columns
    and None for the others. Nothing is decoded until asked for.
    """

    kinds: bytes
    values: tuple[bytes | None, ...]

    def __len__(self) -> int:
        return len(self.kinds)

    def decoded(self) -> list[str | bytes | _UnchangedToast | None]:
        """Every column: str for text, bytes for binary, None for null, UNCHANGED_TOAST."""
        kinds, values = self.kinds, self.values
        if len(kinds) == len(values):  # (else the general case raises ValueError)
            # The usual rows, faster and with the general case's results: text columns only;
            # text and null columns.
            if not kinds.strip(b"t"):
                return [None if v is None else v.decode() for v in values]
            if not kinds.strip(b"tn"):
                return [v if k == KIND_NULL or v is None else v.decode()
                        for k, v in zip(kinds, values, strict=True)]
        return [
            v.decode() if k == KIND_TEXT and v is not None
            else UNCHANGED_TOAST if k == KIND_UNCHANGED_TOAST else v
            for k, v in zip(self.kinds, self.values, strict=True)
        ]

    def text(self, index: int) -> str | None:
        """The text of a text column, None for null; ValueError for other kinds."""
        kind = self.kinds[index]
        if kind == KIND_TEXT:
            value = self.values[index]
            assert value is not None
            return value.decode()
        if kind == KIND_NULL:
            return None
        raise ValueError(f"column {index} is {chr(kind)!r}, not text or null")


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a Relation message: ``is_key`` when it is part of the replica identity."""

    is_key: bool
    name: str
    type_oid: int
    type_modifier: int


# --- transaction control -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    """The start of a committed transaction ('B'); ``final_lsn`` is its commit record's LSN."""

    final_lsn: LSN
    commit_time: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """The end of the transaction the last Begin started ('C')."""

    commit_lsn: LSN
    end_lsn: LSN
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    """The replication origin the current transaction came from ('O'), after its Begin."""

    origin_lsn: LSN
    name: str


# --- catalog ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelationMessage:
    """A table's description: the Relation message ('R'), which carries what PostgreSQL calls
    a ``LogicalRepRelation``. ``namespace`` is "" for pg_catalog, as the server sends it.
    (The relation a plugin is given is ``plugin_framework.framework.Relation``, made from it.)"""

    relation_id: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Type:
    """A non-built-in data type used by a following Relation message. "" namespace means
    pg_catalog."""

    type_oid: int
    namespace: str
    name: str
    xid: int | None = None


# --- changes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Insert:
    """An INSERT ('I'): the new row."""

    relation_id: int
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """An UPDATE. ``key`` (replica identity columns, 'K') or ``old`` (the whole old row under
    REPLICA IDENTITY FULL, 'O') is set when the server sent the old values; never both."""

    relation_id: int
    new: TupleData
    key: TupleData | None = None
    old: TupleData | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """A DELETE, with exactly one of ``key`` ('K') or ``old`` ('O')."""

    relation_id: int
    key: TupleData | None = None
    old: TupleData | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    """A TRUNCATE of one or more tables in one statement ('T')."""

    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A message written by pg_logical_emit_message()."""

    transactional: bool
    lsn: LSN
    prefix: str
    content: bytes
    xid: int | None = None


# --- streaming of in-progress transactions (protocol 2+) --------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    """The start of a block of an in-progress transaction's changes ('S')."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The end of the current stream block ('E')."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """The commit of a streamed transaction ('c'): its changes were all sent in blocks."""

    xid: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Abort of a streamed transaction (``subxid == xid``) or of one of its subtransactions.

    ``abort_lsn`` and ``abort_time`` are sent only by protocol 4 with parallel streaming.
    """

    xid: int
    subxid: int
    abort_lsn: LSN | None = None
    abort_time: datetime | None = None


# --- two-phase commit (protocol 3+, and through the SQL interface with any version) ----------


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """The start of a transaction prepared for two-phase commit ('b')."""

    prepare_lsn: LSN
    end_lsn: LSN
    prepare_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    """The end of a prepared transaction's changes: PREPARE TRANSACTION ``gid`` ('P')."""

    prepare_lsn: LSN
    end_lsn: LSN
    prepare_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """COMMIT PREPARED of transaction ``gid`` ('K')."""

    commit_lsn: LSN
    end_lsn: LSN
    commit_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """ROLLBACK PREPARED of transaction ``gid`` ('r')."""

    prepare_end_lsn: LSN
    rollback_end_lsn: LSN
    prepare_time: datetime
    rollback_time: datetime
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    """PREPARE TRANSACTION of a streamed transaction ('p'), after its last block."""

    prepare_lsn: LSN
    end_lsn: LSN
    prepare_time: datetime
    xid: int
    gid: str


Message: TypeAlias = (
    Begin | Commit | Origin | RelationMessage | Type | Insert | Update | Delete | Truncate
    | LogicalMessage | StreamStart | StreamStop | StreamCommit | StreamAbort | BeginPrepare
    | Prepare | CommitPrepared | RollbackPrepared | StreamPrepare
)

# Messages that carry an xid when, and only when, they are inside a stream block.
STREAMABLE = (RelationMessage, Type, Insert, Update, Delete, Truncate, LogicalMessage)
