"""Burst budgets: the policy's limits with what is left of each team's month.

Pure. What a team has spent is the sum of its instance bills (`hub.usage`: each instance from
its request to its end, kept in the store, so spend survives restarts and a hub that was down
still counts the time it missed); this module turns that into the budget sent to burst.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from hub.core.policy import Policy
from schemas.burst import BurstBudget, TeamBurstBudget


def month_start(at: float) -> float:
    """The unix time at which the calendar month (UTC) of `at` began."""
    day = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def burst_budget(policy: Policy, month_spend: Mapping[str, float]) -> BurstBudget:
    """The policy's burst limits, with what is left of each team's monthly budget."""
    allowed = None
    if not policy.default_team.may_burst:
        allowed = tuple(sorted(t.name for t in policy.teams if t.may_burst))
    teams = {}
    for team in policy.teams:
        if team.burst_dollars_per_hour is None and team.burst_dollars_per_month is None:
            continue
        left = None
        if team.burst_dollars_per_month is not None:
            left = max(0.0, team.burst_dollars_per_month - month_spend.get(team.name, 0.0))
        teams[team.name] = TeamBurstBudget(
            dollars_per_hour=team.burst_dollars_per_hour, dollars_left_this_month=left
        )
    return BurstBudget(
        dollars_per_hour=policy.burst.dollars_per_hour, allowed_teams=allowed, teams=teams
    )
