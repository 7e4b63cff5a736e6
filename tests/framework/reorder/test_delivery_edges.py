"""Delivery at the edges the server's WAL layout creates, on real streams from each version:
where a message's LSN points, prepared transactions whose table changes shape, outcomes of
transactions this pipeline never saw prepared, and what may be acknowledged meanwhile.

Each test takes its own table, publication and slot in a module database, runs its SQL,
and feeds what the slot holds (``pg_logical_slot_peek_binary_changes``) to a Pipeline."""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import pytest
from psycopg import sql
from support.capture import Captured, peek, pgoutput_options
from support.recorders import (
    Recorder,
    StreamRecorder,
    TwoPhaseRecorder,
    apply_streams,
    changes_by_transaction,
)

from plugin_framework import LSN, FileOutput, MemoryOutput, OutputPlugin, Pipeline
from plugin_framework.framework.outputs import Output

_names = count()


class Case:
    """One test's table ``t<n>`` (``id int primary key`` plus ``columns``), publication and
    slot (two-phase decoding when ``two_phase``)."""

    def __init__(self, db: Any, columns: str = "", *, two_phase: bool = False) -> None:
        n = next(_names)
        self.db, self.table, self.publication, self.slot = db, f"t{n}", f"p{n}", f"s{n}"
        self.conn = db.connect(autocommit=True)
        self.conn.execute("SET synchronous_commit = on")  # peeking decodes flushed WAL only
        self.conn.execute(f"CREATE TABLE {self.table} (id int PRIMARY KEY{columns})")
        self.conn.execute(f"CREATE PUBLICATION {self.publication} FOR TABLE {self.table}")
        self.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                          (self.slot, two_phase))
        self.proto = 4 if db.major_version >= 16 else 3

    def sql(self, *statements: str) -> None:
        for statement in statements:
            self.conn.execute(statement.format(t=self.table))

    def changes(self) -> list[Captured]:
        return peek(self.conn, self.slot, pgoutput_options(self.proto,
                                                           publication=self.publication))

    def streamed_changes(self) -> list[Captured]:
        """What the slot holds, with streaming on: the test clusters' logical_decoding_work_mem
        of 64kB makes the server stream a few thousand rows."""
        items = peek(self.conn, self.slot, pgoutput_options(
            self.proto, publication=self.publication, streaming="on"))
        assert any(item.data[:1] == b"S" for item in items), "the server did not stream it"
        return items

    def pipeline(self, *plugins: OutputPlugin,
                 output: Callable[[], Output] = MemoryOutput) -> Pipeline:
        """A started Pipeline with ``plugins``, each writing to a new ``output()``."""
        pipeline = Pipeline(proto_version=self.proto)
        for plugin in plugins:
            pipeline.add(plugin, output=output())
        pipeline.startup()
        return pipeline

    def feed(self, *plugins: OutputPlugin, items: list[Captured] | None = None) -> Pipeline:
        """``plugins`` fed ``items`` (default: what the slot holds now)."""
        pipeline = self.pipeline(*plugins)
        for item in self.changes() if items is None else items:
            pipeline.feed(item.data, item.lsn)
        return pipeline

    def advance(self, lsn: LSN) -> None:
        """Acknowledge ``lsn`` as a consumer would: the slot forgets what lies before it."""
        self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                          (self.slot, str(lsn)))

    def close(self) -> None:
        self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        self.conn.close()


@pytest.fixture
def case(pg_module_db: Any) -> Iterator[Any]:
    made: list[Case] = []

    def make(columns: str = "", *, two_phase: bool = False) -> Case:
        made.append(Case(pg_module_db, columns, two_phase=two_phase))
        return made[-1]

    yield make
    for c in made:
        c.close()
    # A prepared transaction left open would make every later slot creation in the database
    # wait for it (a consistent snapshot needs running transactions to end).
    with pg_module_db.connect(autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = "
                                   "current_database()").fetchall():
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(gid))


def changes_of(plugin: Recorder) -> list[Any]:
    return [e[3] for e in plugin.events if e[0] == "change"]


