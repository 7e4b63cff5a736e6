"""Files that must survive a crash or a power loss: what the server is told is durable is
forgotten by it, so these are written to a temporary file, fsynced, renamed over the old
one, and the directory fsynced too (a crash leaves the old file or the new one, whole)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

# fsync errors that mean "this kind of file cannot be fsynced", not "the data may be lost"
NO_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EROFS})


def replace_durably(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Replace ``path`` with what ``write`` writes to the file it is given."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where its file system can."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a directory that cannot be opened cannot be fsynced either
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in NO_FSYNC:  # some file systems do not fsync directories
            raise
    finally:
        os.close(fd)
