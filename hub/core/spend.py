"""Burst spend: what each instance has cost since it was last accrued, and the budget left.

Pure. The hub accrues every instance's price over the time since its accrual mark (kept in
the store, so spend survives restarts and a hub that was down catches up), and tells the burst
controller the policy's limits with what is left of each team's month.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from hub.core.policy import Policy
from schemas.burst import BurstBudget, InstanceEvent, InstanceState, TeamBurstBudget


def month_of(at: float) -> str:
    """The calendar month (UTC) of a unix time, as YYYY-MM."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m")


def accrue(
    instances: Iterable[InstanceEvent], accrued_until: Mapping[str, float], now: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Dollars per team since each instance's mark, and the new marks.

    An instance is billed from its first event (or its mark) until now while it exists at the
    provider, or until its final event once it is gone.
    """
    dollars: dict[str, float] = {}
    marks: dict[str, float] = {}
    for event in instances:
        start = accrued_until.get(event.burst_id)
        if start is None:
            if not event.state.active and event.state is not InstanceState.TERMINATED:
                continue  # failed before it existed: nothing was billed
            start = event.at
        end = now if event.state.active else event.at
        if end <= start:
            continue
        cost = event.price_per_hour * (end - start) / 3600.0
        dollars[event.team] = dollars.get(event.team, 0.0) + cost
        marks[event.burst_id] = end
    return dollars, marks


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
