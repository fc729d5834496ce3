"""`gpufed policy set`'s warnings: quotas for GPU models no spoke has, and time windows
that overlap (the first listed wins, so the other does not apply there).

A quota's model is matched whatever its case (`h100` is the fleet's `H100`), but a model no
spoke has is most often a typing slip (`H10O`) or one on order; the hub cannot refuse it (it
may come only with cloud instances), so the command that sets the policy says so. Pure: the
policy as the hub answered it (read by the hub's own loader) and the models in the fleet.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from hub.core.gpumodels import quota_models
from hub.core.policy import ANY_MODEL
from hub.core.windows import shadowed
from hub.policyfile import policy_from_dict
from schemas.common import nearest_name


def unknown_models(document: Mapping[str, Any], fleet: Collection[str]) -> list[str]:
    """One line per model the policy's quotas name that no spoke in `fleet` has, naming where
    it is used and the model it was likely meant to be; none when the fleet is empty."""
    if not fleet:
        return []
    used: dict[str, list[str]] = {}
    for model, owner in quota_models(policy_from_dict(dict(document))):
        used.setdefault(model, []).append(owner)
    known = {model.casefold() for model in fleet} | {ANY_MODEL}
    lines = []
    for model in sorted(m for m in used if m.casefold() not in known):
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
