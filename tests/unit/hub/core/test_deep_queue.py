"""A deep queue: the same decisions as a search per workload, and wide gangs holding nodes."""

from __future__ import annotations

from hub.core.model import Plan, RunningWorkload, Workload
from hub.core.placement import plan
from hub.core.planstate import PlanState
from hub.core.policy import Policy, Quota, Reservation, Team
from tests.unit.hub.core.builders import (
    checked_plan,
    fleet,
    node,
    occupy,
    pending,
    placed,
    running,
    spoke,
    why,
)

NOW = 100_000.0
TWO_SPOKES = fleet(
    spoke("s1", node("a1", gpus=8), node("a2", gpus=8)),
    spoke("s2", node("b1", gpus=8), node("b2", gpus=8)),
)


def run(
    *queue: Workload, policy: Policy | None = None, active: tuple[RunningWorkload, ...] = ()
) -> Plan:
    return checked_plan(TWO_SPOKES, queue, active, policy or Policy(), NOW)


def test_every_workload_of_a_long_queue_gets_its_own_reason() -> None:
    busy = tuple(
        running(f"r{n}", s, {n: range(8)}, gpus=8)
        for s, n in (("s1", "a1"), ("s1", "a2"), ("s2", "b1"))
    )
    queue = [pending(f"w{i:03}", at=NOW - 1000 + i, gpus=4) for i in range(300)]
    result = run(*queue, active=busy)
    assert set(placed(result)) == {"w000", "w001"}  # b2's 8 GPUs, 4 each
    reasons = why(result)
    assert len(reasons) == 298
    assert {r for r, _ in reasons.values()} == {"insufficient_free"}


def test_a_failed_shape_is_searched_again_once_something_was_booked() -> None:
    # 3 GPUs fit nowhere (2 free on each of a1, a2): no room. Two 2-GPU jobs then take 4 of
    # vision's limit of 6, so the same 3-GPU shape behind them is now over the limit.
    policy = Policy(teams=(Team("vision", quotas={"*": Quota(limit=6)}),))
    busy = (
        running("r1", "s1", {"a1": range(6)}, gpus=6, team="nlp"),
        running("r2", "s1", {"a2": range(6)}, gpus=6, team="nlp"),
        running("r3", "s2", {"b1": range(8)}, gpus=8, team="nlp"),
        running("r4", "s2", {"b2": range(8)}, gpus=8, team="nlp"),
    )
    result = run(
        pending("three", at=NOW - 30, gpus=3, cls="training"),
        pending("two", at=NOW - 20, gpus=2, cls="training"),
        pending("two-more", at=NOW - 15, gpus=2, cls="training"),
        pending("three-more", at=NOW - 10, gpus=3, cls="training"),
        policy=policy,
        active=busy,
    )
    assert set(placed(result)) == {"two", "two-more"}
    assert why(result)["three"][0] == "insufficient_free"
    assert why(result)["three-more"][0] == "team_limit"


def test_work_every_spoke_refused_is_told_so_behind_alike_work_that_waits() -> None:
    busy = tuple(
        running(f"r{n}", s, {n: range(8)}, gpus=8)
        for s, n in (("s1", "a1"), ("s1", "a2"), ("s2", "b1"), ("s2", "b2"))
    )
    refused = pending("refused", at=NOW - 10, gpus=4)
    refused = Workload(
        refused.id, refused.spec, refused.submitted_at, avoid_spokes=frozenset({"s1", "s2"})
    )
    result = run(pending("waits", at=NOW - 20, gpus=4), refused, active=busy)
    assert why(result)["waits"][0] == "insufficient_free"
    assert why(result)["refused"][0] == "runtime_refuses"


def test_wide_gang_that_waited_holds_the_nodes_it_needs() -> None:
    # Each spoke has one free node and one half-busy one: the gang (2 x 8) fits nowhere. A
    # small job behind it would take the free GPUs of the held half-busy nodes.
    busy = (
        running("r1", "s1", {"a2": range(4)}, gpus=4, started=NOW - 50),
        running("r2", "s2", {"b2": range(4)}, gpus=4, started=NOW - 5000),
    )
    policy = Policy(reservation=Reservation(min_gpus=16, after_s=600))
    gang = pending("gang", at=NOW - 3600, gpus=8, nodes=2)
    small = [pending(f"s{i}", at=NOW - 10 + i, gpus=4) for i in range(4)]
    result = run(gang, *small, policy=policy, active=busy)
    # s1's running work is younger (likelier to end soon): its nodes are held for the gang.
    assert "holding 2 nodes of spoke s1" in why(result)["gang"][1]
    assert {spoke for spoke, _ in placed(result).values()} == {"s2"}
    assert len(placed(result)) == 3  # b1's 8 GPUs, b2's 4 free

    fresh = run(pending("gang", at=NOW - 60, gpus=8, nodes=2), *small, policy=policy, active=busy)
    assert "holding" not in why(fresh)["gang"][1]
    assert len(placed(fresh)) == 4  # nothing held: a2's free GPUs take one more


def test_a_queue_planned_again_unchanged_explains_nothing_anew() -> None:
    # The hub's cycle writes only `Plan.explained` onto its records after the first plan:
    # an explanation missing from it while it changed would leave a stale reason on a record.
    busy = tuple(
        running(f"r{n}", s, {n: range(8)}, gpus=8)
        for s, n in (("s1", "a1"), ("s1", "a2"), ("s2", "b1"), ("s2", "b2"))
    )
    queue = [pending(f"w{i:03}", at=NOW - 1000 + i, gpus=4) for i in range(50)]
    kept = PlanState()

    def plan_kept(active: tuple[RunningWorkload, ...], policy: Policy, at: float) -> Plan:
        return kept.plan(occupy(TWO_SPOKES, active), queue, active, policy, at)

    first = plan_kept(busy, Policy(), NOW)
    assert first.explained is not None
    assert [u.workload_id for u in first.explained] == [f"w{i:03}" for i in range(50)]
    again = plan_kept(busy, Policy(), NOW + 1)
    assert again.explained == ()
    assert all(a is b for a, b in zip(again.unplaced, first.unplaced, strict=True))
    # Two placed on a freed node: the rest, told again that nothing fits, keep theirs.
    freed = plan_kept(busy[1:], Policy(), NOW + 2)
    assert set(placed(freed)) == {"w000", "w001"}
    assert freed.explained == ()
    del queue[:2]
    # Another reason for each of them (a quota now caps the team): every one explained anew.
    capped = Policy(teams=(Team("vision", quotas={"*": Quota(limit=4)}),))
    limited = plan_kept(busy[1:], capped, NOW + 3)
    assert limited.explained is not None
    assert len(limited.explained) == len(limited.unplaced) == 48
    assert plan(occupy(TWO_SPOKES, busy), queue, busy, Policy(), NOW).explained is None
