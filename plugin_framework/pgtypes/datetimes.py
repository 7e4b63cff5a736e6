"""Dates, times, timestamps and intervals as text: the server's text as ISO 8601 (the JSON
forms), their send format as the server's text, and timestamptz_to_str.

The one place pgdecode formats a date or a time as text. (The protocol layer's wire
timestamps, microseconds since 2000-01-01, become datetimes in protocol/pgtime.py.)
"""

from __future__ import annotations

import re
import struct
from datetime import datetime, tzinfo
from typing import Final

__all__ = [
    "b_date_text",
    "b_interval_iso",
    "b_time_text",
    "b_timestamp_text",
    "b_timestamptz_text",
    "b_timetz_text",
    "civil_date",
    "civil_days",
    "epoch_days",
    "epoch_micros",
    "interval_parts",
    "iso_interval",
    "t_interval",
    "t_timestamp",
    "t_timestamptz",
    "t_timetz",
    "time_micros",
    "time_text",
    "timestamptz_to_str",
    "trunc_divmod",
]

_i32, _i64 = struct.Struct("!i"), struct.Struct("!q")
_INT32_MAX, _INT32_MIN = 2**31 - 1, -(2**31)
_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)
_PG_EPOCH_DAYS: Final = 10957  # 2000-01-01 - 1970-01-01
_DAY_US: Final = 86_400_000_000

# --- text format: the server's text -> ISO 8601 -----------------------------------------------


def _iso_datetime(raw: bytes) -> str | None:
    """``2024-01-02 03:04:05`` -> ``2024-01-02T03:04:05``; None if not an ISO DateStyle text
    of a year AD (infinity, BC, other DateStyles stay as the server wrote them)."""
    if raw[4:5] == b"-" and raw[10:11] == b" " and raw[-1] != 67:
        # The common case, quickly: ISO, a four-digit year AD, the time after position 10
        return raw.replace(b" ", b"T", 1).decode()
    sp = raw.find(b" ")
    if sp < 8 or raw[sp - 3] != 45 or raw[-1] == 67:  # '-' before the day; "... BC"
        return None
    text = raw.decode()
    return text[:sp] + "T" + text[sp + 1:]


def t_timestamp(raw: bytes) -> str:
    text = _iso_datetime(raw)
    return raw.decode() if text is None else text


def t_timestamptz(raw: bytes) -> str:
    text = _iso_datetime(raw)
    if text is None:
        return raw.decode()
    return text + ":00" if text[-3] in "+-" else text  # "+02" -> "+02:00"


def t_timetz(raw: bytes) -> str:
    text = raw.decode()
    return text + ":00" if text[-3] in "+-" else text


