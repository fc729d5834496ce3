"""What is left under the burst limits while a plan is being made."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from burst.core.model import BurstPolicy, CloudInstance, SkipReason, TeamBudget
from schemas.burst import BurstBudget

# Prices are floats: 0.1 + 0.2 must fit a 0.3 budget.
_EPSILON = 1e-9


@dataclass(slots=True)
class Budget:
    """What is left under the limits; math.inf where there is no limit."""

    instances: float
    dollars_per_hour: float
    team_dollars_per_hour: dict[str, float] = field(default_factory=dict)

    def refusal(self, team: str, instances: int, price: float) -> SkipReason | None:
        """The limit that launching `instances` at `price` $/h each would break, or None."""
        if instances > self.instances:
            return SkipReason.MAX_INSTANCES
        cost = instances * price
        if cost > self.dollars_per_hour + _EPSILON:
            return SkipReason.GLOBAL_BUDGET
        if cost > self.team_dollars_per_hour.get(team, math.inf) + _EPSILON:
            return SkipReason.TEAM_BUDGET
        return None

    def take(self, team: str, instances: int, price: float) -> None:
        self.instances -= instances
        self.dollars_per_hour -= instances * price
        if team in self.team_dollars_per_hour:
            self.team_dollars_per_hour[team] -= instances * price

    def copy(self) -> Budget:
        return Budget(self.instances, self.dollars_per_hour, dict(self.team_dollars_per_hour))


def initial_budget(fleet: Sequence[CloudInstance], policy: BurstPolicy) -> Budget:
    """Room left by the live fleet (requested, running, terminating) under `policy`'s limits."""
    live = [instance for instance in fleet if instance.state.active]
    instances = math.inf if policy.max_instances is None else policy.max_instances - len(live)
    rate = sum(instance.price_per_hour for instance in live)
    cap = policy.max_dollars_per_hour
    budget = Budget(instances, math.inf if cap is None else cap - rate)
    for team, limits in policy.team_budgets.items():
        if limits.dollars_per_hour is not None:
            team_rate = sum(i.price_per_hour for i in live if i.team == team)
            budget.team_dollars_per_hour[team] = limits.dollars_per_hour - team_rate
    return budget


def with_hub_budget(
    policy: BurstPolicy, budget: BurstBudget | None, team_spend: Mapping[str, float]
) -> BurstPolicy:
    """`policy` tightened by the hub's budget: the stricter of each limit wins.

    A team's monthly allowance arrives as dollars left (the hub's store accrues spend across
    restarts); it becomes a `dollars_total` over the spend this controller has counted so far,
    so the planner's existing check refuses launches once nothing is left.
    """
    if budget is None:
        return policy
    allowed = policy.allowed_teams
    if budget.allowed_teams is not None:
        hub_allowed = frozenset(budget.allowed_teams)
        allowed = hub_allowed if allowed is None else allowed & hub_allowed
    teams = dict(policy.team_budgets)
    for team, limits in budget.teams.items():
        own = teams.get(team, TeamBudget())
        total, monthly = own.dollars_total, own.monthly
        if limits.dollars_left_this_month is not None:
            hub_total = team_spend.get(team, 0.0) + max(0.0, limits.dollars_left_this_month)
            if total is None or hub_total < total:
                total, monthly = hub_total, True
        per_hour = _least(own.dollars_per_hour, limits.dollars_per_hour)
        teams[team] = TeamBudget(per_hour, total, monthly)
    return replace(
        policy,
        max_dollars_per_hour=_least(policy.max_dollars_per_hour, budget.dollars_per_hour),
        allowed_teams=allowed,
        team_budgets=teams,
    )


def _least(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
