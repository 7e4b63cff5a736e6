"""PostgreSQL's own text forms, shared by the emitters that reproduce its plugins' output."""

from __future__ import annotations

from datetime import datetime, tzinfo


def timestamptz_to_str(moment: datetime, zone: tzinfo) -> str:
    """timestamptz_to_str: ISO style in ``zone``, the fraction without trailing zeros, the
    offset as +HH[:MM[:SS]]."""
    local = moment.astimezone(zone)
    text = (f"{local.year:04d}-{local.month:02d}-{local.day:02d} "
            f"{local.hour:02d}:{local.minute:02d}:{local.second:02d}")
    if local.microsecond:
        text += "." + f"{local.microsecond:06d}".rstrip("0")
    offset = local.utcoffset()
    seconds = int(offset.total_seconds()) if offset is not None else 0
    sign = "-" if seconds < 0 else "+"
    minutes, secs = divmod(abs(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    text += f"{sign}{hours:02d}"
    if secs:
        text += f":{minutes:02d}:{secs:02d}"
    elif minutes:
        text += f":{minutes:02d}"
    return text


def quote_literal(text: str) -> str:
    """quote_literal_cstr: quotes and backslashes doubled, and an E prefix when there is a
    backslash."""
    quoted = "'" + text.replace("'", "''").replace("\\", "\\\\") + "'"
    return "E" + quoted if "\\" in text else quoted
