"""PostgreSQL timestamps: microseconds since 2000-01-01 00:00 UTC, as aware datetimes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MIN_US = int((datetime(1, 1, 1, tzinfo=UTC) - PG_EPOCH) / timedelta(microseconds=1))
_MAX_US = int((datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - PG_EPOCH)
              / timedelta(microseconds=1))


def from_pg_micros(micros: int) -> datetime:
    """The aware UTC datetime of a PostgreSQL ``TimestampTz``.

    Raises ValueError for values Python's datetime cannot hold (PostgreSQL's range is wider).
    """
    if not _MIN_US <= micros <= _MAX_US:
        raise ValueError(
            f"timestamp {micros} us from 2000-01-01 is outside Python's datetime range"
        )
    return PG_EPOCH + timedelta(microseconds=micros)


def to_pg_micros(moment: datetime) -> int:
    """Microseconds since the PostgreSQL epoch of an aware datetime."""
    if moment.tzinfo is None:
        raise ValueError("PostgreSQL timestamps need an aware datetime (tzinfo set)")
    return (moment - PG_EPOCH) // timedelta(microseconds=1)
