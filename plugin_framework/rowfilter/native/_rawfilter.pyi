# The C module plugin_framework/rowfilter/native/_rawfilter.c: row filters on raw row changes.
from typing import Final

DROP: Final[int]
PASS: Final[int]
UNSURE: Final[int]

class RawFilter:
    def __init__(self, relid: int, ncols: int, actions: int,
                 programs: tuple[tuple[tuple[tuple[int, int, int, int, bytes], ...], ...] | None,
                                 ...]) -> None: ...
    def verdict(self, data: bytes, /) -> int: ...
