"""Files that must survive a crash or a power loss: what the server is told is durable is
forgotten by it, so these are written to a temporary file, fsynced, renamed over the old
one, and the directory fsynced too (a crash leaves the old file or the new one, whole)."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

# fsync errors that mean "this kind of file cannot be fsynced", not "the data may be lost"
NO_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EROFS})


def replace_durably(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Replace ``path`` with what ``write`` writes to the file it is given."""
    tmp = path.with_name(path.name + ".tmp")
    _write_synced(tmp, write)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def create_durably(path: Path, write: Callable[[IO[bytes]], object]) -> bool:
    """Create ``path`` with what ``write`` writes, unless it exists: False then, and the
    file is left as it is. Written whole under a name of its own, then linked into place,
    so that of two processes (or threads) creating it at once the first wins and the other
    reads what it wrote."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        _write_synced(tmp, write)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_directory(path.parent)
    return True


def _write_synced(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """A new file at ``path`` holding what ``write`` writes, fsynced."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


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
