"""The policy file's `sessions:` and `idle:` sections (hub.core.idle has what they mean).

    sessions:
      idle_after: 30m        # GPUs idle and no traffic on its port this long: culled
      max_lifetime: 12h      # a session is stopped this long after it started
    idle:
      util_percent: 5        # under this a GPU counts as idle
      flag_after: 10m        # shown in gpufed jobs / explain from then on
      reclaim_after: 1h      # sessions and these classes are stopped (left out: never)
      classes: [dev]

Durations are seconds or a string of `d`, `h`, `m`, `s` parts (`90s`, `1h30m`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from hub.core.idle import IdleRules, SessionRules
from schemas.common import DNS_LABEL_PATTERN, StrictDoc

#: The longest duration a policy may name (a year).
MAX_DURATION_S = 366 * 86400.0
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration(value: Any) -> Any:
    """Seconds from `90`, `"90s"`, `"30m"`, `"1h30m"`; anything else is left for validation."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    if not text or _PART.sub("", text):
        raise ValueError(f"expected a duration such as 90s, 30m, 12h or 1h30m, got {value!r}")
    return float(sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text)))


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=MAX_DURATION_S)]


class _Doc(StrictDoc):
    """Every part of the document: see StrictDoc."""


class SessionsDoc(_Doc):
    idle_after: Duration | None = None
    max_lifetime: Duration | None = None


class IdleDoc(_Doc):
    util_percent: float = Field(default=5.0, ge=0, le=100)
    flag_after: Duration = 600.0
    reclaim_after: Duration | None = None
    classes: list[Annotated[str, Field(pattern=DNS_LABEL_PATTERN)]] = Field(
        default_factory=lambda: ["dev"], max_length=64
    )


def session_rules(doc: SessionsDoc) -> SessionRules:
    """The `sessions:` section as the core reads it."""
    return SessionRules(doc.idle_after, doc.max_lifetime)


def idle_rules(doc: IdleDoc) -> IdleRules:
    """The `idle:` section as the core reads it."""
    return IdleRules(doc.util_percent, doc.flag_after, doc.reclaim_after, tuple(doc.classes))


def sessions_dict(rules: SessionRules) -> dict[str, Any]:
    """`sessions:` as written back (seconds)."""
    return {"idle_after": rules.idle_after_s, "max_lifetime": rules.max_lifetime_s}


def idle_dict(rules: IdleRules) -> dict[str, Any]:
    """`idle:` as written back (seconds)."""
    return {
        "util_percent": rules.util_percent,
        "flag_after": rules.flag_after_s,
        "reclaim_after": rules.reclaim_after_s,
        "classes": list(rules.reclaim_classes),
    }
