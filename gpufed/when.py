"""A time a person types on the command line, read one way everywhere: `gpufed usage --since`
and `--until`, `gpufed policy show --at`, `gpufed replay --start`.

`now`; unix seconds; an ISO 8601 date or time, in UTC unless it names its offset (the hub,
its policy windows and its reports all count in UTC or a zone they name, never the zone of
the machine the command runs on); or an age, `90m`, `2h`, `7d`, `1w`, meaning that long ago.
A length of time (`gpufed token create --ttl`) is seconds or the same `30d` form.
Pure: the caller gives `now`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

#: An age's units, in seconds.
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: Instants a calendar can name (and the policy's windows look a day back and a week ahead).
_EARLIEST = datetime(2, 1, 1, tzinfo=UTC).timestamp()
_LATEST = datetime(9998, 12, 31, tzinfo=UTC).timestamp()


def parse_when(text: str, now: float) -> float:
    """Unix seconds for `text` (see the module); ValueError saying what to give instead."""
    text = text.strip()
    if text.lower() == "now":
        return now
    if text[-1:] in AGE_UNITS and text[:-1].replace(".", "", 1).isdigit():
        instant = now - float(text[:-1]) * AGE_UNITS[text[-1]]
    else:
        try:
            instant = float(text)
        except ValueError:
            instant = _iso(text)
    if math.isnan(instant) or not _EARLIEST <= instant <= _LATEST:
        raise ValueError(f"the time {text!r} is not between the years 2 and 9998")
    return instant


def parse_duration(text: str) -> float:
    """Seconds for a length of time: seconds (`86400`) or an age's form (`90m`, `30d`, `1w`);
    ValueError unless it is more than zero."""
    text = text.strip()
    unit = AGE_UNITS.get(text[-1:], 0)
    try:
        seconds = float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(
            f"cannot read the length of time {text!r}: give seconds more than 0, or 90m, 12h, "
            "30d, 1w"
        )
    return seconds


def _iso(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"cannot read the time {text!r}: give now, unix seconds, an ISO 8601 date or time "
            "(UTC unless it names its offset: 2026-11-30T12:00+01:00), or an age such as 90m, "
            "2h or 7d"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
