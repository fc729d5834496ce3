"""How a policy file writes days and times of day (its `windows`).

PyYAML reads an unquoted 20:00 as the base-60 number 1200; a clock time takes that back.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_SETS = {"weekdays": DAYS[:5], "weekends": DAYS[5:], "daily": DAYS}


def _clock_time(value: Any) -> Any:
    # PyYAML reads an unquoted 20:00 as the base-60 number 1200: take it back as a time.
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1440:
        return f"{value // 60:02d}:{value % 60:02d}"
    return value


def day_list(value: Any) -> Any:
    """`weekdays`, `weekends`, `daily` or one day name as the list of days it means."""
    if isinstance(value, str):
        return list(DAY_SETS.get(value.lower(), (value,)))
    return value


def _check_clock(value: str) -> str:
    if not re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]|24:00", value):
        raise ValueError(f"expected a time HH:MM from 00:00 to 24:00, got {value!r}")
    return value


def _check_day(value: str) -> str:
    if value not in DAYS:
        raise ValueError(f"expected mon..sun, weekdays, weekends or daily, got {value!r}")
    return value


ClockTime = Annotated[str, BeforeValidator(_clock_time), AfterValidator(_check_clock)]
DayName = Annotated[str, AfterValidator(_check_day)]


def seconds(hhmm: str) -> int:
    """Seconds after midnight of a checked "HH:MM"."""
    hours, minutes = (int(part) for part in hhmm.split(":"))
    return hours * 3600 + minutes * 60


def clock(after_midnight: int) -> str:
    """ "HH:MM" of a number of seconds after midnight."""
    return f"{after_midnight // 3600:02d}:{after_midnight % 3600 // 60:02d}"
