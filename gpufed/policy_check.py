"""`gpufed policy set`'s warnings: quotas for GPU models no spoke has, and time windows
that overlap (the first listed wins, so the other does not apply there).

A quota key is the model's name as spokes report it, case and all: `h100` is another model
than `H100`, and a team given `h100: {guaranteed: 16}` has no H100 guarantee. The hub cannot
refuse it (a model may be on order, or come only with cloud instances), so the command that
sets the policy says so. Pure: the policy as the hub answered it (read by the hub's own
loader) and the models in the fleet.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from datetime import datetime
from typing import Any

from hub.core.policy import ANY_MODEL, Policy
from hub.core.windows import shadowed
from hub.policyfile import policy_from_dict
from schemas.common import nearest_name


def unknown_models(document: Mapping[str, Any], fleet: Collection[str]) -> list[str]:
    """One line per model the policy's quotas name that no spoke in `fleet` has, naming where
    it is used and the model it was likely meant to be; none when the fleet is empty."""
    if not fleet:
        return []
    used: dict[str, list[str]] = {}
    for model, owner in _quota_models(policy_from_dict(dict(document))):
        used.setdefault(model, []).append(owner)
    lines = []
    for model in sorted(used.keys() - set(fleet) - {ANY_MODEL}):
        line = f"no spoke has GPU model {model} now (quotas of {', '.join(used[model])})"
        near = nearest_name(model, fleet)
        lines.append(f"{line}; did you mean {near}?" if near else line)
    return lines


def overlapping_windows(document: Mapping[str, Any], now: float) -> list[str]:
    """One line per two windows in force at once: the later one does not apply there (when
    it first happens from `now`, in its own zone), or at all."""
    policy = policy_from_dict(dict(document))
    zones = {w.name: (w.zone, w.timezone) for w in policy.windows}
    lines = []
    for first, later, since, never in shadowed(policy, now):
        if never:
            lines.append(
                f"window {later} never applies: window {first}, listed before it, is in force "
                "whenever it is"
            )
            continue
        zone, name = zones[later]
        when = datetime.fromtimestamp(since, zone).strftime("%a %H:%M")
        lines.append(
            f"windows {first} and {later} are both in force at times (first at {when} {name}); "
            f"{first}, listed first, applies then"
        )
    return lines


def _quota_models(policy: Policy) -> Iterator[tuple[str, str]]:
    """(model, who it is a quota of) for every quota the policy and its windows set."""
    for department in policy.departments:
        yield from ((m, f"department {department.name}") for m in department.quotas)
    for team in policy.teams:
        yield from ((m, f"team {team.name}") for m in team.quotas)
    yield from ((m, "the default team") for m in policy.default_team.quotas)
    for window in policy.windows:
        where = f" in window {window.name}"
        for name, quotas in window.departments.items():
            yield from ((m, f"department {name}{where}") for m in quotas)
        for name, change in window.teams.items():
            yield from ((m, f"team {name}{where}") for m in change.quotas)
        if window.default_team is not None:
            yield from ((m, f"the default team{where}") for m in window.default_team.quotas)
