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
