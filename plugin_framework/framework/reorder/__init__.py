"""The reorder buffer: PostgreSQL's reorderbuffer.c for a pgoutput stream, split by job.

- ``pipeline``: ``Pipeline`` (the ReorderBuffer): set-up, input, the messages of a stream
  block or a transaction alike.
- ``members``: each plugin with its context, its callbacks called with PostgreSQL's error
  context (``CallbackError``).
- ``txn``: ``TxnState``, the buffer's part of a transaction being received.
- ``buffer``: the buffer's state and the lookups every job shares.
- ``acknowledge``: marks, flushes, what each plugin already had, the end of a transaction.
- ``transactions``: BEGIN and COMMIT, who gets a transaction live, the fast path.
- ``twophase``: PREPARE, COMMIT PREPARED, ROLLBACK PREPARED.
- ``streams``: stream blocks, Stream Abort, Stream Commit, Stream Prepare.
- ``replay``: delivering a held transaction from its spool.

Each job is a class built on the jobs it uses; ``Pipeline`` is all of them.
"""

from __future__ import annotations

from plugin_framework.framework.reorder.buffer import DEFAULT_MEMORY_LIMIT
from plugin_framework.framework.reorder.members import CallbackError, Member
from plugin_framework.framework.reorder.pipeline import Pipeline
from plugin_framework.framework.reorder.txn import PipelineError

__all__ = ["DEFAULT_MEMORY_LIMIT", "CallbackError", "Member", "Pipeline", "PipelineError"]
