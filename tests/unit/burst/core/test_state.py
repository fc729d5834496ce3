"""Pure updates of the planner state: capacity blocks, cooldown times, accrued spend."""

from __future__ import annotations

from burst.core import (
    BurstPlan,
    Launch,
    OfferKey,
    PlannerState,
    Terminate,
    TerminateReason,
    accrue_spend,
    commit_plan,
    record_capacity_error,
)
from schemas.burst import InstanceState, Market
from tests.unit.burst.core.builders import NOW, instance

OFFER = OfferKey("p5.48xlarge", "us-east-1", Market.SPOT)
OTHER = OfferKey("p5.48xlarge", "us-west-2", Market.SPOT)


def test_capacity_error_blocks_the_offer_and_drops_expired_blocks() -> None:
    state = PlannerState(blocked={OTHER: NOW - 1})
    blocked = record_capacity_error(state, OFFER, NOW, 180)
    assert blocked.blocked == {OFFER: NOW + 180}
    assert state.blocked == {OTHER: NOW - 1}  # input untouched
    # a shorter backoff never shortens an existing block
    assert record_capacity_error(blocked, OFFER, NOW + 10, 60).blocked == {OFFER: NOW + 180}


def test_commit_plan_records_team_times() -> None:
    launch = Launch("burst-1-0-aa", "g6.xlarge", "us-east-1", Market.SPOT, "ml", 0.35, "L4", 1, ())
    end = Terminate("i1", "cv", TerminateReason.IDLE, "idle")
    state = commit_plan(
        PlannerState(blocked={OFFER: NOW + 5, OTHER: NOW - 5}),
        BurstPlan(launches=(launch,), terminations=(end,)),
        NOW,
    )
    assert state.last_launch_at == {"ml": NOW}
    assert state.last_terminate_at == {"cv": NOW}
    assert state.blocked == {OFFER: NOW + 5}


def test_accrue_spend_counts_live_instances_only() -> None:
    fleet = [
        instance("a", price_per_hour=36.0),
        instance("b", price_per_hour=36.0, state=InstanceState.REQUESTED),
        instance("c", price_per_hour=36.0, state=InstanceState.TERMINATED),
        instance("d", price_per_hour=3.6, team="cv"),
    ]
    state = accrue_spend(PlannerState(team_spend={"ml": 1.0}), fleet, 100)
    assert state.team_spend == {"ml": 3.0, "cv": 0.1}
