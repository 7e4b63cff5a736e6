"""The output-plugin callbacks: PostgreSQL's OutputPluginCallbacks, one row per callback.

Python names drop the C ``_cb`` suffix; parameters are the C ones minus the sizes and counts
that Python objects carry. These argument names are public API (pluggy calls by keyword).
"""

from __future__ import annotations

from typing import Final

# name -> argument names, in order
CALLBACK_ARGS: Final[dict[str, tuple[str, ...]]] = {
    "startup": ("ctx", "options", "is_init"),
    "shutdown": ("ctx",),
    "begin": ("ctx", "txn"),
    "change": ("ctx", "txn", "relation", "change"),
    "truncate": ("ctx", "txn", "relations", "change"),
    "commit": ("ctx", "txn", "commit_lsn"),
    "message": ("ctx", "txn", "message_lsn", "transactional", "prefix", "message"),
    "filter_by_origin": ("ctx", "origin"),
    "filter_prepare": ("ctx", "xid", "gid"),
    "begin_prepare": ("ctx", "txn"),
    "prepare": ("ctx", "txn", "prepare_lsn"),
    "commit_prepared": ("ctx", "txn", "commit_lsn"),
    "rollback_prepared": ("ctx", "txn", "prepare_end_lsn", "prepare_time"),
    "stream_start": ("ctx", "txn"),
    "stream_stop": ("ctx", "txn"),
    "stream_abort": ("ctx", "txn", "abort_lsn"),
    "stream_prepare": ("ctx", "txn", "prepare_lsn"),
    "stream_commit": ("ctx", "txn", "commit_lsn"),
    "stream_change": ("ctx", "txn", "relation", "change"),
    "stream_message": ("ctx", "txn", "message_lsn", "transactional", "prefix", "message"),
    "stream_truncate": ("ctx", "txn", "relations", "change"),
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

# The C member each callback is stored in, for messages in PostgreSQL's wording.
def c_name(name: str) -> str:
    return f"{name}_cb"
