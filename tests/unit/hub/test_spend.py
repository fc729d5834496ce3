"""Spend guard: a team's spend from its bills, the hub's budget from its policy, and burst
applying it."""

from __future__ import annotations

import pytest

from burst.catalog import load_catalog
from burst.core import BurstPolicy, PlannerState, SkipReason, TeamBudget, plan_burst
from burst.core.budget import with_hub_budget
from hub.core.spend import burst_budget, month_start
from hub.policyfile import policy_from_dict
from hub.usage import InstanceBill, team_cost
from schemas.burst import BurstBudget, TeamBurstBudget
from tests.unit.burst.core.builders import NOW, item, report

pytestmark = pytest.mark.security


def bill(burst_id: str, team: str, requested: float, ended: float | None) -> InstanceBill:
    return InstanceBill(
        burst_id=burst_id,
        team=team,
        spoke_id=burst_id,
        provider="local",
        instance_type="p5.48xlarge",
        price_per_hour=36.0,
        requested_at=requested,
        ended_at=ended,
    )


def test_team_cost_bills_live_instances_to_now_and_ended_ones_to_their_end() -> None:
    bills = [bill("b1", "vision", 1000.0, None), bill("b2", "nlp", 1000.0, 1100.0)]
    assert team_cost(bills, now=1200.0) == pytest.approx(
        {"vision": 36.0 * 200 / 3600, "nlp": 36.0 * 100 / 3600}
    )
    # A window counts only the time inside it: the month's spend starts on the 1st.
    assert team_cost(bills, now=1200.0, since=1150.0) == pytest.approx({"vision": 36.0 * 50 / 3600})


def test_month_starts_on_the_first_at_midnight_utc() -> None:
    assert month_start(0.0) == 0.0
    assert month_start(1_767_225_599.0) == 1_764_547_200.0  # 2025-12-31T23:59:59Z -> 12-01
    assert month_start(1_764_547_200.0) == 1_764_547_200.0


def test_budget_from_the_default_policy_lets_no_unlisted_team_burst() -> None:
    budget = burst_budget(policy_from_dict({}), {})
    assert budget.allowed_teams == ()
    assert budget.dollars_per_hour == 50.0


def test_budget_carries_what_is_left_of_each_month() -> None:
    policy = policy_from_dict(
        {
            "teams": [
                {"name": "vision", "may_burst": True, "burst_budget": {"dollars_per_month": 100}},
                {"name": "nlp", "may_burst": False},
            ],
            "burst": {"dollars_per_hour": 20},
        }
    )
    budget = burst_budget(policy, {"vision": 130.0})
    assert budget.allowed_teams == ("vision",)
    assert budget.teams["vision"].dollars_left_this_month == 0.0
    assert budget.dollars_per_hour == 20


def test_burst_applies_the_stricter_of_its_own_and_the_hubs_limits() -> None:
    own = BurstPolicy(
        max_dollars_per_hour=100.0, team_budgets={"ml": TeamBudget(dollars_per_hour=5.0)}
    )
    hub = BurstBudget(
        dollars_per_hour=200.0,
        allowed_teams=("ml", "cv"),
        teams={"ml": TeamBurstBudget(dollars_per_hour=50.0, dollars_left_this_month=10.0)},
    )
    merged = with_hub_budget(own, hub, {"ml": 7.0})
    assert merged.max_dollars_per_hour == 100.0
    assert merged.allowed_teams == frozenset({"ml", "cv"})
    assert merged.team_budgets["ml"] == TeamBudget(5.0, dollars_total=17.0, monthly=True)
    assert with_hub_budget(own, None, {}) is own


def test_a_team_with_its_month_spent_or_not_allowed_gets_no_instance() -> None:
    catalog = load_catalog()
    demand = report(item(team="ml"))
    spent = BurstBudget(teams={"ml": TeamBurstBudget(dollars_left_this_month=0.0)})
    policy = with_hub_budget(BurstPolicy(), spent, {})
    result = plan_burst(demand, [], catalog, policy, PlannerState(), NOW)
    assert not result.launches
    assert [s.reason for s in result.skipped] == [SkipReason.TEAM_BUDGET_SPENT]
    # Said as what it is: not "$0.00 of $0.00", which reads as a budget of nothing.
    assert result.skipped[0].message == (
        "team ml has spent its monthly burst budget (the policy's burst_budget.dollars_per_month)"
    )
    nobody = with_hub_budget(BurstPolicy(), BurstBudget(allowed_teams=()), {})
    assert not plan_burst(demand, [], catalog, nobody, PlannerState(), NOW).launches
    cheap = with_hub_budget(BurstPolicy(), BurstBudget(dollars_per_hour=0.01), {})
    assert not plan_burst(demand, [], catalog, cheap, PlannerState(), NOW).launches
