"""The SQL-interface source: for places where a replication connection is not allowed.

It peeks a batch with ``pg_logical_slot_peek_binary_changes``, feeds it to the pipeline,
flushes the outputs, and only then advances the slot (``pg_replication_slot_advance``) to
what is durable. The next peek starts from the slot again, so what was not acknowledged (an
unfinished streamed transaction, a prepared one a plugin still waits for) is read again; the
pipeline skips what its outputs already have.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from plugin_framework.framework import Pipeline
from plugin_framework.protocol import LSN
from plugin_framework.sources.errors import SourceError, explain
from plugin_framework.sources.monitor import SlotMonitor
from plugin_framework.sources.session import (
    Progress,
    SourceConfig,
    check_proto_version,
    missing_publication,
    missing_publication_error,
    only_local,
    pgoutput_options,
    run_with_reconnect,
    start_pipeline,
    wal_level_error,
)
from plugin_framework.sources.slots import create_slot, drop_slot, sql_query, usable_slot

log = logging.getLogger("pgdecode.source")


class SqlSource:
    def __init__(self, config: SourceConfig, pipeline: Pipeline, *, batch_changes: int = 10000,
                 poll_interval: float = 1.0,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        self.config = config
        self.pipeline = pipeline
        self.batch_changes = batch_changes
        self.poll_interval = poll_interval
        self.on_progress = on_progress
        self.progress = Progress()
        self._stop = threading.Event()
        self._started = False
        if config.heartbeat is not None:
            raise ValueError("heartbeats need the walsender source: the SQL functions' "
                             "changes would carry them to the plugins")
        self.monitor = SlotMonitor(config.conninfo, config.slot)

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        cfg = self.config

        def attempt() -> None:
            try:
                with psycopg.connect(cfg.conninfo, autocommit=True) as conn:
                    self.progress.connected = True
                    self._run(conn)
            except psycopg.Error as exc:
                raise explain(exc, cfg.conninfo, cfg.slot, cfg.proto_version) from None

        run_with_reconnect(attempt, cfg, self.progress, self.pipeline, self._stop)

    def _run(self, conn: psycopg.Connection[Any]) -> None:
        cfg = self.config
        level = conn.execute("SHOW wal_level").fetchone()
        if level is None or level[0] != "logical":
            raise wal_level_error(level[0] if level else "?")
        missing = missing_publication(conn, cfg.publications)
        if missing is not None:
            raise missing_publication_error(missing, conn.info.dbname)
        if cfg.temporary_slot and self._started:
            raise SourceError(
                f'the connection was lost, and the temporary slot "{cfg.slot}" with it: the '
                "changes since the last acknowledgement cannot be read again. Use a "
                "persistent slot to survive reconnects"
            )
        is_init = False
        if cfg.create_slot:
            _, is_init = create_slot(conn, cfg.slot, two_phase=cfg.slot_two_phase,
                                     temporary=cfg.temporary_slot, if_not_exists=True)
        slot = usable_slot(sql_query(conn), cfg.slot, dbname=conn.info.dbname,
                           server_version=conn.info.server_version,
                           temporary=cfg.temporary_slot,  # (held by this session)
                           two_phase=cfg.slot_two_phase and not is_init and not self._started)
        if slot.confirmed_flush_lsn is not None:
            # Never advance to less than the slot has: the server refuses to move it back.
            self.progress.acked = max(self.progress.acked, slot.confirmed_flush_lsn)
        server_version = conn.info.server_version
        proto = check_proto_version(cfg.proto_version, server_version)
        if not self._started:
            wal_end = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
            start_pipeline(self.pipeline, proto, server_version, is_init, cfg.slot,
                           lambda: drop_slot(conn, cfg.slot, if_exists=True),
                           server_lsn=LSN(wal_end[0]) if wal_end else None)
            self._started = True
        # Through the SQL interface, two_phase is the slot's property, not an option.
        options = pgoutput_options(cfg, proto, two_phase=False, server_version=server_version,
                                   local_only=only_local(self.pipeline))
        if cfg.streaming == "parallel":
            options["streaming"] = "on"  # the SQL interface has no parallel apply to feed
        flat = [x for kv in options.items() for x in kv]
        log.info('reading slot "%s" from %s through SQL: pgoutput protocol %d, publications %s',
                 cfg.slot, self.progress.acked, proto, ", ".join(cfg.publications))
        batch = self.batch_changes
        while not self._stop.is_set():
            flush_before = LSN(str(conn.execute("SELECT pg_current_wal_flush_lsn()")
                                   .fetchone()[0]))  # type: ignore[index]
            rows = conn.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
                "%s, NULL, %s, VARIADIC %s::text[])",
                (cfg.slot, batch, flat),
            ).fetchall()
            fed = 0
            for lsn, data in rows:
                self.progress.messages += 1
                self.pipeline.feed(bytes(data), LSN(lsn))
                fed += 1
                if cfg.endpos is not None and self.pipeline.at_boundary \
                        and self.pipeline.position >= cfg.endpos:
                    self._stop.set()
                    break
            full = len(rows) >= batch
            if self._stop.is_set() and self.pipeline.at_boundary:
                self.pipeline.drain()  # deliver what outputs still batch before acknowledging
            ack = self.pipeline.flush()
            # Everything up to flush_before was read, and handed to the pipeline: nothing
            # before it is left for us (and endpos did not stop us short of it).
            read_all = not full and fed == len(rows)
            idle = read_all and not self.pipeline.in_flight
            if (idle and self.pipeline.at_boundary and ack >= self.pipeline.position
                    and flush_before > ack):
                ack = flush_before
            # what was not finished is read again from the slot next time
            self.pipeline.reset()
            if ack > self.progress.acked:
                conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                             (cfg.slot, str(ack)))
                self.progress.acked = ack
                batch = self.batch_changes
            elif full and not self._stop.is_set():
                # A full batch that ended inside a (streamed) transaction, with nothing to
                # acknowledge: the next peek starts at the same place, so it must read
                # further to ever get past that transaction.
                batch *= 2
            self.progress.server_end = flush_before
            if self.on_progress is not None:
                self.on_progress(self.progress)
            # As pg_recvlogical: everything committed before --endpos is delivered; what is
            # still in flight (held prepared, open streams) ends after it.
            if cfg.endpos is not None and flush_before >= cfg.endpos and read_all:
                return
            if not full:
                self._stop.wait(self.poll_interval)
        self.pipeline.flush()
