"""Table tests of the burst planner: which offer, how packed, what limits and cooldowns do."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest

from burst.catalog import Catalog, load_catalog
from burst.core import (
    BurstPlan,
    BurstPolicy,
    CloudInstance,
    MarketPreference,
    OfferKey,
    PlannerState,
    SkipReason,
    TeamBudget,
    TerminateReason,
    plan_burst,
    record_capacity_error,
)
from schemas.burst import DemandItem, InstanceState, Market
from schemas.common import ID_PATTERN
from tests.unit.burst.core.builders import NOW, catalog, instance, item, launched_ids, report

CATALOG = load_catalog()
POLICY = BurstPolicy()


def plan(
    *items: DemandItem,
    fleet: Sequence[CloudInstance] = (),
    policy: BurstPolicy = POLICY,
    state: PlannerState | None = None,
    cat: Catalog = CATALOG,
    sent_at: float = NOW,
    now: float = NOW,
) -> BurstPlan:
    return plan_burst(
        report(*items, sent_at=sent_at), list(fleet), cat, policy, state or PlannerState(), now
    )


def reasons(result: BurstPlan) -> list[SkipReason]:
    return [skip.reason for skip in result.skipped]


# -- which offer ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("demand", "policy", "expected"),
    [
        # cheapest 1-GPU offer anywhere: L4 spot in us-west-2
        ({}, POLICY, ("g6.xlarge", "us-west-2", Market.SPOT)),
        # on-demand only: the L4 at its list price; the us-east-1/us-west-2 tie breaks by name
        (
            {},
            BurstPolicy(markets=MarketPreference.ON_DEMAND_ONLY),
            ("g6.xlarge", "us-east-1", Market.ON_DEMAND),
        ),
        # work that must not be interrupted never goes on spot
        ({"spot_ok": False}, POLICY, ("g6.xlarge", "us-east-1", Market.ON_DEMAND)),
        # a model asked for, spelled in lower case
        (
            {"gpu_model": "h100", "gpus_per_node": 8},
            POLICY,
            ("p5.48xlarge", "us-east-1", Market.SPOT),
        ),
        (
            {"gpu_model": "H200", "gpus_per_node": 8},
            POLICY,
            ("p5en.48xlarge", "us-east-1", Market.SPOT),
        ),
        # regions the workload may run in
        ({"regions": ("eu-west-1",)}, POLICY, ("g5.xlarge", "eu-west-1", Market.SPOT)),
        # regions the policy allows
        (
            {},
            BurstPolicy(regions=frozenset({"eu-west-1"})),
            ("g5.xlarge", "eu-west-1", Market.SPOT),
        ),
    ],
)
def test_picks_the_cheapest_fitting_offer(
    demand: dict[str, Any], policy: BurstPolicy, expected: tuple[str, str, Market]
) -> None:
    result = plan(item(**demand), policy=policy)
    assert [(x.instance_type, x.region, x.market) for x in result.launches] == [expected]
    assert result.skipped == ()


def test_spot_first_falls_back_to_on_demand() -> None:
    cat = catalog(
        ("od-only", "H100", 8, {"eu-west-1": (40.0, None)}),
        ("both", "H100", 8, {"us-east-1": (120.0, 50.0)}),
    )
    h100: dict[str, Any] = {"gpu_model": "H100", "gpus_per_node": 8}
    # no spot sold where the work may run
    result = plan(item(**h100, regions=("us-east-1",)), cat=cat)
    assert [(x.instance_type, x.market) for x in result.launches] == [("both", Market.SPOT)]
    # spot that costs more than on-demand elsewhere loses
    anywhere = plan(item(**h100), cat=cat)
    assert [(x.instance_type, x.market) for x in anywhere.launches] == [
        ("od-only", Market.ON_DEMAND)
    ]
    # spot blocked after a capacity error: on-demand of the same type
    state = record_capacity_error(
        PlannerState(), OfferKey("both", "us-east-1", Market.SPOT), NOW, 60
    )
    blocked = plan(item(**h100, regions=("us-east-1",)), cat=cat, state=state)
    assert [(x.instance_type, x.market) for x in blocked.launches] == [("both", Market.ON_DEMAND)]


def test_no_offer_for_a_shape_nobody_sells() -> None:
    result = plan(item(gpu_model="B200"), item(team="cv", gpus_per_node=16))
    assert result.launches == ()
    assert reasons(result) == [SkipReason.NO_OFFER, SkipReason.NO_OFFER]


# -- packing ----------------------------------------------------------------------------------


def test_four_two_gpu_jobs_share_one_eight_gpu_instance() -> None:
    result = plan(item(gpu_model="H100", gpus_per_node=2, count=4))
    assert [x.instance_type for x in result.launches] == ["p5.48xlarge"]
    assert launched_ids(result.launches) == ["ml-w0", "ml-w1", "ml-w2", "ml-w3"]


def test_packing_prefers_the_cheapest_total() -> None:
    # One 8-GPU box ($10) beats two 4-GPU ones ($6 each); a lone 4-GPU job takes the small box.
    cat = catalog(
        ("big", "A100", 8, {"us-east-1": (10.0, None)}),
        ("small", "A100", 4, {"us-east-1": (6.0, None)}),
    )
    assert [x.instance_type for x in plan(item(gpus_per_node=2, count=4), cat=cat).launches] == [
        "big"
    ]
    assert [x.instance_type for x in plan(item(gpus_per_node=4), cat=cat).launches] == ["small"]
    # With A10G in the default catalog two 4-GPU boxes ($2.20 each) beat one 8-GPU ($6.40).
    result = plan(item(gpu_model="A10G", gpus_per_node=2, count=4))
    assert [x.instance_type for x in result.launches] == ["g5.12xlarge", "g5.12xlarge"]
    assert launched_ids(result.launches) == ["ml-w0", "ml-w1", "ml-w2", "ml-w3"]


def test_mixed_sizes_of_one_team_pack_together() -> None:
    result = plan(
        item(gpu_model="H100", gpus_per_node=4, workload_ids=("big",)),
        item(gpu_model="H100", gpus_per_node=2, count=2, workload_ids=("s1", "s2")),
    )
    assert len(result.launches) == 1
    assert sorted(result.launches[0].workload_ids) == ["big", "s1", "s2"]


def test_fractional_gpus_share_devices() -> None:
    result = plan(item(gpu_fraction=0.25, count=8))
    # eight quarter-GPU jobs fill two GPUs: two 1-GPU spot boxes are the cheapest
    assert [x.instance_type for x in result.launches] == ["g6.xlarge", "g6.xlarge"]
    assert launched_ids(result.launches) == sorted(f"ml-w{n}" for n in range(8))


def test_a_gang_gets_one_instance_per_node() -> None:
    result = plan(item(gpu_model="H100", gpus_per_node=8, nodes=2, workload_ids=("gang",)))
    assert [x.instance_type for x in result.launches] == ["p5.48xlarge"] * 2
    assert [x.workload_ids for x in result.launches] == [("gang",), ("gang",)]
    assert len({x.request_id for x in result.launches}) == 2


def test_two_gangs_share_their_instances() -> None:
    result = plan(item(gpu_model="H100", gpus_per_node=4, nodes=2, count=2))
    assert len(result.launches) == 2
    assert all(sorted(x.workload_ids) == ["ml-w0", "ml-w1"] for x in result.launches)


def test_counts_beyond_the_listed_ids_still_get_capacity() -> None:
    result = plan(item(gpu_model="H100", gpus_per_node=8, count=3, workload_ids=("w0",)))
    assert len(result.launches) == 3
    assert [x.workload_ids for x in result.launches].count(("w0",)) == 1


# -- when not to launch ----------------------------------------------------------------------


def test_demand_younger_than_burst_after_waits() -> None:
    young = item(oldest_age_s=10)
    result = plan(young)
    assert result.launches == ()
    assert reasons(result) == [SkipReason.TOO_YOUNG]
    # the same item 50 s later (as seen from an older report) is old enough
    assert len(plan(young, sent_at=NOW - 50).launches) == 1


def test_stale_reports_are_ignored() -> None:
    result = plan(item(), sent_at=NOW - 600)
    assert result.launches == ()
    assert reasons(result) == [SkipReason.STALE_DEMAND]


def test_teams_not_allowed_are_skipped_with_a_reason() -> None:
    result = plan(
        item(team="ml"), item(team="cv"), policy=BurstPolicy(allowed_teams=frozenset({"cv"}))
    )
    assert [x.team for x in result.launches] == ["cv"]
    assert reasons(result) == [SkipReason.TEAM_NOT_ALLOWED]
    assert "ml" in result.skipped[0].message


def test_workloads_with_a_live_instance_are_covered() -> None:
    booting = instance(
        state=InstanceState.REQUESTED, launched_at=NOW - 30, workload_ids=("ml-w0", "ml-w1")
    )
    result = plan(item(gpu_model="H100", gpus_per_node=8, count=2), fleet=[booting])
    assert result.launches == ()
    assert reasons(result) == [SkipReason.COVERED]
    assert result.skipped[0].workload_ids == ("ml-w0", "ml-w1")


def test_new_demand_waits_for_a_booting_instance_within_cooldown() -> None:
    demand = item(gpu_model="H100", gpus_per_node=8, workload_ids=("new",))
    booting = instance(state=InstanceState.REQUESTED, launched_at=NOW - 30, workload_ids=("old",))
    assert reasons(plan(demand, fleet=[booting])) == [SkipReason.COOLDOWN]
    # booting longer than the cooldown: more demand than it serves gets its own instance
    slow = instance(state=InstanceState.REQUESTED, launched_at=NOW - 200, workload_ids=("old",))
    assert launched_ids(plan(demand, fleet=[slow]).launches) == ["new"]
    # an instance of another GPU model does not hold back H100 demand
    other = instance(instance_type="g6.xlarge", state=InstanceState.REQUESTED, launched_at=NOW - 30)
    assert launched_ids(plan(demand, fleet=[other]).launches) == ["new"]


def test_no_launch_right_after_the_team_released_an_instance() -> None:
    state = PlannerState(last_terminate_at={"ml": NOW - 30})
    assert reasons(plan(item(), state=state)) == [SkipReason.COOLDOWN]
    assert len(plan(item(team="cv"), state=state).launches) == 1
    assert len(plan(item(), state=PlannerState(last_terminate_at={"ml": NOW - 121})).launches) == 1


# -- limits -----------------------------------------------------------------------------------


def test_max_instances_counts_the_live_fleet() -> None:
    fleet = [instance(f"i{n}") for n in range(9)] + [
        instance("gone", state=InstanceState.TERMINATED)
    ]
    result = plan(item(gpu_model="H100", gpus_per_node=8, count=3), fleet=fleet)
    assert len(result.launches) == 1
    assert reasons(result) == [SkipReason.MAX_INSTANCES]
    assert result.skipped[0].count == 2


def test_global_dollar_cap() -> None:
    policy = BurstPolicy(max_dollars_per_hour=100.0)
    result = plan(
        item(gpu_model="H100", gpus_per_node=8, count=3), fleet=[instance()], policy=policy
    )
    assert len(result.launches) == 1  # 45 running + 45 new <= 100 < 45 + 90
    assert reasons(result) == [SkipReason.GLOBAL_BUDGET]


def test_team_dollars_per_hour_budget() -> None:
    policy = BurstPolicy(team_budgets={"ml": TeamBudget(dollars_per_hour=1.0)})
    result = plan(item(count=4), policy=policy)
    assert sum(x.price_per_hour for x in result.launches) <= 1.0
    assert len(launched_ids(result.launches)) == 3
    assert reasons(result) == [SkipReason.TEAM_BUDGET]
    # other teams are not limited by ml's budget
    assert len(plan(item(team="cv", count=4), policy=policy).launches) >= 1


def test_team_total_budget_spent() -> None:
    policy = BurstPolicy(team_budgets={"ml": TeamBudget(dollars_total=500.0)})
    state = PlannerState(team_spend={"ml": 500.0})
    assert reasons(plan(item(), policy=policy, state=state)) == [SkipReason.TEAM_BUDGET_SPENT]
    assert (
        len(plan(item(), policy=policy, state=PlannerState(team_spend={"ml": 499.0})).launches) == 1
    )


def test_limits_pick_the_offer_serving_the_most() -> None:
    # One instance allowed: an 8-GPU box serves all four 2-GPU jobs, a 4-GPU box only two.
    policy = BurstPolicy(max_instances=1)
    result = plan(item(gpu_model="A10G", gpus_per_node=2, count=4), policy=policy)
    assert [x.instance_type for x in result.launches] == ["g5.48xlarge"]


# -- capacity backoff -------------------------------------------------------------------------


def test_blocked_offer_is_skipped_until_backoff_expires() -> None:
    cheapest = OfferKey("g6.xlarge", "us-west-2", Market.SPOT)
    state = record_capacity_error(PlannerState(), cheapest, NOW, 180)
    blocked = plan(item(), state=state)
    assert [(x.instance_type, x.region) for x in blocked.launches] == [("g6.xlarge", "us-east-1")]
    assert blocked.launches[0].offer != cheapest
    later = plan(item(), state=state, now=NOW + 181, sent_at=NOW + 181)
    assert later.launches[0].offer == cheapest


def test_every_fitting_offer_blocked() -> None:
    state = PlannerState()
    for region in ("us-east-1", "us-west-2"):
        for market in Market:
            state = record_capacity_error(state, OfferKey("p5en.48xlarge", region, market), NOW, 60)
    result = plan(item(gpu_model="H200", gpus_per_node=8), state=state)
    assert result.launches == ()
    assert reasons(result) == [SkipReason.CAPACITY_BACKOFF]


# -- terminations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "state", "expected"),
    [
        ({"idle_since": NOW - 301}, PlannerState(), TerminateReason.IDLE),
        ({"idle_since": NOW - 299}, PlannerState(), None),
        ({"idle_since": None}, PlannerState(), None),
        ({"idle_since": NOW - 3000, "runs_non_preemptible": True}, PlannerState(), None),
        # the team launched within the cooldown: keep it, demand may be coming back
        ({"idle_since": NOW - 301}, PlannerState(last_launch_at={"ml": NOW - 60}), None),
        (
            {"idle_since": NOW - 301},
            PlannerState(last_launch_at={"cv": NOW - 60}),
            TerminateReason.IDLE,
        ),
        (
            {"state": InstanceState.REQUESTED, "launched_at": NOW - 1300},
            PlannerState(),
            TerminateReason.BOOT_TIMEOUT,
        ),
        ({"state": InstanceState.REQUESTED, "launched_at": NOW - 600}, PlannerState(), None),
        ({"state": InstanceState.TERMINATING, "idle_since": NOW - 3000}, PlannerState(), None),
        ({"state": InstanceState.TERMINATED, "idle_since": NOW - 3000}, PlannerState(), None),
    ],
)
def test_terminations(
    fields: dict[str, Any], state: PlannerState, expected: TerminateReason | None
) -> None:
    result = plan(fleet=[instance("i1", **fields)], state=state)
    assert [t.reason for t in result.terminations] == ([expected] if expected else [])
    assert all(t.instance_id == "i1" and t.team == "ml" for t in result.terminations)


def test_idle_ttl_shorter_than_cooldown_still_waits_for_the_cooldown() -> None:
    policy = BurstPolicy(idle_ttl_s=10, cooldown_s=120)
    young = instance("i1", launched_at=NOW - 60, idle_since=NOW - 50)
    assert plan(fleet=[young], policy=policy).terminations == ()
    old = instance("i1", launched_at=NOW - 130, idle_since=NOW - 50)
    assert len(plan(fleet=[old], policy=policy).terminations) == 1


# -- ids and determinism ----------------------------------------------------------------------


def test_same_input_same_plan_and_valid_ids() -> None:
    demand = (item(gpus_per_node=2, count=5), item(team="cv", gpu_model="H100", gpus_per_node=8))
    first = plan(*demand)
    assert plan(*demand) == first
    ids = [x.request_id for x in first.launches]
    assert len(set(ids)) == len(ids)
    assert all(re.match(ID_PATTERN, i) and len(i) <= 63 and i.startswith("burst-7-") for i in ids)


def test_id_prefix_is_checked_and_used() -> None:
    demand = report(item())
    result = plan_burst(demand, [], CATALOG, POLICY, PlannerState(), NOW, id_prefix="hub-a1")
    assert result.launches[0].request_id.startswith("hub-a1-7-")
    with pytest.raises(ValueError, match="id_prefix"):
        plan_burst(demand, [], CATALOG, POLICY, PlannerState(), NOW, id_prefix="bad prefix")


def test_replanning_a_report_after_some_launches_gives_new_ids() -> None:
    first = plan(item(gpus_per_node=8, gpu_model="H100", count=2, workload_ids=("a", "b")))
    booted = instance(
        first.launches[0].request_id,
        state=InstanceState.REQUESTED,
        launched_at=NOW - 200,
        workload_ids=first.launches[0].workload_ids,
    )
    second = plan(
        item(gpus_per_node=8, gpu_model="H100", count=2, workload_ids=("a", "b")), fleet=[booted]
    )
    assert len(second.launches) == 1
    assert second.launches[0].request_id not in {x.request_id for x in first.launches}


def test_policy_rejects_negative_values() -> None:
    with pytest.raises(ValueError, match="cooldown_s"):
        BurstPolicy(cooldown_s=-1)
    with pytest.raises(ValueError, match="max_instances"):
        BurstPolicy(max_instances=-1)


def test_idle_release_and_new_demand_of_one_team_do_not_churn() -> None:
    idle = instance("i1", idle_since=NOW - 400)
    result = plan(item(gpu_model="H100", gpus_per_node=8), fleet=[idle])
    assert [t.instance_id for t in result.terminations] == ["i1"]
    assert result.launches == ()
    assert reasons(result) == [SkipReason.COOLDOWN]
