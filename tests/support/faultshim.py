"""An fsync that fails on demand, for real, in a pgdecode process: an LD_PRELOAD shim
compiled here (gcc), as a failing disk or a full one makes fsync fail. The process is given
``LD_PRELOAD`` (the shim), ``FAIL_FSYNC_PATH`` (the file whose fsync fails, or a directory
ending in "/": any file below it), ``FAIL_FSYNC_TRIGGER`` (a file that arms it: the next such
fsync fails, once, and removes it) and, optionally, ``FAIL_FSYNC_ERRNO`` (default EIO)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fsync of the file FAIL_FSYNC_PATH (or of any file below it, if it ends with "/") fails
   once, when FAIL_FSYNC_TRIGGER exists (then removed), with FAIL_FSYNC_ERRNO (default EIO):
   as Linux reports a writeback error to fsync once, and the next fsync succeeds although
   the data never reached the disk. */
int fsync(int fd) {
    static int (*real_fsync)(int);
    const char *target = getenv("FAIL_FSYNC_PATH"), *trigger = getenv("FAIL_FSYNC_TRIGGER");
    const char *code = getenv("FAIL_FSYNC_ERRNO");
    if (target && trigger && access(trigger, F_OK) == 0) {
        char link[64], path[4096];
        size_t len = strlen(target);
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        if (n > 0) {
            path[n] = 0;
            int under = len > 0 && target[len - 1] == '/' && strncmp(path, target, len) == 0;
            if (under || strcmp(path, target) == 0) {
                unlink(trigger);
                errno = code ? atoi(code) : EIO;
                return -1;
            }
        }
    }
    if (!real_fsync)
        real_fsync = (int (*)(int)) dlsym(RTLD_NEXT, "fsync");
    return real_fsync(fd);
}
"""


def build_fsync_shim(directory: Path) -> Path:
    """The shim, compiled into ``directory`` (skips the test without gcc)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the fsync shim")
    (directory / "shim.c").write_text(SHIM)
    library = directory / "failfsync.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(library),
                    str(directory / "shim.c"), "-ldl"], check=True)
    return library
