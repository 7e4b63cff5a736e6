"""What every source shares, whichever way it reads a slot (the replication connection,
the SQL functions, Spark's data source): the configuration, the progress shown, the
protocol version and pgoutput options to ask for, the checks of the server before
streaming, starting the pipeline's plugins, and reconnecting after a lost connection."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from plugin_framework.framework import Pipeline
from plugin_framework.framework.outputs import Resuming, capable
from plugin_framework.pgtypes import quote_ident_always, quote_standard_literal
from plugin_framework.protocol import LSN
from plugin_framework.sources.errors import ConnectionLost, SourceError

log = logging.getLogger("pgdecode.source")

# The newest pgoutput protocol version each server major version speaks.
_PROTO_BY_MAJOR = ((16, 4), (15, 3), (14, 2), (10, 1))


def highest_proto_version(server_version: int) -> int:
    major = server_version // 10000
    for since, version in _PROTO_BY_MAJOR:
        if major >= since:
            return version
    raise SourceError(f"PostgreSQL {major} has no logical replication; 10 or later is needed")


def check_proto_version(asked: int | None, server_version: int) -> int:
    """The protocol version to use: the one asked for if the server speaks it, else the
    highest it speaks."""
    highest = highest_proto_version(server_version)
    if asked is None:
        return highest
    if not 1 <= asked <= highest:
        raise SourceError(
            f"PostgreSQL {server_version // 10000} speaks pgoutput protocol up to version "
            f"{highest}, not {asked}: use --proto-version {highest} or leave it out"
        )
    return asked


def missing_publication(conn: psycopg.Connection[Any], publications: Sequence[str]) -> str | None:
    """The first of ``publications`` that does not exist in the connected database."""
    if not publications:
        return None
    names = ", ".join(quote_standard_literal(p) for p in publications)
    found = {r[0] for r in conn.execute(
        f"SELECT pubname FROM pg_publication WHERE pubname IN ({names})").fetchall()}
    return next((p for p in publications if p not in found), None)


def missing_publication_error(name: str, dbname: str) -> SourceError:
    return SourceError(
        f'publication "{name}" does not exist in database "{dbname}": create it (CREATE '
        f"PUBLICATION {quote_ident_always(name)} FOR ALL TABLES, or FOR TABLE ...) or name an "
        "existing one with --publication"
    )


def wal_level_error(level: str) -> SourceError:
    return SourceError(
        f'wal_level is "{level}" on the server; logical decoding needs wal_level = logical: '
        "run ALTER SYSTEM SET wal_level = logical; and restart the server"
    )


@dataclass
class SourceConfig:
    """What a source connects to and how it asks the server for the stream."""

    conninfo: str
    slot: str
    publications: Sequence[str]
    proto_version: int | None = None  # None: the highest the server speaks
    streaming: str = "on"  # off, on, parallel (protocol 4)
    two_phase: bool | None = None  # None: when some plugin takes prepared transactions
    messages: bool = True
    binary: bool = False
    origin: str | None = None  # "any" or "none", PostgreSQL 16 and later
    endpos: LSN | None = None
    status_interval: float = 10.0
    reconnect: bool = True
    max_backoff: float = 30.0
    create_slot: bool = False
    slot_two_phase: bool = False
    temporary_slot: bool = False
    snapshot: str | None = None  # "initial" or "only": copy the tables with a new slot
    snapshot_workers: int = 2
    # tables to copy into the stream as it runs (snapshots/incremental.py), e.g. "public.t"
    snapshot_tables: Sequence[str] = ()
    # seconds between heartbeat messages written into the slot's database (monitor.py;
    # walsender source only; None: none)
    heartbeat: float | None = None


PROGRESS_INTERVAL = 10.0  # seconds between a snapshot's progress logs


@dataclass
class SnapshotProgress:
    """How far a snapshot is (docs/snapshot.md): the initial copy, or an incremental
    snapshot's table under way (``table``). The status line shows ``describe``; the logs
    carry ``fields`` (``--log-format json``: under "snapshot")."""

    tables: int = 0  # to copy
    rows_estimate: int = 0  # the server's statistics (pg_class.reltuples)
    tables_done: int = 0
    rows: int = 0
    bytes: int = 0  # of the rows, as pgoutput would send them
    started: float = field(default_factory=time.monotonic)
    done: bool = False
    table: str | None = None  # an incremental snapshot's table (None: the initial copy)

    def fields(self) -> dict[str, Any]:
        """The figures, as JSON logs carry them: the rates since the start, the ETA (None:
        not known) from the rows left of the estimate."""
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.rows / elapsed
        left = self.rows_estimate - self.rows
        eta = round(left / rate) if rate > 0 and left > 0 and not self.done else None
        return {"table": self.table, "tables": self.tables, "tables_done": self.tables_done,
                "rows": self.rows, "rows_estimate": max(self.rows_estimate, self.rows),
                "bytes": self.bytes, "rows_per_s": round(rate),
                "mb_per_s": round(self.bytes / elapsed / 1e6, 1),
                "elapsed_s": round(elapsed, 1), "eta_s": eta, "done": self.done}

    def describe(self) -> str:
        """e.g. "snapshot: 2/5 tables, 1,200,000 of ~3,000,000 rows, 24.1 MB/s, ETA 40 s";
        for an incremental snapshot "incremental snapshot of public.t: ..."."""
        f = self.fields()
        what = "snapshot" if self.table is None else f"incremental snapshot of {self.table}"
        text = (f"{what}: {f['tables_done']}/{f['tables']} tables, {f['rows']:,} of "
                f"~{f['rows_estimate']:,} rows, {f['mb_per_s']:.1f} MB/s")
        if f["eta_s"] is not None:
            text += f", ETA {f['eta_s']} s"
        return text

    def log(self, logger: logging.Logger, message: str | None = None) -> None:
        """Log where it is (after ``message``), with its fields."""
        text = self.describe() if message is None else f"{message}: {self.describe()}"
        logger.info("%s", text, extra={"snapshot": self.fields()})


@dataclass
class Progress:
    """What the status line and logs show."""

    received: LSN = field(default_factory=LSN)
    acked: LSN = field(default_factory=LSN)
    server_end: LSN = field(default_factory=LSN)
    server_time: float = 0.0  # time.time() of the server's last send time
    messages: int = 0
    transactions: int = 0
    changes: int = 0
    connected: bool = False
    reconnects: int = 0
    bytes: int = 0  # of the replication messages received

    @property
    def lag_bytes(self) -> int:
        """How far the acknowledged position is behind the server's WAL end."""
        return max(0, int(self.server_end) - int(self.acked))
    snapshot: SnapshotProgress | None = None  # while (and once) the initial copy runs


