"""`gpufed policy show --at TIME`: the policy in force at an instant, by the hub's own rules.

The hub decides with `hub.core.windows.policy_at(policy, now)`; this module applies the same
pure function to the policy the hub returns, so what it prints is what the hub will use.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hub.core.windows import next_change, policy_at
from hub.policyfile import policy_from_dict, policy_to_dict


def parse_instant(text: str, now: float) -> float:
    """Seconds since the epoch for `text`: `now`, ISO 8601 (no offset: UTC) or epoch seconds."""
    text = text.strip()
    if text.lower() == "now":
        return now
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(
            f"--at {text!r}: give 'now', an ISO 8601 time such as 2026-12-01T09:00+01:00, "
            "or seconds since the epoch"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def policy_in_force(document: dict[str, Any], at: float) -> dict[str, Any]:
    """The policy `document` (as the hub returns it) in force at `at`, as a dict.

    `in_force` says when, which window applies (none: the policy as written) and until when.
    """
    policy = policy_from_dict(document)
    effective = policy_at(policy, at)
    until = next_change(policy, at)
    data = policy_to_dict(effective)
    del data["windows"]
    data["in_force"] = {
        "at": _iso(at),
        "window": effective.window,
        "until": _iso(until) if until is not None else None,
    }
    return data


def _iso(instant: float) -> str:
    return datetime.fromtimestamp(instant, UTC).isoformat()
