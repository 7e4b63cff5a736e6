# The C module plugin_framework/protocol/native/_runs.c: runs of row changes in a batch of
# XLogData messages (the reference: protocol/runs.py's row_change_run_py).

from collections.abc import Callable, Sequence

from plugin_framework.protocol.lsn import LSN

def row_change_run(batch: Sequence[bytes | bytearray | memoryview], start: int,
                   make_lsn: Callable[[int], LSN], /) -> tuple[list[bytes], list[LSN], int]: ...
