"""`gpufed policy show --at TIME`: the policy in force at an instant, by the hub's own rules.

The hub decides with `hub.core.windows.policy_at(policy, now)`; this module applies the same
pure function to the policy the hub returns, so what it prints is what the hub will use.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hub.core.policy import Policy, Window
from hub.core.windows import DAY_S, active_window, next_change, policy_at
from hub.policyfile import policy_from_dict, policy_to_dict


def policy_in_force(document: dict[str, Any], at: float) -> dict[str, Any]:
    """The policy `document` (as the hub returns it) in force at `at`, as a dict.

    `in_force` says when, which window applies (none: the policy as written) and until when.
    """
    policy = policy_from_dict(document)
    effective = policy_at(policy, at)
    until = _next_switch(policy, at, effective.window)
    data = policy_to_dict(effective)
    del data["windows"]
    data["in_force"] = {
        "at": _iso(at),
        "window": effective.window,
        "until": _iso(until) if until is not None else None,
    }
    return data


def _next_switch(policy: Policy, at: float, window: str | None) -> float | None:
    """The first instant after `at` at which a window other than `window` is in force.

    `next_change` also lists instants that change nothing (a zone's daylight-saving shift, a
    window ending where the next begins); those are skipped. The schedule repeats weekly, so
    a window still in force at every boundary of the next eight days is in force for good.
    """
    moment: float | None = at
    while moment is not None and moment <= at + 8 * DAY_S:
        moment = next_change(policy, moment)
        if moment is not None and _name(active_window(policy, moment)) != window:
            return moment
    return None


def _name(window: Window | None) -> str | None:
    return window.name if window is not None else None


def _iso(instant: float) -> str:
    return datetime.fromtimestamp(instant, UTC).isoformat()
