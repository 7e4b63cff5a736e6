"""A Spark session's setting held for a block: what the foreachBatch way in (a batch's
DataFrame made with Arrow kept, foreachbatch/lazyframe.py) and the MERGE INTO mirror (an
INSERT OVERWRITE in static mode, mirrors/mergeinto.py) both need."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["session_setting"]


@contextlib.contextmanager
def session_setting(spark: Any, key: str, value: str) -> Iterator[None]:
    """The session's ``key`` at ``value`` inside the block; as it was (set or not) after."""
    conf = spark.conf
    before = conf.get(key, None)
    conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            conf.unset(key)
        else:
            conf.set(key, before)