def test_message_just_before_commit_neither_hides_nor_unacks_the_transaction(case: Any) -> None:
    """A non-transactional message's LSN is where its record ends: when COMMIT follows it
    at once, the commit record starts exactly there."""
    c = case()
    c.sql("BEGIN", "INSERT INTO {t} VALUES (1)",
          "SELECT pg_logical_emit_message(false, 'audit', 'x')", "COMMIT",
          "INSERT INTO {t} VALUES (2)")
    plugin = Recorder()
    pipeline = c.feed(plugin)
    assert changes_of(plugin) == [(("id", "1"),), (("id", "2"),)]
    messages = [e for e in plugin.events if e[0] == "message"]
    assert [m[1:4] for m in messages] == [(False, "audit", b"x")]

    # Acknowledging what was delivered up to the message must leave the transaction after it
    # in the slot.
    first = c.changes()
    message_lsn = LSN(messages[0][4])
    pipeline = c.pipeline(Recorder())
    for item in first:
        pipeline.feed(item.data, item.lsn)
        if pipeline.position >= message_lsn:
            break
    c.advance(pipeline.flush())
    again = Recorder()
    c.feed(again)
    assert changes_of(again) == [(("id", "1"),), (("id", "2"),)]
    assert not [e for e in again.events if e[0] == "message"]


def test_prepared_transaction_that_alters_its_table_replays_each_row_as_it_was(
        case: Any) -> None:
    """An ordinary plugin gets a prepared transaction at COMMIT PREPARED, replayed from its
    spool: rows written before an ALTER TABLE in it keep the columns they had."""
    c = case(", a text, b text", two_phase=True)
    c.sql("BEGIN", "INSERT INTO {t} VALUES (1, 'a1', 'b1')", "ALTER TABLE {t} DROP COLUMN a",
          "INSERT INTO {t} VALUES (2, 'b2')", "ALTER TABLE {t} ADD COLUMN c int",
          "INSERT INTO {t} VALUES (3, 'b3', 3)", "PREPARE TRANSACTION 'reshape'",
          "COMMIT PREPARED 'reshape'")
    expected = [(("id", "1"), ("a", "a1"), ("b", "b1")), (("id", "2"), ("b", "b2")),
                (("id", "3"), ("b", "b3"), ("c", "3"))]
    ordinary, two_phase = Recorder(), TwoPhaseRecorder()
    c.feed(ordinary, two_phase)
    assert changes_of(two_phase) == expected  # live, as the messages came
    assert changes_of(ordinary) == expected  # replayed at COMMIT PREPARED


def test_streamed_prepared_transaction_that_alters_its_table_replays_each_row_as_it_was(
        case: Any) -> None:
    """The same, streamed: pgoutput describes a table again in every streamed transaction
    that uses it, so the spool holds each definition where it applies."""
    c = case(", a text, b text", two_phase=True)
    c.sql("BEGIN",
          "INSERT INTO {t} SELECT g, 'a' || g, 'b' || g FROM generate_series(1, 3000) g",
          "ALTER TABLE {t} DROP COLUMN a",
          "INSERT INTO {t} SELECT g, 'b' || g FROM generate_series(3001, 6000) g",
          "PREPARE TRANSACTION 'reshape-streamed'", "COMMIT PREPARED 'reshape-streamed'")
    ordinary = Recorder()
    c.feed(ordinary, items=c.streamed_changes())
    rows = changes_of(ordinary)
    assert len(rows) == 6000
    assert rows[0] == (("id", "1"), ("a", "a1"), ("b", "b1"))
    assert rows[2999] == (("id", "3000"), ("a", "a3000"), ("b", "b3000"))
    assert rows[3000] == (("id", "3001"), ("b", "b3001"))


class FinalLsnRecorder(TwoPhaseRecorder):
    def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
        self.events.append(("commit_prepared", txn.gid, int(txn.final_lsn), int(commit_lsn)))


def test_commit_prepared_gets_the_commit_as_final_lsn(case: Any) -> None:
    """txn->final_lsn is the COMMIT PREPARED record's LSN there (ReorderBufferFinishPrepared),
    not the PREPARE's."""
    c = case(two_phase=True)
    c.sql("BEGIN", "INSERT INTO {t} VALUES (1)", "PREPARE TRANSACTION 'final'",
          "COMMIT PREPARED 'final'")
    plugin = FinalLsnRecorder()
    c.feed(plugin)
    [(_, gid, final_lsn, commit_lsn)] = [e for e in plugin.events if e[0] == "commit_prepared"]
    assert gid == "final" and final_lsn == commit_lsn


