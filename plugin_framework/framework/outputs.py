"""The outputs: ``MemoryOutput`` for tests, and ``FileOutput``, durable file I/O that
survives a crash and resumes where it was. The ``Output`` protocol, its records and the
optional capabilities are in framework/output_protocol.py (imported from here too)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
from pathlib import Path
from typing import IO, Any, NoReturn

from plugin_framework.framework.durable import NO_FSYNC, replace_durably
from plugin_framework.framework.hold import HoldStore
from plugin_framework.framework.output_protocol import (
    Batching,
    Output,
    OutputError,
    OutputRecord,
    RecordingSnapshots,
    Resuming,
    Rewinding,
    WritingMany,
    capable,
    new_record,
    write_many,
)
from plugin_framework.framework.statecheck import (
    Damage,
    Progress,
    ends_a_line,
    read_progress,
    write_progress,
)
from plugin_framework.protocol import LSN

__all__ = [
    "Batching", "FileOutput", "MemoryOutput", "Output", "OutputError", "OutputRecord",
    "RecordingSnapshots", "Resuming", "Rewinding", "WritingMany", "capable", "new_record",
    "write_many",
]


def _delivered(two_phase: bool) -> str:
    return ("at PREPARE (two-phase on)" if two_phase
            else "whole at COMMIT PREPARED (two-phase off)")


_BUFFER = 1 << 20  # FileOutput's write buffer for regular files


class MemoryOutput(Rewinding):
    """Keeps records in a list: for tests, and for plugins that deliver elsewhere."""

    def __init__(self) -> None:
        self.records: list[OutputRecord] = []
        self.durable_lsn = LSN(0)
        self._marked = LSN(0)

    def write(self, record: OutputRecord) -> None:
        self.records.append(record)

    def savepoint(self) -> int:
        return len(self.records)

    def rollback_to(self, savepoint: int) -> None:
        del self.records[savepoint:]

    def mark(self, lsn: LSN) -> None:
        self._marked = max(self._marked, lsn)

    def flush(self) -> LSN:
        self.durable_lsn = self._marked
        return self.durable_lsn

    def close(self) -> None:
        pass

    @property
    def lines(self) -> list[str]:
        return [r.data.decode() for r in self.records]


class FileOutput(Rewinding, WritingMany, Resuming, RecordingSnapshots):
    """Writes each record followed by a newline (as pg_recvlogical does) to a file or stdout.

    ``flush`` fsyncs regular files, so that what is reported durable survives a crash; a pipe
    or terminal is durable once handed to the operating system. A regular file also gets a
    progress file beside it (``FILE.progress``: the durable LSN and the file's size at that
    point, replaced atomically at each flush). Reopened after a crash, the file is cut back
    to that size, dropping the output of a transaction that was cut short, and the pipeline
    skips what the file already holds (``resume_lsn``): each transaction is in the file
    exactly once, however often the server sends it.

    A regular file is locked (``flock``) for as long as it is open: a second process given
    the same file is refused before it reads, cuts or writes anything. The file is repaired
    (cut back, or its start recorded) only when first used (``claim``, after the source has
    checked the slot, or the first write), so that a run refused before streaming leaves it
    as it was. A failed fsync stops the output for good: nothing is made durable after it.
    """

    # plain attributes, where RecordingSnapshots declares read-only properties
    snapshot_state: str | None = None
    resume_incremental: dict[str, Any] | None = None

    def __init__(self, target: str | os.PathLike[str] | IO[bytes] = "-") -> None:
        self.resume_lsn = LSN(0)
        self._path: Path | None = None  # a regular file's
        self._progress: Path | None = None
        self._slot: str | None = None  # the slot whose stream the file holds
        # xids of streamed transactions that have blocks in the file but no end yet: now, at
        # the last mark, and at the durable point this file was resumed from
        self._open_streams: list[int] = []
        self._marked_streams: list[int] = []
        self.resume_open_streams: list[int] = []
        # an incremental snapshot under way (sources/snapshots/incremental.py): as noted, as of
        # the last mark, and as of the durable point this file was resumed from
        self._incremental: dict[str, Any] | None = None
        self._marked_incremental: dict[str, Any] | None = None
        self.resume_incremental: dict[str, Any] | None = None
        # a snapshot_checkpoint, or a new snapshot_state, since the last flush
        self._checkpointed = False
        self._two_phase: bool | None = None  # prepared transactions went in at PREPARE
        # the initial snapshot (SNAPSHOT_STATES): "copying" from its start until "done"
        self.snapshot_state: str | None = None
        self._snapshot_start: int | None = None  # the file's size where this run's copy began
        self._failed: str | None = None  # why the output can no longer be made durable
        self._repair: tuple[bool, int] | None = None  # (new file, durable size) until used
        self._durable_size = 0
        self._start = 0  # the file's size when pgdecode began writing it (FILE.progress)
        self._created = False  # this run created the file (removed if never used)
        # prepared transactions held for the plugin until their outcome (hold.py)
        self.hold: HoldStore | None = None
        if isinstance(target, str | os.PathLike):
            if os.fspath(target) == "-":
                self._file: IO[bytes] = sys.stdout.buffer
                self._owned = False
            elif (path := Path(target)).exists() and not path.is_file():
                # A named pipe or a device: written as a pipe is, with no progress file
                # beside it (nothing can be cut back or resumed there).
                self._file = open(path, "ab")  # noqa: SIM115  (closed in close())
                self._owned = True
            else:
                self._path = path
                self._progress = path.with_name(path.name + ".progress")
                self.hold = HoldStore(path.with_name(path.name + ".hold"))
                fd = self._open_locked(path)
                try:
                    size = self._resume(path)
                    # A large buffer: one write(2) per ~1 MB of lines, not per 8 KB
                    self._file = open(fd, "ab", buffering=_BUFFER)  # noqa: SIM115  (closed in close())
                except BaseException:
                    os.close(fd)  # and with it the lock
                    raise
                actual = os.fstat(fd).st_size
                self._durable_size = actual if size is None else size
                if size is None:
                    self._start = actual
                self._repair = (size is None, self._durable_size)
                self._owned = True
        else:
            self._file, self._owned = target, False
        self._regular = self._is_regular()
        self.durable_lsn = self.resume_lsn
        self._marked = self.resume_lsn
        self._marked_size = self._durable_size if self._repair else self._position()
        self._write = self._first_write if self._repair else self._file.write

    def _open_locked(self, path: Path) -> int:
        """The file opened for appending and locked; refused, untouched, if another process
        has it. Created if missing, unless FILE.progress says it should be there."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            self._resume(path)  # a missing file that FILE.progress says holds output: refused
            fd = os.open(path, flags | os.O_CREAT, 0o666)
            self._created = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(os.fstat(fd))
            os.close(fd)
            who = f"process {holder}" if holder is not None else "another process"
            what = ("another output of this process is writing it" if holder == os.getpid()
                    else "another pgdecode is writing it")
            raise OutputError(
                f"{path} is in use by {who}: {what} (and its "
                f"{path.name}.progress). Nothing was read, cut or written. Stop that one "
                "first (on SIGTERM it finishes its transaction and acknowledges), or give "
                "-f another file"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _is_regular(self) -> bool:
        try:
            return stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
        except (OSError, ValueError):
            return False

    def _resume(self, path: Path) -> int | None:
        """The size to cut the file back to, from FILE.progress (checked whole first: a
        damaged one is refused before anything is cut); None for a new file."""
        assert self._progress is not None
        try:
            progress = read_progress(self._progress.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, Damage) as exc:
            raise OutputError(self._refusal(path, f"is damaged: {exc}")) from None
        actual = path.stat().st_size if path.exists() else 0
        size = progress.size
        if size > actual:
            # What FILE.progress calls durable was acknowledged to the server, which will not
            # send it again: resuming would hide that it is gone.
            raise OutputError(
                f"{path} has {actual} bytes, but {self._progress} records {size} bytes "
                "written and acknowledged to the server: output the slot will not send again "
                f"is missing from {path}. Restore the file; to start afresh instead, remove "
                "both files and re-create the slot (the missing changes are then not in it)"
            )
        if size != progress.start and not ends_a_line(path, size):
            # Cutting there would destroy whole lines the slot will not send again, and glue
            # the next line to the torn one.
            raise OutputError(self._refusal(path, (
                f"records a durable size of {size} bytes, which falls inside a line of {path} "
                "(every size pgdecode records ends just after a newline): it is damaged, or "
                "belongs to another file")))
        self.resume_lsn = progress.lsn
        self._slot, self._two_phase = progress.slot, progress.two_phase
        self.snapshot_state = progress.snapshot
        self.resume_open_streams = list(progress.open_streams)
        self.resume_incremental = progress.incremental
        self._incremental = self._marked_incremental = self.resume_incremental
        self._start = progress.start
        return size

    def _refusal(self, path: Path, problem: str) -> str:
        """A refused FILE.progress: what is wrong, and what to do."""
        return (f"{self._progress} {problem}. Nothing was cut, written or acknowledged. "
                "Restore the right progress file (or both files) from a backup; to start "
                f"afresh instead, remove {path} and {self._progress} and re-create the slot "
                "(the changes the file holds now are then not sent again)")

    def check_resume(self, server_lsn: LSN) -> None:
        """Refuse a FILE.progress whose LSN the server has not reached (``server_lsn``: how
        far its WAL is written): resuming would skip, and acknowledge, everything the slot
        sends up to that LSN. The source calls this before the pipeline starts."""
        if self._progress is None or self.resume_lsn <= server_lsn:
            return
        raise OutputError(
            f"{self._progress} records that {self._path} holds the changes up to "
            f"{self.resume_lsn}, but the server's WAL ends at {server_lsn}: the progress file "
            "is damaged or comes from another server, and resuming from it would skip (and "
            "acknowledge) every change up to there. Nothing was written or acknowledged. "
            f"Restore the right {self._progress.name}; to start afresh instead, remove "
            f"{self._path} and {self._progress} (the slot then sends everything it still has)"
        )

    def _position(self) -> int:
        try:
            return self._file.tell()
        except (OSError, ValueError):
            return 0

    def _ready(self) -> None:
        """First use: cut the file back to its durable size (the output of a transaction a
        crash cut short), or, for a new file, record where this stream's output starts (a
        crash before the first flush must not leave a torn transaction behind)."""
        if self._repair is None:
            return
        new, size = self._repair
        self._repair = None
        self._write = self._file.write
        if new:
            self._save_progress(LSN(0), size)
        elif os.fstat(self._file.fileno()).st_size > size:
            self._file.truncate(size)
        self._file.seek(size)

    def _first_write(self, data: bytes) -> int:
        self._ready()
        return self._file.write(data)

    def claim(self, slot: str, two_phase: bool | None = None) -> None:
        """Bind the file to the slot whose stream it holds, and to how its plugin takes
        prepared transactions (``two_phase``: at PREPARE, or whole at COMMIT PREPARED).

        Resuming skips the transactions the file already has by their LSNs, which only means
        something for that slot: a file written from another slot is refused rather than
        silently skipping changes. It also only means something for the same handling of
        prepared transactions: a PREPARE the earlier run held back (not written) lies before
        the resume LSN and would be skipped, and one it wrote at PREPARE cannot be written
        again whole at COMMIT PREPARED (the server then sends only the COMMIT PREPARED). A
        switch is refused; a file recorded without the setting (older pgdecode) takes it."""
        if self._progress is None:
            return
        if self._slot is not None and self._slot != slot:
            raise OutputError(
                f'{self._path} holds the changes of replication slot '
                f'"{self._slot}", not "{slot}": write this slot\'s changes to another file '
                "(pgdecode resumes a file only from the slot that wrote it)"
            )
        if (two_phase is not None and self._two_phase is not None
                and two_phase != self._two_phase and self.resume_lsn):
            raise OutputError(
                f"{self._path} was written with prepared transactions delivered "
                f"{_delivered(self._two_phase)}, and this run would deliver them "
                f"{_delivered(two_phase)}: transactions prepared before the switch would be "
                "lost or never completed. Nothing was written. Run with the earlier setting "
                "for this file; to switch, stream a new slot to a new file with the new "
                f'setting, and retire "{slot}" once the new file has caught up'
            )
        self._ready()
        record = self._slot is None or (two_phase is not None and self._two_phase is None)
        self._slot = slot
        if two_phase is not None:
            self._two_phase = two_phase
        if record:
            self._save_progress(self.durable_lsn, self._marked_size)

    def begin_snapshot(self) -> None:
        """An initial snapshot starts here: recorded durably now, so that a run that dies
        during the copy leaves a file that is cut back to this point and copied again."""
        if self._progress is None:
            return
        self._ready()
        start = self._snapshot_start
        if self.snapshot_state == "copying" and start is not None:
            # A copy this process began, cut short: taken back whole, and what was recorded
            # of it with it (a record past the file's end, or of its keys, would mislead the
            # next run)
            self.rollback_to(start)
            self._durable_size = min(self._durable_size, start)
            self._marked_size = min(self._marked_size, start)
            self._incremental = self._marked_incremental = None
        self._snapshot_start = self._position()
        self.snapshot_state = "copying"
        self._save_progress(self.durable_lsn, self._durable_size)

    def continue_snapshot(self) -> None:
        """The copy, cut short, goes on as an incremental snapshot (recorded at the next
        flush, with that snapshot's progress)."""
        if self.snapshot_state is not None:
            self.snapshot_state = "incremental"
            self._checkpointed = True  # (a new state to record, even with nothing marked)

    def end_snapshot(self) -> None:
        """The copy is complete (recorded at the next flush, with the mark that follows)."""
        if self.snapshot_state is not None:
            self.snapshot_state = "done"
            self._checkpointed = True

    def write(self, record: OutputRecord) -> None:
        self._write(record.data + b"\n")  # one call: cheaper than two for a line's bytes

    def write_many(self, lsn: LSN | list[LSN], xid: int | None, datas: list[bytes]) -> None:
        if datas:
            self._write(b"\n".join(datas))
            self._write(b"\n")

    def savepoint(self) -> int | None:
        """The file's size now (None for a pipe or terminal, which cannot take back lines)."""
        if self._progress is None:
            return None
        self._ready()
        return self._position()

    def rollback_to(self, savepoint: int | None) -> None:
        """Cut the file back to ``savepoint``: the lines of a transaction that the server
        will send again from its start."""
        if savepoint is None:
            return
        self._file.flush()
        self._file.truncate(savepoint)
        self._file.seek(savepoint)

    def note_open_streams(self, xids: list[int]) -> None:
        """The streamed transactions whose blocks this file has, still without an end (the
        pipeline says so before each mark). A restart resumes with them in
        ``resume_open_streams``: the server streams them again from their start, so the
        plugin is told to abort each first, as after a lost connection."""
        self._open_streams = xids

    def note_incremental(self, state: dict[str, Any] | None) -> None:
        """How far the incremental snapshot is whose chunks this file has up to now (the
        source says so before each chunk's mark; None: none under way). A restart resumes
        it from there (``resume_incremental``): each row once in the file."""
        self._incremental = state

    def snapshot_checkpoint(self) -> None:
        """A mark at the same LSN: the initial copy's rows written so far, and how far the
        copy is (``note_incremental``), are made durable at the next flush, so that a run
        killed during the copy goes on from there (docs/snapshot.md)."""
        if self._progress is not None:
            self._record_mark()
            self._checkpointed = True

    def mark(self, lsn: LSN) -> None:
        if lsn > self._marked:
            self._marked = lsn
            if self._progress is not None:
                self._record_mark()

    def _record_mark(self) -> None:
        """What the next flush records durable: the file's size now, and the state noted
        with it (open streams, an incremental snapshot's progress)."""
        self._ready()
        self._marked_size = self._file.tell()
        self._marked_streams = self._open_streams
        self._marked_incremental = self._incremental

    def flush(self) -> LSN:
        if self._failed is not None:
            raise OutputError(self._failed)
        if self._repair is not None:
            return self.durable_lsn  # never used: nothing to make durable
        self._file.flush()
        try:
            fd: int | None = self._file.fileno()
        except (OSError, ValueError):
            fd = None  # an in-memory stream: nothing to fsync
        failed: str | None = None
        if fd is not None:
            try:
                os.fsync(fd)
            except OSError as exc:
                # A pipe, terminal or character device cannot be fsynced (EINVAL): what it
                # was handed is as durable as it gets. Anything else, and any error on a
                # regular file, means the data may not be on disk; the kernel may report that
                # only once, so it is never tried again as if it had worked.
                if self._regular or exc.errno not in NO_FSYNC:
                    failed = exc.strerror or str(exc)
        if failed is not None:
            self._fail(failed)
        if self._progress is not None and (self._marked > self.durable_lsn
                                           or self._checkpointed):
            self._check_size()
            try:
                self._save_progress(self._marked, self._marked_size)
            except OSError as exc:
                failed = exc.strerror or str(exc)
            if failed is not None:
                self._fail(failed, what=f"{self._progress} (where its progress is recorded)")
            self._durable_size = self._marked_size
            self._checkpointed = False
        self.durable_lsn = self._marked
        if self.hold is not None:
            self.hold.release(self.durable_lsn)
        return self.durable_lsn

    def _fail(self, reason: str, what: str | None = None) -> NoReturn:
        """Stop for good after an fsync (or progress file) failure: this flush and every
        later one raise, nothing more is recorded durable or acknowledged. (Raised outside
        the OSError's handler: the error is this one, not a write that could be retried.)"""
        name = what or (str(self._path) if self._path is not None else "the output")
        again = (f"run the same command again: it cuts {self._path} back to what was durable "
                 f"({self._durable_size} bytes) and goes on from there"
                 if self._path is not None else "run the command again")
        self._failed = (
            f"could not make {name} durable: fsync failed ({reason}). The output since "
            f"{self.durable_lsn} may not be on disk, so it was not acknowledged: the server "
            f"sends it again. Check the disk and the kernel log, then {again}")
        raise OutputError(self._failed)

    def _check_size(self) -> None:
        """The file must hold what is about to be recorded durable: another process that
        cut or replaced it (it ignores the lock) would otherwise have progress claim bytes
        the file does not have, disabling the repair of a torn tail."""
        assert self._path is not None
        fd_stat = os.fstat(self._file.fileno())
        try:
            path_stat: os.stat_result | None = self._path.stat()
        except FileNotFoundError:
            path_stat = None
        if path_stat is None or path_stat.st_ino != fd_stat.st_ino \
                or path_stat.st_dev != fd_stat.st_dev:
            problem = "was removed or replaced"
        elif fd_stat.st_size < self._marked_size:
            problem = (f"has {fd_stat.st_size} bytes, fewer than the {self._marked_size} "
                       "written to it")
        else:
            return
        self._failed = (
            f"{self._path} {problem} while pgdecode was writing it: something else changed "
            f"the file. Nothing was acknowledged past {self.durable_lsn}. Restore the file "
            f"(or remove it and {self._progress} to start afresh), then run the command again"
        )
        raise OutputError(self._failed)

    def _save_progress(self, lsn: LSN, size: int) -> None:
        """Replace the progress file atomically and durably (the directory too: the server
        forgets what it is told is durable, so this must survive a power loss)."""
        assert self._progress is not None
        data = write_progress(Progress(
            lsn, size, self._start, self._slot, self._two_phase, tuple(self._marked_streams),
            self._marked_incremental, self.snapshot_state))
        replace_durably(self._progress, lambda f: f.write(data))

    def close(self) -> None:
        """Make what was marked durable and close. Lines written after the last mark (a
        transaction a callback error or a lost connection cut short) are cut off first: the
        file ends at a transaction boundary, as a restart would cut it."""
        try:
            if self._failed is None and self._repair is None:
                if self._progress is not None and self._position() > self._marked_size:
                    self.rollback_to(self._marked_size)
                self.flush()
            elif self._failed is not None and self._progress is not None:
                with contextlib.suppress(OSError, ValueError):
                    self.rollback_to(self._durable_size)
        finally:
            if self._created and self._repair is not None and self._path is not None:
                # Refused before it was used: no empty file left behind (it is still locked).
                with contextlib.suppress(OSError):
                    if os.fstat(self._file.fileno()).st_size == 0:
                        self._path.unlink()
            if self._owned:
                if self._failed is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self._file.close()
                else:
                    self._file.close()



def _lock_holder(st: os.stat_result) -> int | None:
    """The PID holding a flock on the file ``st`` describes (from /proc/locks; None if it
    cannot be told)."""
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if "->" not in fields and len(fields) >= 6 and fields[1] == "FLOCK" \
                        and fields[5] == wanted:
                    return int(fields[4])
    except (OSError, ValueError):
        return None
    return None
