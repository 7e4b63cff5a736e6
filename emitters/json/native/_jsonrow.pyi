# The C module emitters/json/native/_jsonrow.c: the json emitter's fast path.
from collections.abc import Callable
from typing import Any, Final

PYCALL: Final[int]
VERBATIM: Final[int]
STRING: Final[int]
FLOAT: Final[int]
BOOL: Final[int]
JSON: Final[int]
TIMESTAMP: Final[int]
TIMESTAMPTZ: Final[int]
ARRAY_TEXT: Final[int]
ARRAY_INT: Final[int]
ARRAY_BOOL: Final[int]

class RowFormat:
    def __init__(self, relid: int, heads: tuple[bytes, ...], names: tuple[bytes, ...],
                 codes: bytes, converters: tuple[Callable[[bytes], Any], ...],
                 key_idx: tuple[int, ...], dumps: Callable[[Any], bytes]) -> None: ...
    def line(self, data: bytes, lsn: int, txn: Any, /) -> bytes | None: ...
    def __call__(self, data: bytes, lsn: int, txn: Any, /) -> bytes | None: ...
    def lines(self, datas: list[bytes], start: int, lsn: int | list[int], txn: Any,
              /) -> tuple[list[bytes], int]: ...