def test_rollback_of_a_transaction_prepared_before_this_pipeline_owes_others_nothing(
        case: Any) -> None:
    """A two-phase plugin alone read the PREPARE and acknowledged past it; a pipeline that
    adds an ordinary plugin then meets the ROLLBACK PREPARED. Nothing was lost for the
    ordinary plugin, so the stream goes on."""
    c = case(two_phase=True)
    c.sql("BEGIN", "INSERT INTO {t} VALUES (1)", "PREPARE TRANSACTION 'undone'")
    first = c.feed(TwoPhaseRecorder())
    c.advance(first.flush())
    c.sql("ROLLBACK PREPARED 'undone'", "INSERT INTO {t} VALUES (2)")
    ordinary, two_phase = Recorder(), TwoPhaseRecorder()
    c.feed(ordinary, two_phase)
    assert changes_of(ordinary) == [(("id", "2"),)]
    assert [e[2] for e in two_phase.events if e[0] == "rollback_prepared"] == ["undone"]
    assert changes_of(two_phase) == [(("id", "2"),)]


def test_commit_of_a_transaction_prepared_before_this_pipeline_is_refused_for_others(
        case: Any) -> None:
    """The same with COMMIT PREPARED: its changes are no longer in the slot, and the ordinary
    plugin must not silently miss them."""
    c = case(two_phase=True)
    c.sql("BEGIN", "INSERT INTO {t} VALUES (1)", "PREPARE TRANSACTION 'done'")
    first = c.feed(TwoPhaseRecorder())
    c.advance(first.flush())
    c.sql("COMMIT PREPARED 'done'")
    with pytest.raises(Exception, match='prepared transaction "done" was prepared before'):
        c.feed(Recorder(), TwoPhaseRecorder())


def values(plugin: Recorder) -> list[list[str]]:
    """The new rows' values a Recorder got, transaction by transaction."""
    return [[v for e in txn for _, v in e[3]] for txn in changes_by_transaction(plugin.events)]


def test_a_prepared_transaction_held_in_the_file_is_acknowledged_past_and_kept(
        case: Any, tmp_path: Any) -> None:
    """Run 1 holds a prepared transaction for an ordinary plugin: its file keeps it
    (FILE.hold), so the acknowledgement passes its PREPARE and the later commit. The
    slot is advanced there and run 1 dies; the server then sends run 2 only the
    COMMIT PREPARED, and run 2 delivers the transaction from the file's hold."""
    c = case(two_phase=True)
    c.sql("BEGIN", "INSERT INTO {t} VALUES (1)", "PREPARE TRANSACTION 'pending'",
          "INSERT INTO {t} VALUES (2)")
    path = str(tmp_path / "out")

    def run() -> tuple[Pipeline, list[LSN], Recorder]:
        plugin = Recorder()
        pipeline = c.pipeline(plugin, output=lambda: FileOutput(path))
        acks = []
        for item in c.changes():
            pipeline.feed(item.data, item.lsn)
            acks.append(pipeline.flush())
        return pipeline, acks, plugin

    first, acks, plugin = run()
    assert not first.in_flight  # 'pending' is held in the file's hold, not in memory
    assert values(plugin) == [["2"]]
    c.advance(acks[-1])
    for m in first.members:  # run 1 died: the kernel released its file's lock
        fcntl.flock(m.ctx.output._file.fileno(), fcntl.LOCK_UN)  # type: ignore[attr-defined]
    c.sql("COMMIT PREPARED 'pending'")
    second, _, plugin = run()
    assert values(plugin) == [["1"]]
    assert not second.in_flight


def test_a_stream_prepared_transaction_sent_again_after_a_lost_connection_is_kept_once(
        case: Any) -> None:
    """A streaming plugin without two-phase callbacks got a transaction's blocks, then its
    Stream Prepare: it waits for COMMIT PREPARED. The connection is lost (Pipeline.reset)
    and the server streams the transaction again from its start (acknowledgement stopped
    at the PREPARE). The plugin must end with the transaction's rows once, not none."""
    c = case(two_phase=True)
    c.sql("BEGIN", "INSERT INTO {t} SELECT g FROM generate_series(1, 3000) g",
          "PREPARE TRANSACTION 'again'")
    sent = c.streamed_changes()
    assert any(item.data[:1] == b"p" for item in sent), "no Stream Prepare"
    plugin = StreamRecorder()
    pipeline = c.feed(plugin, items=sent)
    pipeline.reset()
    for item in sent:  # what a reconnect gets: the same again
        pipeline.feed(item.data, item.lsn)
    c.sql("COMMIT PREPARED 'again'")
    for item in c.streamed_changes()[len(sent):]:
        pipeline.feed(item.data, item.lsn)
    rows = [e for e in apply_streams(plugin.events) if e[0] == "change"]
    assert len(rows) == 3000
