# The C module emitters/text/native/_textrow.c: the text emitter's fast path.
from typing import Any, Final

QUOTED: Final[int]
BARE: Final[int]
BOOL: Final[int]
BIT: Final[int]

class RowFormat:
    def __init__(self, relid: int, heads: tuple[bytes, bytes, bytes], styles: bytes,
                 opens: tuple[bytes, ...], bares: tuple[bytes, ...], gated: bool) -> None: ...
    def line(self, data: bytes, lsn: int, txn: Any, /) -> bytes | None: ...
    def __call__(self, data: bytes, lsn: int, txn: Any, /) -> bytes | None: ...
    def lines(self, datas: list[bytes], start: int, lsn: int | list[int], txn: Any,
              /) -> tuple[list[bytes], int]: ...