def only_local(pipeline: Pipeline) -> bool:
    """Whether every plugin skips all changes from a replication origin
    (ctx.filter_all_origins): then the server may filter them (pgoutput_options)."""
    return bool(pipeline.members) and all(m.ctx.filter_all_origins for m in pipeline.members)


def pgoutput_options(config: SourceConfig, proto_version: int, two_phase: bool,
                     server_version: int, *, local_only: bool = False) -> dict[str, str]:
    """The START_REPLICATION (or pg_logical_slot_*_changes) options. ``local_only``: every
    plugin filters all origins; on PostgreSQL 16 and later the server is asked to (origin
    'none', unless --origin says otherwise), which is the only way to leave out a
    non-transactional message from an origin: pgoutput does not say its origin."""
    if not config.publications:
        raise SourceError("at least one --publication is needed")
    opts = {
        "proto_version": str(proto_version),
        "publication_names": ",".join(
            '"' + p.replace('"', '""') + '"' for p in config.publications
        ),
    }
    if config.messages:
        opts["messages"] = "true"
    if config.binary:
        opts["binary"] = "true"
    if config.streaming not in ("off", "on", "parallel"):
        raise SourceError(f"--streaming must be off, on or parallel, not {config.streaming!r}")
    if config.streaming == "parallel" and proto_version < 4:
        raise SourceError("--streaming parallel needs protocol version 4 (PostgreSQL 16+)")
    if config.streaming != "off":
        if proto_version < 2:
            raise SourceError(
                f"--streaming {config.streaming} needs pgoutput protocol version 2 or later, "
                f"not {proto_version}: pass --streaming off, or a higher --proto-version"
            )
        opts["streaming"] = config.streaming if proto_version >= 4 else "true"
    if two_phase:
        if proto_version < 3:
            raise SourceError(
                f"decoding prepared transactions needs pgoutput protocol version 3 "
                f"(PostgreSQL 15+), not {proto_version}: leave --proto-version out, or use "
                "emitters without two-phase callbacks"
            )
        opts["two_phase"] = "true"
    if config.origin is not None:
        if server_version < 160000:
            raise SourceError("the origin option needs PostgreSQL 16 or later")
        opts["origin"] = config.origin
    elif local_only and server_version >= 160000:
        opts["origin"] = "none"
    return opts


def run_with_reconnect(attempt: Callable[[], None], config: SourceConfig, progress: Progress,
                       pipeline: Pipeline, stop: threading.Event) -> None:
    """Run ``attempt`` (connect and stream) until it returns. After a lost connection, reset
    the pipeline (the server sends again what was not acknowledged) and try again: after
    1 s, doubling to ``config.max_backoff``, back to 1 s once an attempt got connected.
    Unless reconnecting is off or a stop was requested; other errors go through."""
    backoff = 1.0
    while True:
        try:
            attempt()
            return
        except ConnectionLost as exc:
            if stop.is_set():
                # Asked to stop (SIGINT/SIGTERM) while connecting or streaming: what was
                # delivered is durable in the outputs; the rest is the server's to send again.
                log.info("%s; stopping as asked", exc)
                pipeline.reset()
                return
            if not config.reconnect:
                raise
            if progress.connected:
                backoff = 1.0  # that attempt got through: this is a new outage
            progress.connected = False
            progress.reconnects += 1
            log.warning("%s; reconnecting in %.0f s", exc, backoff)
            pipeline.reset()
            if stop.wait(backoff):
                return
            backoff = min(backoff * 2, config.max_backoff)


def start_pipeline(pipeline: Pipeline, proto: int, server_version: int, is_init: bool,
                   slot: str, drop_slot: Callable[[], object],
                   server_lsn: LSN | None = None) -> None:
    """Tell the pipeline what the server speaks and start its plugins. A slot this run just
    created (``is_init``) for plugins that then refuse to start is taken back with
    ``drop_slot``: it would hold WAL back for nothing, and a rerun would tell the plugins
    is_init = false for it. ``server_lsn``, how far the server's WAL is written: an output
    resumed from further than that (a damaged FILE.progress) is refused first."""
    pipeline.set_proto_version(proto)
    pipeline.set_server_version(server_version)
    try:
        if server_lsn is not None:
            for m in pipeline.members:
                if capable(m.ctx.output, Resuming):
                    m.ctx.output.check_resume(server_lsn)
        pipeline.startup(is_init=is_init)
    except BaseException:
        if is_init:
            with contextlib.suppress(psycopg.Error):
                drop_slot()
                log.info('dropped replication slot "%s" again', slot)
        raise
