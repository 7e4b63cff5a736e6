"""The output-plugin callbacks: PostgreSQL's OutputPluginCallbacks (output_plugin.h), one row
per callback, and the one table the rest of pgdecode reads them from.

Python names drop the C ``_cb`` suffix; parameters are the C ones minus the sizes and counts
that Python objects carry. These argument names are public API (pluggy calls by keyword);
hookspecs.py documents each, and a test holds it to this table.

What ``_PG_output_plugin_init`` fills in C (an OutputPluginCallbacks struct) is here a
plugin's methods or ``@hookimpl`` functions, resolved by ``LoadedPlugin`` (plugin.py).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Callback(NamedTuple):
    """One callback: its arguments, and its member and typedef in output_plugin.h (None
    for pgdecode's own, which have no C counterpart)."""

    args: tuple[str, ...]
    c_member: str | None
    c_type: str | None


CALLBACK_TABLE: Final[dict[str, Callback]] = {
    "startup": Callback(("ctx", "options", "is_init"),
                        "startup_cb", "LogicalDecodeStartupCB"),
    "shutdown": Callback(("ctx",), "shutdown_cb", "LogicalDecodeShutdownCB"),
    "begin": Callback(("ctx", "txn"), "begin_cb", "LogicalDecodeBeginCB"),
    "change": Callback(("ctx", "txn", "relation", "change"),
                       "change_cb", "LogicalDecodeChangeCB"),
    "truncate": Callback(("ctx", "txn", "relations", "change"),
                         "truncate_cb", "LogicalDecodeTruncateCB"),
    "commit": Callback(("ctx", "txn", "commit_lsn"), "commit_cb", "LogicalDecodeCommitCB"),
    "message": Callback(("ctx", "txn", "message_lsn", "transactional", "prefix", "message"),
                        "message_cb", "LogicalDecodeMessageCB"),
    "filter_by_origin": Callback(("ctx", "origin"),
                                 "filter_by_origin_cb", "LogicalDecodeFilterByOriginCB"),
    "filter_prepare": Callback(("ctx", "xid", "gid"),
                               "filter_prepare_cb", "LogicalDecodeFilterPrepareCB"),
    "begin_prepare": Callback(("ctx", "txn"),
                              "begin_prepare_cb", "LogicalDecodeBeginPrepareCB"),
    "prepare": Callback(("ctx", "txn", "prepare_lsn"), "prepare_cb", "LogicalDecodePrepareCB"),
    "commit_prepared": Callback(("ctx", "txn", "commit_lsn"),
                                "commit_prepared_cb", "LogicalDecodeCommitPreparedCB"),
    "rollback_prepared": Callback(("ctx", "txn", "prepare_end_lsn", "prepare_time"),
                                  "rollback_prepared_cb", "LogicalDecodeRollbackPreparedCB"),
    "stream_start": Callback(("ctx", "txn"), "stream_start_cb", "LogicalDecodeStreamStartCB"),
    "stream_stop": Callback(("ctx", "txn"), "stream_stop_cb", "LogicalDecodeStreamStopCB"),
    "stream_abort": Callback(("ctx", "txn", "abort_lsn"),
                             "stream_abort_cb", "LogicalDecodeStreamAbortCB"),
    "stream_prepare": Callback(("ctx", "txn", "prepare_lsn"),
                               "stream_prepare_cb", "LogicalDecodeStreamPrepareCB"),
    "stream_commit": Callback(("ctx", "txn", "commit_lsn"),
                              "stream_commit_cb", "LogicalDecodeStreamCommitCB"),
    "stream_change": Callback(("ctx", "txn", "relation", "change"),
                              "stream_change_cb", "LogicalDecodeStreamChangeCB"),
    "stream_message": Callback(("ctx", "txn", "message_lsn", "transactional", "prefix",
                                "message"),
                               "stream_message_cb", "LogicalDecodeStreamMessageCB"),
    "stream_truncate": Callback(("ctx", "txn", "relations", "change"),
                                "stream_truncate_cb", "LogicalDecodeStreamTruncateCB"),
    # pgdecode's own, no C counterpart: a formatter of a relation's raw row changes that the
    # pipeline may use instead of decoding them and calling change (see hookspecs.py)
    "fast_change": Callback(("ctx", "relation"), None, None),
}

# name -> argument names, in order
CALLBACK_ARGS: Final[dict[str, tuple[str, ...]]] = {
    name: cb.args for name, cb in CALLBACK_TABLE.items()
}

CALLBACKS: Final = frozenset(CALLBACK_ARGS)

REQUIRED: Final = ("begin", "change", "commit")

# Having any of these makes a plugin streaming-capable, which then requires all of STREAM_REQUIRED.
STREAM_CALLBACKS: Final = frozenset(
    {"stream_start", "stream_stop", "stream_abort", "stream_commit", "stream_change",
     "stream_message", "stream_truncate", "stream_prepare"}
)
STREAM_REQUIRED: Final = ("stream_start", "stream_stop", "stream_abort", "stream_commit",
                          "stream_change")

# Having any of these makes a plugin two-phase-capable, which requires all of TWO_PHASE_REQUIRED.
TWO_PHASE_CALLBACKS: Final = frozenset(
    {"filter_prepare", "begin_prepare", "prepare", "commit_prepared", "rollback_prepared"}
)
TWO_PHASE_REQUIRED: Final = ("begin_prepare", "prepare", "commit_prepared", "rollback_prepared")


def c_name(name: str) -> str:
    """The OutputPluginCallbacks member a callback is stored in, for messages in
    PostgreSQL's wording (``stream_abort`` -> ``stream_abort_cb``)."""
    member = CALLBACK_TABLE[name].c_member
    assert member is not None, f"{name} has no C counterpart"
    return member
