# The C module plugin_framework/framework/native/_spool.c: a spool's entries packed and read
# back a run at a time (the references: framework/spool.py's pack_entries_py, read_run_py).

from collections.abc import Callable, Sequence

from plugin_framework.protocol.lsn import LSN

def pack_entries(lsns: Sequence[LSN], xid: int, in_stream: bool, raws: Sequence[bytes],
                 /) -> bytes: ...
def read_run(buf: bytes | bytearray | memoryview, pos: int, end: int, strip: bool,
             make_lsn: Callable[[int], LSN],
             /) -> tuple[list[bytes], list[LSN], int, bool, bool, int]: ...
