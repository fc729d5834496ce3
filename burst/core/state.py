"""Pure updates of the planner's memory: each returns a new PlannerState."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from burst.core.model import BurstPlan, CloudInstance, OfferKey, PlannerState


def record_capacity_error(
    state: PlannerState, offer: OfferKey, now: float, backoff_s: float
) -> PlannerState:
    """Block `offer` until `now + backoff_s` after the provider said it has no capacity.

    The planner skips blocked offers and tries the next cheapest; expired blocks are dropped.
    """
    blocked = _unexpired(state.blocked, now)
    blocked[offer] = max(blocked.get(offer, 0.0), now + backoff_s)
    return replace(state, blocked=blocked)


def commit_plan(state: PlannerState, plan: BurstPlan, now: float) -> PlannerState:
    """Remember the launches and terminations of `plan` as done at `now` (for cooldowns).

    Call it with the plan as carried out (leave out launches that failed); then call
    record_capacity_error for each launch that failed for lack of capacity.
    """
    launched = dict(state.last_launch_at)
    for launch in plan.launches:
        launched[launch.team] = now
    terminated = dict(state.last_terminate_at)
    for termination in plan.terminations:
        terminated[termination.team] = now
    return replace(
        state,
        last_launch_at=launched,
        last_terminate_at=terminated,
        blocked=_unexpired(state.blocked, now),
    )


def accrue_spend(
    state: PlannerState, fleet: Iterable[CloudInstance], elapsed_s: float
) -> PlannerState:
    """Add what the live instances cost over the last `elapsed_s` seconds to each team's spend."""
    spend = dict(state.team_spend)
    for instance in fleet:
        if instance.state.active and elapsed_s > 0:
            cost = instance.price_per_hour * elapsed_s / 3600.0
            spend[instance.team] = spend.get(instance.team, 0.0) + cost
    return replace(state, team_spend=spend)


def _unexpired(blocked: Mapping[OfferKey, float], now: float) -> dict[OfferKey, float]:
    return {key: until for key, until in blocked.items() if until > now}
