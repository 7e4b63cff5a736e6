"""How an incremental snapshot takes the requests for a table (``pgdecode snapshot
--table``, a mirror's read again after an ALTER TABLE or for unknown TOAST values), server-free:
a request is for every row as it is from then on, so rows a read under way (or one to
resume) copied before it are read again; and a request message read again after a restart
is not taken twice."""

from __future__ import annotations

import pytest

from plugin_framework import LSN, Pipeline
from plugin_framework.framework.statecheck import Damage, check_incremental
from plugin_framework.protocol import LogicalMessage, encode
from plugin_framework.sources.snapshots.catalog import TableCopy, key_from_text
from plugin_framework.sources.snapshots.incremental import IncrementalSnapshot
from plugin_framework.sources.snapshots.requests import PREFIX, request_body
from plugin_framework.sources.snapshots.window import TableRead

SLOT = "lake"
K = "public.k"


def snapshot() -> IncrementalSnapshot:
    pipeline = Pipeline(proto_version=1)
    pipeline.startup()
    return IncrementalSnapshot("host=unused", SLOT, ["pub"], pipeline, proto_version=1)


def reading_k(after: str | None) -> TableRead:
    """Table k's read, after key ``after``: what the snapshot takes up when k's turn comes."""
    copy = TableCopy(relid=16400, schema="public", name="k", partitioned=False,
                     columns=["id", "v"], row_filter=None, key=["id"], key_types=["integer"])
    return TableRead(copy, None if after is None else key_from_text([after]))


def request_message(table: str, request_id: str | None = None) -> bytes:
    """The message ``pgdecode snapshot`` (or a mirror's ``ask``) writes into the WAL."""
    body = request_body(SLOT, table, request_id=request_id)
    return encode(LogicalMessage(False, LSN(0), PREFIX, body.encode()))


def test_a_table_asked_for_while_it_is_read_is_read_again_whole() -> None:
    """An initial copy cut short went on as an incremental snapshot of k after key 5000; an
    ALTER TABLE then asks for k: the rows up to 5000 were copied before it, so once the read
    under way is done, k is read again from its first key."""
    snap = snapshot()
    snap.current = reading_k("5000")
    snap.request(K)
    assert snap.queue == [K]
    state = snap.progress()
    assert state is not None
    again = snapshot()  # after a restart: the read under way goes on, then the whole table
    again.resume(state)
    assert again.queue == [K, K]
    assert again.resume_after == {K: key_from_text(["5000"])}  # (the first one's)


def test_a_table_waiting_to_resume_after_a_key_is_read_whole_once_asked_for() -> None:
    snap = snapshot()
    snap.resume({"slot": SLOT, "queue": [K], "done": [], "after": {K: ["5000"]},
                 "ranges": {"public.f": [[None, ["10"]], [["20"], None]]}})
    snap.request(K)
    snap.request("public.f")
    assert snap.queue == [K, "public.f"]
    assert snap.resume_after == {} and snap.resume_ranges == {}


def test_a_request_read_again_after_a_restart_is_not_taken_twice() -> None:
    """The progress an output recorded holds the requests taken up to then; the stream
    resumed from it reads their messages again, and takes only the later ones."""
    snap = snapshot()
    assert snap.intercept(request_message(K), LSN(0x1000))
    snap.current, snap.queue = reading_k(None), []  # k's turn (what the next step does)
    state = snap.progress()
    assert state is not None

    again = snapshot()
    again.resume(state)
    again.current, again.queue = reading_k(None), []
    assert again.intercept(request_message(K), LSN(0x1000))  # ours, and taken already
    assert again.queue == []
    assert again.intercept(request_message(K), LSN(0x2000))  # a new one
    assert again.queue == [K]


def test_a_request_of_its_own_read_back_after_a_restart_is_not_taken_again() -> None:
    """A mirror's own request (``ask``: taken at once, and written as a message) whose
    message the stream had not read when it stopped: the restart reads it, and does not
    queue the table a second time."""
    snap = snapshot()
    snap.handled.add("r1")  # what ask() does besides writing the message
    snap.request(K)
    snap.current, snap.queue = reading_k("100"), []  # k's turn
    state = snap.progress()
    assert state is not None

    again = snapshot()
    again.resume(state)
    again.current, again.queue = reading_k("100"), []
    assert again.intercept(request_message(K, "r1"), LSN(0x3000))
    assert again.queue == []
    after = again.progress()
    assert after is not None and "asked" not in after
    assert again.intercept(request_message(K, "r2"), LSN(0x4000))  # someone else's
    assert again.queue == [K]


def test_a_table_of_the_command_line_goes_on_where_it_was_after_a_restart() -> None:
    """``--snapshot-table k`` in the command run again after a restart: k's read goes on
    after the last key delivered, not from its first key again."""
    snap = snapshot()
    snap.resume({"slot": SLOT, "queue": [K], "done": [], "after": {K: ["5000"]}})
    snap.include(K)
    assert snap.queue == [K]
    assert snap.resume_after == {K: key_from_text(["5000"])}
    snap.current, snap.queue = reading_k("6000"), []
    snap.include(K)
    assert snap.queue == []


def test_the_record_of_a_table_read_again_is_checked_as_such() -> None:
    """The progress record's check (statecheck.py) takes a table under way and queued again,
    and refuses one queued twice after it, or three times."""
    record = {"slot": SLOT, "table": K, "queue": [K], "done": [], "after": {K: ["5000"]},
              "requests_lsn": "0/1000"}
    assert check_incremental(record) == record
    for queue in ([K, K], ["public.f", "public.f"]):
        with pytest.raises(Damage, match="more than once"):
            check_incremental({**record, "queue": queue})
    with pytest.raises(Damage, match="requests_lsn"):
        check_incremental({**record, "requests_lsn": "0/01000"})
