"""The streaming replication source: START_REPLICATION over psycopg 3, driving a Pipeline,
acknowledging only what every output has made durable.

Acknowledgement rules:
- ``flushed`` (what the server may forget) is the pipeline's durable LSN: the minimum over
  outputs of what they fsynced, never past a prepared transaction a plugin still waits for.
- When nothing is in flight, it advances to the WAL position of the server's last keepalive,
  so that an idle slot (or one whose changes are all filtered out) does not hold WAL back.
- Status updates go every ``status_interval`` seconds, when the server asks, and at the end.
- While the pipeline replays a held transaction from its spool (which can take minutes, and
  reads nothing meanwhile), status updates that acknowledge nothing new keep going, often
  enough for the server's ``wal_sender_timeout``: the server would otherwise drop the
  connection as dead and send the transaction again, on every attempt.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence

import psycopg

from plugin_framework.framework import Pipeline
from plugin_framework.pgtypes import quote_ident_always
from plugin_framework.protocol import (
    LSN,
    PrimaryKeepalive,
    XLogData,
    decode_copy_data,
)
from plugin_framework.protocol.framing import (
    XLOGDATA_HEADER_SIZE,
    XLOGDATA_TAG,
    xlogdata_wal_start,
)
from plugin_framework.protocol.lsn import wire_lsn
from plugin_framework.protocol.raw import ROW_CHANGE_TAGS
from plugin_framework.protocol.runs import row_change_run
from plugin_framework.sources import slots
from plugin_framework.sources.errors import ConnectionLost, SourceError, explain
from plugin_framework.sources.monitor import SlotMonitor
from plugin_framework.sources.replication import ReplicationError, ReplicationStream
from plugin_framework.sources.session import (
    Progress,
    SnapshotProgress,
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
from plugin_framework.sources.snapshots.catalog import qualified_name
from plugin_framework.sources.snapshots.copy import no_timeouts
from plugin_framework.sources.snapshots.incremental import IncrementalSnapshot
from plugin_framework.sources.snapshots.initial import InitialCopy, unfinished
from plugin_framework.sources.snapshots.ledger import check_snapshot_outputs, recorded_progress
from plugin_framework.sources.snapshots.requests import request_snapshot

log = logging.getLogger("pgdecode.source")

_MESSAGE = ord("M")  # a logical message: maybe an incremental snapshot's (snapshots/incremental.py)


class WalsenderSource:
    """Runs a Pipeline from a replication slot until endpos, a stop request, or an error."""

    def __init__(self, config: SourceConfig, pipeline: Pipeline,
                 on_progress: Callable[[Progress], None] | None = None,
                 tap: Callable[[XLogData | PrimaryKeepalive], None] | None = None,
                 before_status: Callable[[], None] | None = None) -> None:
        """``tap`` sees every message as received (capture); ``before_status`` runs before
        each acknowledgement (a capture file's fsync)."""
        self.config = config
        self.tap = tap
        self.before_status = before_status
        self.pipeline = pipeline
        self.progress = Progress()
        self.on_progress = on_progress
        self._stop = threading.Event()
        self._repl: ReplicationStream | None = None
        self._started = False
        self._proto: int | None = None
        self.options: dict[str, str] = {}  # the pgoutput options of the last connection
        self.server_version = 0
        self._last_status = 0.0
        self._slot_two_phase = False
        self._alive_interval = 1.0  # status updates at least this often during a replay
        self.initial = InitialCopy(config.conninfo, config.slot, config.snapshot,
                                   config.snapshot_workers, pipeline)
        self._incremental: IncrementalSnapshot | None = None
        self._told_copy_goes_on = False  # that -E waits for a snapshot under way
        self.monitor = SlotMonitor(config.conninfo, config.slot, heartbeat=config.heartbeat)
        pipeline.take_snapshot_requests(self._request_snapshot)

    @property
    def incremental_progress(self) -> SnapshotProgress | None:
        """How far the incremental snapshot under way is (None: none is)."""
        incremental = self._incremental
        if incremental is None or incremental.figures is None or incremental.figures.done:
            return None
        return incremental.figures

    def request_stop(self) -> None:
        """Finish the transaction being delivered, acknowledge, and return from run()."""
        self._stop.set()

    def run(self) -> None:
        """Stream until endpos, a stop request or an error. A run that stops with a snapshot
        not complete (asked to stop during the copy, SIGTERM) says so: SnapshotUnfinished,
        once what was delivered is acknowledged."""
        initial = self.initial

        def attempt() -> None:
            try:
                self._connect()
                if initial.copy is not None and not initial.take(
                        self._proto or 1, self._stop.is_set, self.progress,
                        self.config.publications, self._drop_slot_made_now):
                    return  # asked to stop during the copy
                if self.config.snapshot == "only":
                    return
                self._stream()
            finally:
                initial.close()
                self._close()

        run_with_reconnect(attempt, self.config, self.progress, self.pipeline, self._stop)
        left = self.copy_left()
        if left:
            raise unfinished(left)

    def copy_left(self) -> list[str]:
        """The tables a snapshot of this run has still to copy (all or part of)."""
        initial, incremental = self.initial, self._incremental
        if initial.pending and initial.exported:  # the copy of this run's slot
            record = initial.ledger.record() if initial.ledger is not None else None
            return list(record["queue"]) if record is not None else ["the published tables"]
        if incremental is None or not incremental.busy:
            return []
        current = incremental.current
        return ([] if current is None else [current.copy.qualified]) + list(incremental.queue)

    # --- connection -----------------------------------------------------------------------------

    def _connect(self) -> None:
        cfg = self.config
        if cfg.temporary_slot and self._started:
            # A temporary slot is dropped with the connection that created it.
            raise SourceError(
                f'the connection was lost, and the temporary slot "{cfg.slot}" with it: the '
                "changes since the last acknowledgement cannot be read again. Use a "
                "persistent slot to survive reconnects"
            )
        if self._started and self.pipeline.catalog is not None:
            # Its connection went with the server, most likely: reconnect on the next query.
            with contextlib.suppress(Exception):
                self.pipeline.catalog.close()
        try:
            repl = self._repl = ReplicationStream(cfg.conninfo)
            server_version = repl.conn.info.server_version
            self._check_server(repl, server_version)
            is_init = False
            if self.initial.pending:
                check_snapshot_outputs(self.pipeline)
            if cfg.create_slot:
                is_init = self._create_slot(repl, server_version)
            self._check_slot(repl)  # (after the copy's connections imported the snapshot)
            # How far the server's WAL is written, to check a resumed output against
            server_lsn = None if self._started else repl.identify_system()[2]
        except psycopg.Error as exc:
            raise explain(exc, cfg.conninfo, cfg.slot, cfg.proto_version) from None
        proto = check_proto_version(cfg.proto_version, server_version)
        if not self._started:
            start_pipeline(self.pipeline, proto, server_version, is_init, cfg.slot,
                           lambda: repl.command(self._drop_slot_command()),
                           server_lsn=server_lsn)
            self._started = True
        self.initial.go_on()  # a copy cut short: its record goes on in the incremental one
        self._proto = proto
        self.server_version = server_version
        self._alive_interval = self._keepalive_interval(repl)
        two_phase = cfg.two_phase
        if two_phase is None:
            # Only where the slot decodes two-phase already: asking for it on another slot
            # would turn it on for good (PostgreSQL 15 and later).
            two_phase = (proto >= 3 and self._slot_two_phase
                         and any(m.ctx.twophase for m in self.pipeline.members))
        self.options = pgoutput_options(cfg, proto, two_phase, server_version,
                                        local_only=only_local(self.pipeline))
        self.progress.connected = True

    def _check_server(self, repl: ReplicationStream, server_version: int) -> None:
        level = repl.command("SHOW wal_level")[0][0]
        if level != "logical":
            raise wal_level_error(level)
        missing = missing_publication(repl.conn, self.config.publications)
        if missing is not None:
            raise missing_publication_error(missing, repl.conn.info.dbname)

    def _keepalive_interval(self, repl: ReplicationStream) -> float:
        """How often to answer the server while no message is read: a quarter of this
        session's wal_sender_timeout (the server asks for a reply at half of it, and drops
        the connection at all of it), never more than the status interval."""
        interval = self.config.status_interval
        try:
            rows = repl.command(
                "SELECT setting::int FROM pg_settings WHERE name = 'wal_sender_timeout'")
        except psycopg.Error as exc:
            raise explain(exc, self.config.conninfo, self.config.slot,
                          self.config.proto_version) from None
        timeout_ms = rows[0][0] if rows else 0
        if timeout_ms > 0:
            interval = min(interval, timeout_ms / 4000)
        return max(interval, 0.05)

    def _create_slot(self, repl: ReplicationStream, server_version: int) -> bool:
        cfg = self.config
        export = self.initial.pending
        found = slots.lookup_slot(repl.command, cfg.slot, server_version)
        if found is not None:  # one that pgdecode cannot use is refused before anything
            slots.check_usable(found, cfg.slot, dbname=repl.conn.info.dbname, reader=False,
                               two_phase=cfg.slot_two_phase and not self._started)
        exists = found is not None
        if exists and export:
            if self.initial.on_existing_slot(
                    lambda: repl.command(self._drop_slot_command(wait=True))):
                exists = False  # dropped: made again below
            elif self.initial.resumed and self.progress.snapshot is not None:
                self.progress.snapshot.done = True  # it goes on as an incremental one
        if exists:
            return False
        slots.note_slot_wait(repl.command, cfg.slot)
        if export:  # the export's transaction lasts until the copy's connections import it
            repl.command(no_timeouts(server_version))
        rows = repl.command(slots.create_replication_slot_command(
            cfg.slot, temporary=cfg.temporary_slot, two_phase=cfg.slot_two_phase,
            server_version=server_version, export=export))
        log.info('created replication slot "%s"', cfg.slot)
        if export:
            # Imported before the next command on this connection, which ends the export.
            _, point, snapshot_name, _ = rows[0]
            self.initial.slot_made(snapshot_name, point)
        return True

    def _drop_slot_command(self, *, wait: bool = False) -> str:
        return (f"DROP_REPLICATION_SLOT {quote_ident_always(self.config.slot)}"
                + (" WAIT" if wait else ""))

    def _drop_slot_made_now(self) -> None:
        """Drop the slot this run made for its copy, which is refused (not kept)."""
        if self._repl is not None:
            with contextlib.suppress(psycopg.Error):
                self._repl.command(self._drop_slot_command())

    def _check_slot(self, repl: ReplicationStream) -> None:
        cfg, info = self.config, repl.conn.info
        slot = slots.usable_slot(repl.command, cfg.slot, dbname=info.dbname,
                                 server_version=info.server_version,
                                 temporary=cfg.temporary_slot,
                                 own_pids=slots.own_walsenders(_server(repl), cfg.slot))
        self._slot_two_phase, confirmed = slot.two_phase, slot.confirmed_flush_lsn
        if confirmed is not None:  # (never less than the server has: the slot would go back)
            self.progress.acked = max(self.progress.acked, confirmed)

    def _close(self) -> None:
        self.pipeline.keepalive = None
        if self._repl is not None:
            slots.closed_walsender(_server(self._repl), self.config.slot,
                                   self._repl.conn.info.backend_pid)
            with contextlib.suppress(psycopg.Error):
                self._repl.close()
            self._repl = None

    # --- streaming ------------------------------------------------------------------------------

    def _stream(self) -> None:
        repl = self._repl
        assert repl is not None and self._proto is not None
        cfg = self.config
        try:
            repl.start(cfg.slot, LSN(0), self.options)
        except psycopg.errors.ObjectInUse as exc:
            active = re.search(r"PID (\d+)", str(exc))
            if active and int(active[1]) in slots.own_walsenders(_server(repl), cfg.slot):
                raise ConnectionLost(str(exc).strip()) from None
            raise explain(exc, cfg.conninfo, cfg.slot, self._proto) from None
        except psycopg.Error as exc:
            raise explain(exc, cfg.conninfo, cfg.slot, self._proto) from None
        shown = ", ".join(f"{k} {v}" for k, v in self.options.items()
                          if k not in ("proto_version", "publication_names"))
        log.info('streaming slot "%s" from %s: pgoutput protocol %d, publications %s%s',
                 cfg.slot, self.progress.acked, self._proto,
                 ", ".join(cfg.publications), f", {shown}" if shown else "")
        self._last_status = time.monotonic()
        pipeline = self.pipeline
        progress = self.progress
        pipeline.keepalive = self._keepalive_during_replay
        incremental = self._incremental_snapshot()
        if incremental.busy:  # under way before any change is read: moves are noted
            incremental.step()
        try:
            stop = self._stop.is_set
            read_batch = repl.read_batch
            feed = pipeline.feed
            feed_run = pipeline.feed_run
            tap = self.tap
            interval = cfg.status_interval
            endpos = cfg.endpos
            copy_goes_on = self.initial.going_on()  # an initial copy cut short, resumed
            monotonic = time.monotonic
            header = XLOGDATA_HEADER_SIZE
            wal_start_of = xlogdata_wal_start
            finished = False
            while not finished:
                if stop() and pipeline.at_boundary:
                    break
                wait = self._last_status + interval - monotonic()
                if wait <= 0:
                    self._send_status()
                    wait = interval
                received = progress.received
                batch = read_batch(min(wait, 1.0))
                progress.messages += len(batch)  # keepalives are taken off below
                progress.bytes += sum(map(len, batch))
                i, end = 0, len(batch)
                while i < end:
                    raw = batch[i]
                    i += 1
                    if raw[0] == XLOGDATA_TAG and len(raw) > header and tap is None:
                        # The hot path: no XLogData object, no send time; a run of row
                        # changes in one call of the pipeline (outside an incremental
                        # snapshot's window, where each change is looked at). A run leaves
                        # a transaction open: no end position or stop to look for after it.
                        if incremental.current is None and raw[header] in ROW_CHANGE_TAGS:
                            datas, lsns, after = row_change_run(batch, i - 1)
                            if datas:
                                i = after
                                if lsns[-1] > received:
                                    received = lsns[-1]
                                feed_run(datas, lsns)
                                continue
                        wal_start = wire_lsn(wal_start_of(raw, 1)[0])
                        if wal_start > received:
                            received = wal_start
                        payload = bytes(raw[header:])
                        if (payload[0] == _MESSAGE or incremental.current is not None) \
                                and incremental.intercept(payload, wal_start):
                            continue  # a watermark or a request: not the plugins'
                        feed(payload, wal_start)
                    else:
                        message = decode_copy_data(raw)
                        if tap is not None:
                            tap(message)
                        if type(message) is not XLogData:
                            assert isinstance(message, PrimaryKeepalive)
                            progress.messages -= 1  # not a message of the stream
                            progress.received = received
                            if self._on_keepalive(message):
                                finished = True
                                break
                            continue
                        if message.wal_start > received:
                            received = message.wal_start
                        if not incremental.intercept(message.data, message.wal_start):
                            feed(message.data, message.wal_start)
                    if endpos is not None and pipeline.position >= endpos \
                            and self._complete_at(pipeline.position):
                        finished = True
                        break
                    if stop() and pipeline.at_boundary:
                        break
                progress.received = received
                if incremental.busy and pipeline.at_boundary:
                    incremental.step()  # the next chunk's watermarks and rows
                if copy_goes_on and not incremental.busy and pipeline.at_boundary:
                    copy_goes_on = False
                    self.initial.finished(pipeline.position)
            self._send_status(final=True)
            try:
                repl.end()
            except (ReplicationError, psycopg.Error) as exc:  # acknowledged already
                log.debug("ending the stream: %s", exc)
        except (ReplicationError, psycopg.Error) as exc:
            raise explain(exc, cfg.conninfo, cfg.slot, self._proto) from None
        finally:
            incremental.close()

    def _incremental_snapshot(self) -> IncrementalSnapshot:
        """The incremental snapshots of this connection: those of --snapshot-table, those a
        request message asks for (``pgdecode snapshot``), and those under way: after a
        reconnect, or recorded in an output's progress file, they go on at the next chunk
        (see docs/snapshot.md)."""
        if self._incremental is not None:
            # A reconnect: the output has every chunk delivered, so the snapshots go on with
            # all they knew; only the chunk whose watermarks were lost is read again.
            return self._incremental
        cfg = self.config
        assert self._proto is not None
        incremental = IncrementalSnapshot(cfg.conninfo, cfg.slot, cfg.publications,
                                          self.pipeline, self._proto, binary=cfg.binary)
        recorded = self.initial.record or recorded_progress(self.pipeline)
        if recorded is not None:
            incremental.resume(recorded)  # where the output's last durable chunk left it
        for table in cfg.snapshot_tables:
            if qualified_name(table) in incremental.done:
                log.info("incremental snapshot of %s: taken already into this output", table)
            else:
                incremental.include(table)
        self._incremental = incremental
        return incremental

    def _on_keepalive(self, message: PrimaryKeepalive) -> bool:
        """Note the server's WAL end, answer if asked; True when that end reaches --endpos
        between transactions (the stream is complete).

        As for pg_recvlogical, a keepalive at or past --endpos means that every transaction
        committed before it has been sent: a prepared one still held, or one still being
        streamed, ends after --endpos, and is left for the next run (acknowledgement stops
        short of it, so the server sends it again)."""
        progress, pipeline, endpos = self.progress, self.pipeline, self.config.endpos
        progress.server_end = message.wal_end
        progress.server_time = message.send_time.timestamp()
        if message.reply_requested:
            self._send_status()
        return endpos is not None and message.wal_end >= endpos \
            and self._complete_at(pipeline.position)

    def _complete_at(self, lsn: LSN) -> bool:
        """Whether the stream may end here, past --endpos (``lsn``): between transactions,
        and with no snapshot under way: -E finishes the copy first (its chunks' watermarks
        come after endpos), rather than end with tables not copied. What the outputs hold
        is delivered first: a mirror may ask for rows again as it takes them."""
        if not self.pipeline.at_boundary:
            return False
        if not self._snapshot_busy():
            self.pipeline.drain()
        if self._snapshot_busy():
            if not self._told_copy_goes_on:
                self._told_copy_goes_on = True
                log.info("reached --endpos %s with a snapshot under way (%s): going on until "
                         "it is complete", lsn, ", ".join(self.copy_left()))
            return False
        return True

    def _snapshot_busy(self) -> bool:
        incremental = self._incremental
        return incremental is not None and incremental.busy

    def _request_snapshot(self, table: str, keys: Sequence[Sequence[str | None]] | None
                          ) -> LSN:
        """A plugin's request (``ctx.request_snapshot``): taken by the incremental snapshot
        of this stream, or, before it streams, left in the WAL for the stream to read."""
        incremental = self._incremental
        if incremental is not None:
            return incremental.ask(table, keys)
        try:
            with psycopg.connect(self.config.conninfo, autocommit=True) as conn:
                return request_snapshot(conn, self.config.slot, table, keys)
        except psycopg.Error as exc:
            raise explain(exc, self.config.conninfo, self.config.slot) from None

    def _keepalive_during_replay(self) -> None:
        """The pipeline's keepalive hook, called between the changes of a transaction it
        replays: a status update every ``_alive_interval`` seconds. It reads nothing (new
        XLogData would have to wait in memory) and acknowledges nothing new: what is being
        replayed is not durable yet. The server takes any status update as a sign of life,
        also while it waits to write to us."""
        now = time.monotonic()
        if now - self._last_status < self._alive_interval:
            return
        repl = self._repl
        if repl is None:
            return
        progress = self.progress
        try:
            repl.send_status(max(progress.received, progress.acked), progress.acked,
                             progress.acked)
        except (ReplicationError, psycopg.Error) as exc:
            # The connection is gone: the replay finishes, and the stream's next read finds
            # the loss (nothing of this transaction is acknowledged; the server sends it again).
            log.debug("a status update during a replay: %s", exc)
        self._last_status = now

    def _send_status(self, final: bool = False) -> None:
        repl = self._repl
        assert repl is not None
        pipeline = self.pipeline
        progress = self.progress
        endpos = self.config.endpos
        finishing = final or self._stop.is_set() or (
            endpos is not None and pipeline.position >= endpos
            and self._complete_at(pipeline.position))
        if finishing and pipeline.at_boundary:
            pipeline.drain()  # outputs that batch deliver what they hold, to be acknowledged
        if self.before_status is not None:
            self.before_status()
        ack = pipeline.flush()
        # Idle: nothing in flight and every output durable as far as the pipeline got.
        if (not pipeline.in_flight and pipeline.at_boundary and ack >= pipeline.position
                and progress.server_end > ack):
            ack = progress.server_end
        if ack > progress.acked:
            progress.acked = ack
        written = max(progress.received, progress.acked)
        repl.send_status(written, progress.acked, progress.acked)
        self._last_status = time.monotonic()
        if self.on_progress is not None:
            self.on_progress(progress)


def _server(repl: ReplicationStream) -> str:
    """The server a replication connection is to, as the walsenders' record keys it."""
    info = repl.conn.info
    return f"{info.host}:{info.port}"
