"""The spool of held transactions (plugin_framework/framework/spool.py): what goes in comes
out in order, whatever of it went to disk; the memory budget, shared by a pipeline's spools,
is never exceeded and counts the entries' real size; closing gives everything back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from plugin_framework.framework.spool import Spool, SpoolBudget
from plugin_framework.protocol import LSN

entries = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
                             st.booleans(), st.binary(max_size=300)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.lists(entries, min_size=1, max_size=3), st.integers(0, 4000))
def test_entries_come_back_in_order_within_the_budget(spools: list[list[tuple[int, int, bool,
                                                                              bytes]]],
                                                      limit: int) -> None:
    budget = SpoolBudget(limit)
    made = [Spool(budget) for _ in spools]
    # appended in turns, as the changes of concurrent transactions arrive
    for turn in range(max(len(e) for e in spools)):
        for spool, items in zip(made, spools, strict=True):
            if turn < len(items):
                lsn, xid, in_stream, raw = items[turn]
                spool.append(LSN(lsn), xid, in_stream, raw)
                assert budget.used <= limit
    in_memory = sum(len(s._memory) for s in made)
    assert budget.used == in_memory  # what the budget counts is what memory holds
    assert budget.spooled_bytes == sum(len(raw) for items in spools for *_, raw in items)
    for spool, items in zip(made, spools, strict=True):
        assert [(int(lsn), xid, in_stream, raw) for lsn, xid, in_stream, raw in spool] == \
            items
        assert spool.count == len(items)
        assert [e[3] for e in spool] == [e[3] for e in spool]  # read again: the same
    for spool in made:
        spool.close()
    assert budget.used == 0 and budget.on_disk == 0


# --- runs: entries appended a run at a time and read back a run at a time ----------------------

def _entry_of(lsn: int, xid: int, in_stream: bool, kind: int, tag: bytes, relid: int,
              body: bytes) -> tuple[int, int, bool, bytes]:
    """A spool entry: a row change of one of two relations (a streamed one with an xid
    first), which make runs; another message, which ends them; or a change too short for
    its ids."""
    if kind == 0:
        raw = tag + (b"\0\0\0\x07" if in_stream else b"") + relid.to_bytes(4, "big") + body
    elif kind == 1:
        raw = b"R" + body
    else:
        raw = (tag + body)[:6]
    return lsn, xid, in_stream, raw


_entry = st.builds(_entry_of, st.integers(0, 2**64 - 1), st.sampled_from([0, 7, 9]),
                   st.booleans(), st.sampled_from([0, 0, 0, 1, 2]),
                   st.sampled_from([b"I", b"U", b"D"]), st.sampled_from([16384, 16390]),
                   st.binary(max_size=20))
# appended one by one (a list of one) or as a run (the xid and in_stream of its first)
_appends = st.lists(st.lists(_entry, min_size=1, max_size=8), max_size=12)


def _fill(appends: list[list[tuple[int, int, bool, bytes]]], limit: int) -> tuple[Spool, list[
        tuple[int, int, bool, bytes]]]:
    spool = Spool(SpoolBudget(limit))
    expected = []
    for group in appends:
        if len(group) == 1:
            lsn, xid, in_stream, raw = group[0]
            spool.append(LSN(lsn), xid, in_stream, raw)
            expected.append(group[0])
        else:
            _, xid, in_stream, _ = group[0]
            spool.append_run([LSN(e[0]) for e in group], xid, in_stream, [e[3] for e in group])
            expected += [(e[0], xid, in_stream, e[3]) for e in group]
    return spool, expected


@settings(max_examples=150, deadline=None)
@given(_appends, st.integers(0, 600), st.sampled_from([7, 64, 1 << 20]))
def test_runs_read_back_every_entry_in_order(appends: list[list[tuple[int, int, bool, bytes]]],
                                            limit: int, block: int) -> None:
    """Spool.runs gives the entries __iter__ gives, in order, whatever is on disk and however
    the blocks it reads cut them; each run is one relation's row changes of one xid and
    in_stream, and ends where the next entry could not extend it, or where a block ends;
    with ``strip``, a run's streamed changes lack their xid."""
    from plugin_framework.framework import spool as spool_module

    saved = spool_module._READ_BLOCK
    spool_module._READ_BLOCK = block
    try:
        spool, expected = _fill(appends, limit)
        assert [(int(e[0]), e[1], e[2], e[3]) for e in spool] == expected
        assert spool.count == len(expected)
        whole = block == 1 << 20 and spool._file is None  # no block cuts a run
        runs = list(spool.runs(strip=False))
        stripped = list(spool.runs(strip=True))
    finally:
        spool_module._READ_BLOCK = saved
    flat = [(int(lsn), xid, in_stream, raw) for datas, lsns, xid, in_stream, _, _ in runs
            for lsn, raw in zip(lsns, datas, strict=True)]
    assert flat == expected
    at = 0
    for (datas, _, xid, in_stream, is_run, _), (cut, *_) in zip(runs, stripped, strict=True):
        skip = 4 * in_stream
        changes = [len(r) >= 5 + skip and r[:1] in (b"I", b"U", b"D") for r in datas]
        assert changes == [is_run] * len(datas)
        assert is_run or len(datas) == 1
        if is_run:
            assert len({r[1 + skip:5 + skip] for r in datas}) == 1
            assert cut == [r[:1] + r[1 + skip:] for r in datas]
        at += len(datas)
        if whole and is_run and at < len(expected):  # the next one does not continue it
            _, next_xid, next_in_stream, raw = expected[at]
            assert not (next_xid == xid and next_in_stream == in_stream
                        and len(raw) >= 5 + skip and raw[:1] in (b"I", b"U", b"D")
                        and raw[1 + skip:5 + skip] == datas[0][1 + skip:5 + skip])
    spool.close()


