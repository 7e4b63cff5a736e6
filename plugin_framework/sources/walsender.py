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
from collections.abc import Callable
from typing import Any

import psycopg

from plugin_framework.framework import Pipeline
from plugin_framework.pgtypes import quote_ident_always
from plugin_framework.protocol import (
    LSN,
    Decoder,
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
from plugin_framework.sources import slots
from plugin_framework.sources.errors import ConnectionLost, SourceError, explain
from plugin_framework.sources.incremental import IncrementalSnapshot, qualified_name
from plugin_framework.sources.monitor import SlotMonitor
from plugin_framework.sources.replication import ReplicationError, ReplicationStream
from plugin_framework.sources.session import (
    PROGRESS_INTERVAL,
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
from plugin_framework.sources.snapshot import (
    NO_KEY,
    CopyLedger,
    SnapshotCopy,
    any_output_in,
    check_snapshot_outputs,
    no_timeouts,
    recorded_progress,
)

log = logging.getLogger("pgdecode.source")

_MESSAGE = ord("M")  # a logical message: maybe an incremental snapshot's (incremental.py)
# The initial copy is made durable (and resumable from there) every second, or every so many
# chunks (50,000 rows) where a second copies more: a fast copy must not end unrecorded.
_CHECKPOINT_CHUNKS = 10


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
        self._walsender_pid: int | None = None  # of our last connection: its slot use is ours
        self._slot_two_phase = False
        self._alive_interval = 1.0  # status updates at least this often during a replay
        # the initial snapshot (--snapshot): still to take, and the copy of the slot made now
        self._snapshot_pending = config.snapshot is not None
        self._copy: SnapshotCopy | None = None
        self._incremental: IncrementalSnapshot | None = None
        self._initial_resumed = False  # an initial copy cut short goes on incrementally
        # this run's initial copy, as far as delivered (a lost connection in the middle goes
        # on from there, as a restart goes on from its output's record), and whether it
        # delivered any row
        self._ledger: CopyLedger | None = None
        self._copy_delivered = False
        self._exported = False  # this run made the slot with an exported snapshot
        self._copy_record: dict[str, Any] | None = None  # what the copy goes on from
        self._copy_lsn = LSN(0)
        self.monitor = SlotMonitor(config.conninfo, config.slot, heartbeat=config.heartbeat)

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
        def attempt() -> None:
            try:
                self._connect()
                if self._copy is not None and not self._take_snapshot():
                    return  # asked to stop during the copy
                if self.config.snapshot == "only":
                    return
                self._stream()
            finally:
                if self._copy is not None:
                    self._copy.close()
                    self._copy = None
                self._close()

        run_with_reconnect(attempt, self.config, self.progress, self.pipeline, self._stop)

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
            if self._snapshot_pending:
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
        if self._initial_resumed:
            # The copy's state goes on in the incremental snapshot's record (kept).
            self._initial_resumed = False
            self.pipeline.end_snapshot(self.progress.acked)
            self.pipeline.flush()
        self._proto = proto
        self.server_version = server_version
        self._walsender_pid = repl.conn.info.backend_pid
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
        export = self._snapshot_pending
        found = slots.lookup_slot(repl.command, cfg.slot, server_version)
        if found is not None:  # one that pgdecode cannot use is refused before anything
            slots.check_usable(found, cfg.slot, dbname=repl.conn.info.dbname, reader=False,
                         two_phase=cfg.slot_two_phase and not self._started)
        exists = found is not None
        # This run's copy, cut short by a lost connection: all it delivered is in the outputs
        in_run = exists and export and self._exported
        goes_on = (in_run and self._copy_delivered and self._ledger is not None
                   and cfg.snapshot == "initial")
        if in_run and self._copy_delivered and not goes_on \
                and not any_output_in(self.pipeline, "copying"):
            raise SourceError(
                f'the connection was lost during the initial snapshot with replication slot '
                f'"{cfg.slot}", which cannot go on from where it was (--snapshot only, or a '
                "table without a key) nor be taken back from the outputs it went to (stdout, "
                "a pipe). Drop the slot (`pgdecode slot drop`) and copy again, into a file "
                "(-f), which can be cut back")
        if exists and export and (in_run or any_output_in(self.pipeline, "copying")):
            recorded = recorded_progress(self.pipeline)
            if goes_on:
                assert self._ledger is not None
                recorded = self._ledger.record()
            if recorded is not None and recorded.get("initial") and cfg.snapshot == "only":
                # What is left goes on from the slot's stream (below), which "only" does not
                # read: said, rather than a copy that ends short
                raise SourceError(
                    f'the initial snapshot with replication slot "{cfg.slot}" did not finish, '
                    "and its snapshot went with the run that made it: the tables left are "
                    "copied as an incremental snapshot, which reads the slot's stream, so "
                    "--snapshot only cannot finish it. Run the same command with --snapshot "
                    "initial instead (and -E LSN to stop): it finishes the copy, then delivers "
                    "the changes made since. Nothing was written or acknowledged")
            if recorded is not None and recorded.get("initial"):
                # Its snapshot went with the run that made it; the slot still streams from
                # the consistent point: the tables left are copied as an incremental
                # snapshot, each after the last key the outputs hold.
                log.warning('the initial snapshot with replication slot "%s" did not finish: '
                            "going on with the tables left as an incremental snapshot",
                            cfg.slot)
                self._snapshot_pending = False
                self._initial_resumed = True
                self._copy_record = recorded
                if self.progress.snapshot is not None:  # it goes on as an incremental one
                    self.progress.snapshot.done = True
                return False
            # Made by a run whose copy did not finish, and never streamed from: made again,
            # with a new snapshot, and the copy taken again.
            log.warning('the initial snapshot with replication slot "%s" did not finish: '
                        "dropping the slot and copying again with a new one", cfg.slot)
            repl.command(self._drop_slot_command(wait=True))
            exists = False
        if exists:
            if export:
                if any_output_in(self.pipeline, "done"):
                    log.info('the initial snapshot with replication slot "%s" is in the '
                             "output already: streaming on", cfg.slot)
                else:
                    log.warning('replication slot "%s" exists already: the initial snapshot '
                                "is taken only with a new slot, so it is not taken again",
                                cfg.slot)
                self._snapshot_pending = False
            return False
        slots.note_slot_wait(repl.command, cfg.slot)
        if export:  # the export's transaction lasts until the copy's connections import it
            repl.command(no_timeouts(server_version))
        rows = repl.command(slots.create_replication_slot_command(
            cfg.slot, temporary=cfg.temporary_slot, two_phase=cfg.slot_two_phase,
            server_version=server_version, export=export))
        log.info('created replication slot "%s"', cfg.slot)
        if export:
            self._exported = True
            # Imported before the next command on this connection, which ends the export.
            _, point, snapshot_name, _ = rows[0]
            self._copy = SnapshotCopy(cfg.conninfo, snapshot_name, cfg.snapshot_workers)
            self._copy_lsn = LSN(point)
        return True

    def _drop_slot_command(self, *, wait: bool = False) -> str:
        return (f"DROP_REPLICATION_SLOT {quote_ident_always(self.config.slot)}"
                + (" WAIT" if wait else ""))

    def _refuse_unresumable_copy(self, tables: list[str]) -> None:
        """A copy not in key order is taken again whole after an interruption: refused for
        outputs that cannot take back what they delivered of it (Spark's batches). Said
        after ``begin_snapshot``, so that the next run makes the slot again."""
        for m in self.pipeline.members:
            if getattr(m.ctx.output, "copy_must_resume", False):
                if self._repl is not None:  # made by this run, for this copy: not kept
                    with contextlib.suppress(psycopg.Error):
                        self._repl.command(self._drop_slot_command())
                raise SourceError(
                    f'--snapshot: output plugin "{m.plugin.name}" delivers the copy in '
                    "batches it cannot take back, so the copy must be able to go on after an "
                    f"interruption; {', '.join(tables)} cannot ({NO_KEY} to copy in order). "
                    "Give the table a primary key, or leave it out of the publication for the "
                    "copy. The slot "
                    "made for it was dropped again")

    def _take_snapshot(self) -> bool:
        """Copy the published tables through the pipeline, then mark the copy done at the
        slot's consistent point and make it durable. False if asked to stop first (the next
        run copies again)."""
        copy = self._copy
        assert copy is not None
        pipeline, lsn = self.pipeline, self._copy_lsn
        tables = copy.tables(self.config.publications)
        progress = self.progress.snapshot = SnapshotProgress(
            tables=len(tables), rows_estimate=sum(t.rows_estimate for t in tables))
        last_log = last_flush = time.monotonic()
        unflushed = 0  # chunks since the last flush
        # Copied in key order, a copy cut short goes on after the last key an output holds
        # of each range (as an incremental snapshot: docs/snapshot.md); else it starts again.
        resumable = all(t.ordered for t in tables)
        pipeline.begin_snapshot()
        if not resumable:
            self._refuse_unresumable_copy([t.qualified for t in tables if not t.ordered])
        try:
            parts = copy.parts(tables)
            ledger = CopyLedger(self.config.slot, parts, Decoder(self._proto or 1))
            if resumable:
                self._ledger = ledger
            for chunk in copy.chunks(parts, self._stop.is_set):
                table = chunk.table
                assert table.relation is not None
                saved = ledger.saved()
                first, finished = ledger.delivered(chunk)
                if resumable:
                    pipeline.note_snapshot_progress(ledger.record())
                try:
                    pipeline.snapshot_rows(table.relation, table.types, chunk.inserts, lsn,
                                           copy.read_time, first=first)
                except BaseException:
                    ledger.restore(saved)  # its transaction was cut short: not delivered
                    raise
                self._copy_delivered = True
                if resumable:
                    pipeline.snapshot_checkpoint()
                progress.rows += len(chunk.inserts)
                progress.bytes += sum(map(len, chunk.inserts))
                self.progress.transactions = pipeline.transactions
                self.progress.changes = pipeline.changes
                if finished:
                    progress.tables_done += 1
                    progress.log(log, f"copied {table.qualified}")
                now = time.monotonic()
                unflushed += 1
                if resumable and (now - last_flush >= 1 or unflushed >= _CHECKPOINT_CHUNKS):
                    last_flush, unflushed = now, 0
                    pipeline.flush()
                if now - last_log >= PROGRESS_INTERVAL:
                    last_log = now
                    progress.log(log)
        except InterruptedError:
            log.info("stopped during the initial snapshot: the next run goes on with it")
            return False
        except psycopg.Error as exc:
            raise explain(exc, self.config.conninfo, self.config.slot) from None
        finally:
            copy.close()
            self._copy = None
        if resumable:
            pipeline.note_snapshot_progress(None)
            pipeline.snapshot_checkpoint()
        pipeline.end_snapshot(lsn)
        pipeline.flush()
        self._snapshot_pending = False
        progress.done = True
        progress.log(log, f"initial snapshot done, consistent with the slot at {lsn}")
        return True

    def _check_slot(self, repl: ReplicationStream) -> None:
        cfg, info = self.config, repl.conn.info
        slot = slots.usable_slot(repl.command, cfg.slot, dbname=info.dbname,
                                 server_version=info.server_version,
                                 temporary=cfg.temporary_slot, previous_pid=self._walsender_pid)
        self._slot_two_phase, confirmed = slot.two_phase, slot.confirmed_flush_lsn
        if confirmed is not None:  # (never less than the server has: the slot would go back)
            self.progress.acked = max(self.progress.acked, confirmed)

    def _close(self) -> None:
        self.pipeline.keepalive = None
        if self._repl is not None:
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
            if active and int(active[1]) == self._walsender_pid:  # ours, not yet gone
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
            tap = self.tap
            interval = cfg.status_interval
            endpos = cfg.endpos
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
                for raw in batch:
                    if raw[0] == XLOGDATA_TAG and len(raw) >= header and tap is None:
                        # The hot path: no XLogData object, no send time.
                        wal_start = wire_lsn(wal_start_of(raw, 1)[0])
                        if wal_start > received:
                            received = wal_start
                        payload = raw[header:].tobytes()
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
                    if endpos is not None and pipeline.at_boundary \
                            and pipeline.position >= endpos:
                        finished = True
                        break
                    if stop() and pipeline.at_boundary:
                        break
                progress.received = received
                if incremental.busy and pipeline.at_boundary:
                    incremental.step()  # the next chunk's watermarks and rows
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
        recorded = self._copy_record or recorded_progress(self.pipeline)
        if recorded is not None:
            incremental.resume(recorded)  # where the output's last durable chunk left it
        for table in cfg.snapshot_tables:
            if qualified_name(table) in incremental.done:
                log.info("incremental snapshot of %s: taken already into this output", table)
            else:
                incremental.request(table)
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
        return endpos is not None and message.wal_end >= endpos and pipeline.at_boundary

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
            endpos is not None and pipeline.position >= endpos)
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
