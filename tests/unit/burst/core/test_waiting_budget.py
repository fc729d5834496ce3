"""Starburst-style rules of the burst planner: waiting budgets by size, right-sized instances."""

from __future__ import annotations

import pytest

from burst.catalog import load_catalog
from burst.core import BurstPolicy, PlannerState, SkipReason, plan_burst
from schemas.burst import DemandItem
from tests.unit.burst.core.builders import NOW, catalog, item, launched_ids, report

CATALOG = load_catalog()


def launched(*items: DemandItem, policy: BurstPolicy) -> list[str]:
    result = plan_burst(report(*items), [], CATALOG, policy, PlannerState(), NOW)
    return launched_ids(result.launches)


# -- waiting budget ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "budget_s"),
    [
        ({"gpus_per_node": 1}, 60 + 30),
        ({"gpus_per_node": 8}, 60 + 240),
        ({"gpus_per_node": 4, "nodes": 2}, 60 + 240),
        ({"gpu_fraction": 0.5}, 60 + 15),
    ],
)
def test_the_budget_grows_with_the_gpus_asked_for(shape: dict[str, float], budget_s: float) -> None:
    policy = BurstPolicy(burst_after_s=60, wait_per_gpu_s=30)
    assert policy.waiting_budget_s(item(**shape)) == budget_s


def test_small_jobs_burst_while_big_ones_still_wait_for_on_prem() -> None:
    policy = BurstPolicy(burst_after_s=60, wait_per_gpu_s=60, max_instances=None)
    small = item(gpus_per_node=1, oldest_age_s=300, workload_ids=("small",))
    big = item(gpus_per_node=8, oldest_age_s=300, workload_ids=("big",))
    result = plan_burst(report(small, big), [], CATALOG, policy, PlannerState(), NOW)
    assert launched_ids(result.launches) == ["small"]
    assert [(s.item.workload_ids, s.reason) for s in result.skipped] == [
        (("big",), SkipReason.TOO_YOUNG)
    ]
    assert "waiting budget 540s" in result.skipped[0].message
    # once it has waited its budget the big one bursts too
    older = item(gpus_per_node=8, oldest_age_s=540, workload_ids=("big",))
    assert launched(older, policy=policy) == ["big"]


def test_without_a_per_gpu_wait_every_size_bursts_after_burst_after() -> None:
    policy = BurstPolicy(burst_after_s=60, max_instances=None)
    jobs = [item(gpus_per_node=g, oldest_age_s=61, workload_ids=(f"g{g}",)) for g in (1, 8)]
    assert launched(*jobs, policy=policy) == ["g1", "g8"]


def test_a_negative_wait_per_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="wait_per_gpu_s"):
        BurstPolicy(wait_per_gpu_s=-1)


# -- right-sized instances --------------------------------------------------------------------

# One 8-GPU box costs less than eight 1-GPU ones, so packing fills it; right-sizing does not.
BOXES = catalog(
    ("one", "A100", 1, {"us-east-1": (2.0, None)}),
    ("eight", "A100", 8, {"us-east-1": (12.0, None)}),
)


def plan_types(policy: BurstPolicy, *items: DemandItem) -> list[tuple[str, tuple[str, ...]]]:
    result = plan_burst(report(*items), [], BOXES, policy, PlannerState(), NOW)
    return sorted((x.instance_type, x.workload_ids) for x in result.launches)


def test_packing_puts_small_jobs_on_one_big_instance() -> None:
    jobs = item(gpus_per_node=1, count=8)
    assert plan_types(BurstPolicy(max_instances=None, right_size=False), jobs) == [
        ("eight", tuple(f"ml-w{n}" for n in range(8)))
    ]


def test_right_size_still_packs_jobs_no_instance_of_their_size_fits_exactly() -> None:
    # No 2-GPU box: one 8-GPU box each would bill 6 idle GPUs per job, so they share one.
    jobs = item(gpus_per_node=2, count=4)
    assert plan_types(BurstPolicy(max_instances=None), jobs) == [
        ("eight", tuple(f"ml-w{n}" for n in range(4)))
    ]


def test_right_size_gives_each_job_the_cheapest_instance_that_holds_it() -> None:
    policy = BurstPolicy(max_instances=None, right_size=True)
    jobs = item(gpus_per_node=1, count=3)
    big = item(gpus_per_node=8, workload_ids=("big",))
    assert plan_types(policy, jobs, big) == [
        ("eight", ("big",)),
        ("one", ("ml-w0",)),
        ("one", ("ml-w1",)),
        ("one", ("ml-w2",)),
    ]


def test_right_size_still_shares_gpus_between_fractions_and_gangs() -> None:
    policy = BurstPolicy(max_instances=None, right_size=True)
    quarters = item(gpu_fraction=0.25, count=4)
    gangs = item(gpus_per_node=4, nodes=2, count=2, workload_ids=("g1", "g2"))
    result = plan_types(policy, quarters, gangs)
    assert result == [
        ("eight", ("g1", "g2")),
        ("eight", ("g1", "g2")),
        ("one", ("ml-w0", "ml-w1", "ml-w2", "ml-w3")),
    ]


def test_right_size_respects_max_instances_oldest_first() -> None:
    policy = BurstPolicy(max_instances=2, right_size=True)
    old = item(gpus_per_node=1, count=3, oldest_age_s=900)
    result = plan_burst(report(old), [], BOXES, policy, PlannerState(), NOW)
    assert launched_ids(result.launches) == ["ml-w0", "ml-w1"]
    assert [(s.reason, s.workload_ids) for s in result.skipped] == [
        (SkipReason.MAX_INSTANCES, ("ml-w2",))
    ]


# -- work that ran before ---------------------------------------------------------------------


def test_work_that_ran_before_bursts_only_when_allowed() -> None:
    fresh = item(workload_ids=("fresh",))
    rerun = item(attained_s=7200.0, workload_ids=("rerun",))
    allowed = BurstPolicy(max_instances=None, burst_restarted=True)
    assert launched(fresh, rerun, policy=allowed) == ["fresh", "rerun"]
    policy = BurstPolicy(max_instances=None)  # burst_restarted is off by default
    result = plan_burst(report(fresh, rerun), [], CATALOG, policy, PlannerState(), NOW)
    assert launched_ids(result.launches) == ["fresh"]
    assert [(s.workload_ids, s.reason) for s in result.skipped] == [
        (("rerun",), SkipReason.RESTARTED)
    ]
