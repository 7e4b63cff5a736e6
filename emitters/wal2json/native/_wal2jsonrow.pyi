# The C module emitters/wal2json/native/_wal2jsonrow.c: the wal2json emitter's fast path
# (format versions 1, 2).
from typing import Any, Final

STRING: Final[int]
NUMBER: Final[int]
NUMBER_STRING: Final[int]
BOOL: Final[int]
BYTEA: Final[int]

class RowFormat:
    def __init__(self, relid: int, heads: tuple[bytes, bytes, bytes], schema_table: bytes,
                 befores: tuple[bytes, ...], afters: tuple[bytes, ...], pks: tuple[bytes, ...],
                 codes: bytes, key: tuple[int, ...], pk: tuple[int, ...], actions: int,
                 with_lsn: bool, with_pk: bool, has_identity: bool) -> None: ...
    def line(self, data: bytes, lsn: int, txn: Any, /) -> bytes | None: ...
    def __call__(self, data: bytes, lsn: int, txn: Any, /) -> bytes | None: ...
    def lines(self, datas: list[bytes], start: int, lsn: int | list[int], txn: Any,
              /) -> tuple[list[bytes], int]: ...

class V1RowFormat:
    def __init__(self, relid: int, heads: tuple[bytes, bytes, bytes], pieces: tuple[bytes, ...],
                 names: tuple[bytes, ...], types: tuple[bytes, ...], oids: tuple[bytes, ...],
                 codes: bytes, key: tuple[int, ...], actions: int,
                 has_identity: bool) -> None: ...
    def line(self, data: bytes, lsn: int, txn: Any, /) -> bytes | None: ...
    def lines(self, datas: list[bytes], start: int, lsn: int | list[int], txn: Any,
              /) -> tuple[list[bytes], int]: ...
