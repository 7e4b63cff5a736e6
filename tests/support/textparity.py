"""The text emitter beside contrib/test_decoding, shared by test_emitter_text.py and
test_stream_prepare.py: a database with a test_decoding and a pgoutput slot over the same
WAL (``paired_slots``), each slot's lines for the same options (``server_lines``,
``our_lines``), and their comparison, allowing only the differences test_emitter_text.py
lists (``drop_empty_xacts``, ``assert_same``)."""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from emitters.text import TestDecodingEmitter
from plugin_framework import LSN, MemoryOutput, Pipeline
from plugin_framework.framework import Catalog
from support.capture import peek, pgoutput_options
from support.pgtest import create_database, drop_database
from support.recorders import with_fast_path


@dataclass(frozen=True)
class Line:
    lsn: LSN
    xid: int
    data: str


@dataclass
class Source:
    """A database holding a test_decoding slot and a pgoutput slot over the same WAL."""

    db: Any
    test_decoding: str
    pgoutput: str
    publication: str

    @property
    def proto(self) -> int:
        return 4 if self.db.major_version >= 16 else 3


def server_lines(source: Source, options: Mapping[str, str]) -> list[Line]:
    """test_decoding's rows for ``options``."""
    flat = [x for kv in options.items() for x in kv]
    with psycopg.connect(source.db.conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
            "VARIADIC %s::text[])", (source.test_decoding, flat)).fetchall()
    return [Line(LSN(lsn), int(xid or 0), data) for lsn, xid, data in rows]


class CountingCatalog(Catalog):
    """A Catalog that remembers the queries it was asked."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(conninfo)
        self.asked: list[tuple[str, tuple[Any, ...]]] = []

    def query(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        self.asked.append((sql, tuple(params)))
        return super().query(sql, params)


@dataclass
class Decoded:
    lines: list[Line]
    catalog: CountingCatalog | None


def our_lines(source: Source, options: Mapping[str, str | None], *, streaming: bool = False,
              catalog: bool = True, server_version: int | None = None,
              fast: Counter[str] | None = None, no_fast: bool = False) -> Decoded:
    """The text emitter's rows for ``options``, from the pgoutput slot; ``server_version``
    is put in the context, as a source that knows it (a capture's replay) would. ``fast``
    counts what the C fast path wrote and declined; ``no_fast``: every change through the
    Python change callback."""
    cat = CountingCatalog(source.db.conninfo) if catalog else None
    pipeline = Pipeline(proto_version=source.proto, catalog=cat)
    out = MemoryOutput()
    plugin: Any = TestDecodingEmitter()
    if fast is not None or no_fast:
        plugin = with_fast_path(plugin, Counter() if fast is None else fast, not no_fast)
    ctx = pipeline.add(plugin, options=options, output=out)
    if server_version is not None:
        ctx.server_version = server_version
    pipeline.startup()
    with psycopg.connect(source.db.conninfo, autocommit=True) as conn:
        captured = peek(conn, source.pgoutput, pgoutput_options(
            source.proto, streaming="on" if streaming else "off",
            publication=source.publication))
    for item in captured:
        pipeline.feed(item.data, item.lsn)
    assert not pipeline.in_flight
    pipeline.shutdown()
    if cat is not None:
        cat.close()
    return Decoded([Line(r.lsn, r.xid or 0, r.data.decode()) for r in out.records], cat)


_BEGIN = re.compile(r"BEGIN( \d+)?")


_COMMIT = re.compile(r"COMMIT( \d+)?( \(at .*\))?")


def drop_empty_xacts(lines: list[Line]) -> tuple[list[Line], int]:
    """test_decoding's output without its empty transactions (a BEGIN right before the
    COMMIT of the same xid), and how many there were."""
    kept: list[Line] = []
    dropped = 0
    for line in lines:
        if (kept and _COMMIT.fullmatch(line.data) and _BEGIN.fullmatch(kept[-1].data)
                and kept[-1].xid == line.xid):
            kept.pop()
            dropped += 1
            continue
        kept.append(line)
    return kept, dropped


def assert_same(ours: list[Line], theirs: list[Line], *, begin_lsn: bool) -> None:
    """Equal texts; equal LSNs and xids but where the plugins write at different places."""
    assert [x.data for x in ours] == [x.data for x in theirs]
    for mine, server in zip(ours, theirs, strict=True):
        same_lsn = begin_lsn or not _BEGIN.fullmatch(mine.data)
        same_xid = True
        if mine.data.startswith("message: transactional: 0 "):
            # pgoutput does not say in which transaction, if any, a non-transactional
            # message was emitted: ours has no xid, test_decoding's that transaction's
            same_xid = mine.xid != 0
        assert (mine.lsn == server.lsn) or not same_lsn, (mine, server)
        assert (mine.xid == server.xid) or not same_xid, (mine, server)


@contextlib.contextmanager
def paired_slots(pg: Any, schema: str, prefix: str, publication: str, *,
                 two_phase: bool = False) -> Iterator[Source]:
    """A new database with ``schema``, then a test_decoding and a pgoutput slot, made before
    anything else happens in it (so both see the same changes); dropped afterwards."""
    db = create_database(pg)
    try:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            conn.execute(schema)
            for plugin, suffix in [("test_decoding", "td"), ("pgoutput", "po")]:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, %s, false, %s)",
                             (f"{prefix}_{suffix}", plugin, two_phase))
        yield Source(db, f"{prefix}_td", f"{prefix}_po", publication)
    finally:
        drop_database(db)