_INTERVAL_UNITS: Final = {"year": 12, "years": 12, "mon": 1, "mons": 1}
_INTERVAL_TIME: Final = re.compile(r"([+-]?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


def t_interval(raw: bytes) -> str:
    """PostgreSQL's default (``postgres``) interval text as IntervalStyle ``iso_8601`` would
    print it; any other text (other IntervalStyles, infinity) as the server wrote it."""
    text = raw.decode()
    parts = interval_parts(text)
    return text if parts is None else iso_interval(*parts)


def interval_parts(text: str) -> tuple[int, int, int] | None:
    """The months, days and microseconds of an interval in PostgreSQL's default
    (``postgres``) IntervalStyle; None for any other text (other styles, infinity)."""
    months = days = micros = 0
    parts = text.split(" ")
    i = 0
    try:
        while i < len(parts):
            part = parts[i]
            if ":" in part:
                m = _INTERVAL_TIME.fullmatch(part)
                if m is None:
                    return None
                value = ((int(m[2]) * 60 + int(m[3])) * 60 + int(m[4])) * 1_000_000
                value += int((m[5] or "0").ljust(6, "0"))
                micros += -value if m[1] == "-" else value
                i += 1
                continue
            number, unit = int(part), parts[i + 1]
            if unit in ("day", "days"):
                days += number
            else:
                months += number * _INTERVAL_UNITS[unit]
            i += 2
    except (ValueError, KeyError, IndexError):
        return None
    return months, days, micros


# --- the server's text -> numbers: days and microseconds from 1970-01-01 ------------------------

_ISO_DATE: Final = re.compile(r"(\d{4,})-(\d\d)-(\d\d)")
_ISO_TIME: Final = re.compile(
    r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?")


def epoch_days(text: str) -> int | None:
    """A date's text (DateStyle ISO, ``YYYY-MM-DD[ BC]``) as days from 1970-01-01; None for
    infinity or any other text."""
    bc = text.endswith(" BC")
    m = _ISO_DATE.fullmatch(text[:-3] if bc else text)
    if m is None:
        return None
    year = int(m[1])
    return civil_days(1 - year if bc else year, int(m[2]), int(m[3]))


def time_micros(text: str) -> tuple[int, int | None] | None:
    """A time's or timetz's text as microseconds from midnight, and its UTC offset in seconds
    east (None: a time without zone); None for any other text."""
    m = _ISO_TIME.fullmatch(text)
    if m is None:
        return None
    micros = ((int(m[1]) * 60 + int(m[2])) * 60 + int(m[3])) * 1_000_000
    micros += int((m[4] or "0").ljust(6, "0"))
    if m[5] is None:
        return micros, None
    offset = (int(m[6]) * 60 + int(m[7] or 0)) * 60 + int(m[8] or 0)
    return micros, -offset if m[5] == "-" else offset


def epoch_micros(text: str) -> int | None:
    """A timestamp's or timestamptz's text (DateStyle ISO) as microseconds from 1970-01-01
    (a timestamptz's in UTC); None for infinity or any other text."""
    bc = text.endswith(" BC")
    if bc:
        text = text[:-3]
    date, _, clock = text.partition(" ")
    days = epoch_days(date + " BC" if bc else date)
    parts = time_micros(clock)
    if days is None or parts is None:
        return None
    micros, offset = parts
    return days * _DAY_US + micros - (offset or 0) * 1_000_000


def trunc_divmod(a: int, b: int) -> tuple[int, int]:
    """C's integer division and remainder (truncating toward zero)."""
    q = abs(a) // b
    q = -q if a < 0 else q
    return q, a - q * b


def iso_interval(months: int, days: int, micros: int) -> str:
    """An interval as PostgreSQL prints it with IntervalStyle ``iso_8601`` (EncodeInterval)."""
    year, mon = trunc_divmod(months, 12)
    hour, rest = trunc_divmod(micros, 3_600_000_000)
    minute, rest = trunc_divmod(rest, 60_000_000)
    sec, fsec = trunc_divmod(rest, 1_000_000)
    if not (year or mon or days or hour or minute or sec or fsec):
        return "PT0S"
    out = ["P"]
    for value, unit in ((year, "Y"), (mon, "M"), (days, "D")):
        if value:
            out.append(f"{value}{unit}")
    if hour or minute or sec or fsec:
        out.append("T")
    for value, unit in ((hour, "H"), (minute, "M")):
        if value:
            out.append(f"{value}{unit}")
    if sec or fsec:
        if sec < 0 or fsec < 0:
            out.append("-")
        out.append(str(abs(sec)))
        if fsec:
            out.append("." + f"{abs(fsec):06d}".rstrip("0"))
        out.append("S")
    return "".join(out)


# --- binary format: the send format -> the server's text --------------------------------------


def civil_date(days: int) -> tuple[int, int, int]:
    """Year, month, day of a day count from 1970-01-01, proleptic Gregorian, year 0 = 1 BC."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def civil_days(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 of a proleptic Gregorian date, year 0 = 1 BC (civil_date's inverse)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _date_parts(days: int) -> tuple[str, bool]:
    """A PostgreSQL date (days from 2000-01-01) as ``YYYY-MM-DD`` and whether it is BC."""
    y, m, d = civil_date(days + _PG_EPOCH_DAYS)
    bc = y <= 0
    return f"{1 - y if bc else y:04d}-{m:02d}-{d:02d}", bc


def time_text(us: int) -> str:
    """Microseconds of the day as ``HH:MM:SS``, the fraction without trailing zeros."""
    sec, frac = divmod(us, 1_000_000)
    minute, sec = divmod(sec, 60)
    hour, minute = divmod(minute, 60)
    text = f"{hour:02d}:{minute:02d}:{sec:02d}"
    return text + "." + f"{frac:06d}".rstrip("0") if frac else text


def _offset_text(seconds_east: int) -> str:
    sign = "-" if seconds_east < 0 else "+"
    minutes, sec = divmod(abs(seconds_east), 60)
    hour, minute = divmod(minutes, 60)
    text = f"{sign}{hour:02d}"
    if minute or sec:
        text += f":{minute:02d}"
    if sec:
        text += f":{sec:02d}"
    return text


def b_date_text(raw: bytes) -> str:
    (days,) = _i32.unpack(raw)
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    text, bc = _date_parts(days)
    return text + " BC" if bc else text


def _timestamp_text(raw: bytes, zone: str) -> str:
    (us,) = _i64.unpack(raw)
    if us == _INT64_MAX:
        return "infinity"
    if us == _INT64_MIN:
        return "-infinity"
    days, us = divmod(us, _DAY_US)
    date, bc = _date_parts(days)
    text = f"{date} {time_text(us)}{zone}"
    return text + " BC" if bc else text


def b_timestamp_text(raw: bytes) -> str:
    return _timestamp_text(raw, "")


def b_timestamptz_text(raw: bytes) -> str:
    """In UTC: the binary format carries no time zone."""
    return _timestamp_text(raw, "+00")


def b_time_text(raw: bytes) -> str:
    return time_text(_i64.unpack(raw)[0])


def b_timetz_text(raw: bytes) -> str:
    us, zone = struct.unpack("!qi", raw)
    return time_text(us) + _offset_text(-zone)


def b_interval_iso(raw: bytes) -> str:
    us, days, months = struct.unpack("!qii", raw)
    if us == _INT64_MAX and days == _INT32_MAX and months == _INT32_MAX:
        return "infinity"
    if us == _INT64_MIN and days == _INT32_MIN and months == _INT32_MIN:
        return "-infinity"
    return iso_interval(months, days, us)


# --- datetimes as the server prints them ----------------------------------------------------

def timestamptz_to_str(moment: datetime, zone: tzinfo) -> str:
    """timestamptz_to_str: ISO style in ``zone``, the fraction without trailing zeros, the
    offset as +HH[:MM[:SS]]."""
    local = moment.astimezone(zone)
    offset = local.utcoffset()
    seconds = (local.hour * 60 + local.minute) * 60 + local.second
    return (f"{local.year:04d}-{local.month:02d}-{local.day:02d} "
            f"{time_text(seconds * 1_000_000 + local.microsecond)}"
            f"{_offset_text(int(offset.total_seconds()) if offset is not None else 0)}")