@settings(max_examples=100, deadline=None)
@given(_appends)
def test_c_spool_packing_equals_the_python_one(appends: list[list[tuple[int, int, bool,
                                                                        bytes]]]) -> None:
    from plugin_framework.framework import spool as spool_module

    c = spool_module._spool
    if c is None:
        return  # (the native marker's test below says whether it is built)
    for group in appends:
        _, xid, in_stream, _ = group[0]
        lsns, raws = [LSN(e[0]) for e in group], [e[3] for e in group]
        assert c.pack_entries(lsns, xid, in_stream, raws) == \
            spool_module.pack_entries_py(lsns, xid, in_stream, raws)


@settings(max_examples=200, deadline=None)
@given(_appends, st.binary(max_size=30), st.integers(0, 40), st.integers(0, 400),
       st.booleans())
def test_c_run_reader_equals_the_python_one(appends: list[list[tuple[int, int, bool, bytes]]],
                                           tail: bytes, pos: int, cut: int,
                                           strip: bool) -> None:
    """On packed entries, cut anywhere and followed by anything: the same run."""
    from plugin_framework.framework import spool as spool_module

    c = spool_module._spool
    if c is None:
        return
    buf = b"".join(spool_module.pack_entries_py([LSN(e[0]) for e in g], g[0][1], g[0][2],
                                                [e[3] for e in g]) for g in appends) + tail
    end = len(buf) - cut
    pos = min(pos, len(buf))
    assert c.read_run(buf, pos, end, strip, spool_module.wire_lsn) == \
        spool_module.read_run_py(buf, pos, end, strip)
    whole = bytearray(buf)
    assert c.read_run(whole, 0, len(buf), strip, spool_module.wire_lsn) == \
        spool_module.read_run_py(buf, 0, len(buf), strip)


def test_the_c_spool_codec_is_built() -> None:
    import pytest

    from plugin_framework._native import impl
    from plugin_framework.framework import spool as spool_module

    if impl() == "python":
        pytest.skip("PGDECODE_IMPL=python: no C module runs")
    assert spool_module._spool is not None
