# The C module plugin_framework/spark/changes/native/_changerows.c: the Spark change builder's
# fast path.
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

class ChangeRows:
    def __init__(self, relid: int, names: tuple[str, ...], json_names: tuple[bytes, ...],
                 codes: bytes, converters: tuple[Callable[[bytes], Any], ...],
                 key_idx: tuple[int, ...], dumps: Callable[[Any], bytes],
                 empty: list[str]) -> None: ...
    def append(self, data: bytes, lsn: int, seq: int, rel: int, txn: int, insert_op: str,
               lists: tuple[list[Any], ...], /) -> int | None: ...
