"""What every mirror knows of the streaming query whose batches it takes: batch ids are a
query's own, so ``query_of`` names the query of a batch, and a mirror refuses a batch id its
target holds from another query (``OtherQueryError``) rather than skip it."""

from __future__ import annotations

from typing import Any

__all__ = ["OtherQueryError", "query_of"]


# the local properties that name the streaming query a batch is of: Spark's (kept in the
# query's checkpoint), and ForeachBatchStream's (foreachbatch/batching.py, its checkpoint's id)
QUERY_PROPERTIES = ("sql.streaming.queryId", "pgdecode.queryId")


class OtherQueryError(RuntimeError):
    """A batch that a target holds the id of already, from another streaming query: taken
    for that one, it would be skipped."""


def query_of(df: Any) -> str | None:
    """The streaming query that batch ``df`` is of (None: not known, as under Spark Connect
    or for a call by hand)."""
    try:
        context = df.sparkSession.sparkContext
        values = [context.getLocalProperty(key) for key in QUERY_PROPERTIES]
    except Exception:  # Spark Connect has no SparkContext
        return None
    return next((v for v in values if v), None)
