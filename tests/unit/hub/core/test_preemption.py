"""Reclaim and priority preemption, waiting for stopping work, and who is never a victim."""

from __future__ import annotations

from hub.core.model import Plan, RunningWorkload, Snapshot, Workload
from hub.core.placement import plan
from hub.core.policy import Policy, Quota, Team
from tests.unit.hub.core.builders import (
    checked_plan,
    fleet,
    node,
    pending,
    placed,
    running,
    spoke,
    victims,
    why,
)

NOW = 10_000.0
TWO_NODES = fleet(spoke("s1", node("n1"), node("n2")))
POLICY = Policy(
    teams=(
        Team("owner", quotas={"H100": Quota(8)}),
        Team("borrower", quotas={"H100": Quota(0)}),
        Team("steady", quotas={"H100": Quota(8)}),
    )
)


def run(
    *queue: Workload,
    active: tuple[RunningWorkload, ...] = (),
    policy: Policy = POLICY,
    base: Snapshot = TWO_NODES,
) -> Plan:
    return checked_plan(base, queue, active, policy, NOW)


def full_of(team: str, cls: str = "batch", started: float = 0.0) -> tuple[RunningWorkload, ...]:
    return (
        running("r1", "s1", {"n1": range(8)}, started=started, team=team, cls=cls),
        running("r2", "s1", {"n2": range(8)}, started=started + 1, team=team, cls=cls),
    )


def test_team_under_guarantee_reclaims_borrowed_work() -> None:
    result = run(pending("w", team="owner", gpus=8), active=full_of("borrower"))
    assert victims(result) == ["r2"]  # the newer of two equal victims
    assert why(result)["w"] == (
        "waiting_for_preemption",
        "waiting for 1 preempted workload to stop",
    )
    (unplaced,) = result.unplaced
    assert unplaced.waiting_for == ("r2",)
    (preemption,) = result.preemptions
    assert preemption.for_workload == "w"
    assert preemption.spoke_id == "s1"
    assert "reclaimed for team owner's guaranteed H100" in preemption.reason


def test_work_within_its_own_guarantee_is_not_reclaimed() -> None:
    active = (
        running("r1", "s1", {"n1": range(8)}, team="steady"),
        running("r2", "s1", {"n2": range(8)}, team="borrower"),
    )
    result = run(pending("a", team="owner", gpus=8), active=active)
    assert victims(result) == ["r2"]
    result = run(pending("a", team="owner", gpus=8), active=active[:1])
    assert "a" in placed(result)


def test_no_reclaim_beyond_the_guarantee() -> None:
    result = run(pending("w", team="owner", gpus=8, nodes=2), active=full_of("borrower"))
    assert result.preemptions == ()
    assert why(result)["w"][0] == "insufficient_free"


def test_teams_without_guarantee_never_reclaim() -> None:
    result = run(pending("w", team="borrower", cls="training", gpus=8), active=full_of("steady"))
    assert result.preemptions == ()


def test_higher_priority_evicts_lower_priority_of_its_own_team_only() -> None:
    active = (
        running("mine", "s1", {"n1": range(8)}, team="borrower", cls="batch"),
        running("theirs", "s1", {"n2": range(8)}, team="steady", cls="batch"),
    )
    result = run(pending("w", team="borrower", cls="training", gpus=8), active=active)
    assert victims(result) == ["mine"]
    assert "preempted for higher-priority training workload w" in result.preemptions[0].reason


def test_equal_or_lower_priority_never_evicts() -> None:
    active = full_of("borrower", cls="training")
    result = run(pending("w", team="borrower", cls="training", gpus=8), active=active)
    assert result.preemptions == ()


def test_production_is_never_preempted() -> None:
    policy = Policy(
        teams=(Team("owner", quotas={"H100": Quota(8)}), Team("prod", quotas={"H100": Quota(16)}))
    )
    active = full_of("prod", cls="production")
    result = run(pending("w", team="owner", cls="production", gpus=8), active=active, policy=policy)
    assert result.preemptions == ()
    assert why(result)["w"][0] == "insufficient_free"


def test_victims_lowest_priority_first_then_newest_then_fewest() -> None:
    active = (
        running("dev", "s1", {"n1": range(8)}, started=5, team="borrower", cls="dev"),
        running("old", "s1", {"n2": range(4)}, started=1, team="borrower"),
        running("new", "s1", {"n2": range(4, 8)}, started=2, team="borrower"),
    )
    assert victims(run(pending("w", team="owner", gpus=4), active=active)) == ["new"]
    assert set(victims(run(pending("w", team="owner", gpus=8), active=active))) == {"old", "new"}
    single = (
        running("big", "s1", {"n1": range(8)}, started=1, team="borrower"),
        *(
            running(f"small{i}", "s1", {"n2": [i]}, started=2 + i, team="borrower")
            for i in range(8)
        ),
    )
    assert victims(run(pending("w", team="owner", gpus=8), active=single)) == ["big"]


def test_stopping_work_is_waited_for_not_preempted_again() -> None:
    active = (
        running("r1", "s1", {"n1": range(8)}, team="borrower"),
        running("r2", "s1", {"n2": range(8)}, team="borrower", preempting=True),
    )
    result = run(pending("w", team="owner", gpus=8), active=active)
    assert result.preemptions == ()
    assert why(result)["w"] == (
        "waiting_for_preemption",
        "waiting for 1 preempted workload to stop",
    )
    assert result.unplaced[0].waiting_for == ("r2",)


def test_stopping_work_counts_once_and_first_for_the_workload_it_was_preempted_for() -> None:
    active = (
        running("r1", "s1", {"n1": range(8)}, team="borrower"),
        running("r2", "s1", {"n2": range(8)}, team="borrower", preempting=True, preempted_for="b"),
    )
    queue = (
        pending("a", at=1, team="owner", gpus=8),
        pending("b", at=2, team="steady", gpus=8),
    )
    result = run(*queue, active=active)
    waits = {u.workload_id: u.waiting_for for u in result.unplaced}
    assert waits["b"] == ("r2",)
    assert waits["a"] == ("r1",)
    assert victims(result) == ["r1"]


def test_free_devices_are_held_for_a_waiting_workload() -> None:
    active = (running("r", "s1", {"n1": range(4)}, team="borrower"),)
    snapshot = fleet(spoke("s1", node("n1")))
    queue = (
        pending("w", at=1, team="owner", gpus=8),
        pending("later", at=2, team="borrower", gpus=4),
    )
    result = run(*queue, active=active, base=snapshot)
    assert victims(result) == ["r"]
    assert why(result)["later"][0] == "insufficient_free"


def test_own_lower_priority_work_makes_room_under_the_team_limit() -> None:
    policy = Policy(teams=(Team("vision", quotas={"H100": Quota(0, 8)}),))
    active = (
        running("b1", "s1", {"n1": range(4)}, started=1, team="vision", cls="batch"),
        running("b2", "s1", {"n1": range(4, 8)}, started=2, team="vision", cls="batch"),
    )
    result = run(pending("t", team="vision", cls="training", gpus=4), active=active, policy=policy)
    assert victims(result) == ["b2"]
    assert why(result)["t"][0] == "waiting_for_preemption"


def test_limit_blocked_work_waits_for_its_own_stopping_work() -> None:
    policy = Policy(teams=(Team("vision", quotas={"H100": Quota(0, 8)}),))
    active = (
        running("b1", "s1", {"n1": range(4)}, team="vision", cls="batch"),
        running("b2", "s1", {"n1": range(4, 8)}, team="vision", preempting=True),
    )
    result = run(pending("t", team="vision", cls="training", gpus=4), active=active, policy=policy)
    assert result.preemptions == ()
    assert result.unplaced[0].waiting_for == ("b2",)


def test_gang_reclaims_whole_nodes_on_one_spoke() -> None:
    base = fleet(spoke("s1", node("n1"), node("n2")), spoke("s2", node("n3")))
    policy = Policy(teams=(Team("owner", quotas={"H100": Quota(16)}), Team("borrower", quotas={})))
    active = (
        running("a", "s1", {"n1": range(8)}, team="borrower"),
        running("b", "s1", {"n2": range(8)}, team="borrower"),
        running("c", "s2", {"n3": range(8)}, team="borrower"),
    )
    result = run(
        pending("g", team="owner", gpus=8, nodes=2), active=active, policy=policy, base=base
    )
    assert sorted(victims(result)) == ["a", "b"]


def test_fraction_reclaims_a_share() -> None:
    base = fleet(spoke("s1", node("n1", gpus=1)))
    active = (
        running("f1", "s1", {"n1": [0]}, fraction=0.5, started=1, team="borrower"),
        running("f2", "s1", {"n1": [0]}, fraction=0.5, started=2, team="borrower"),
    )
    result = run(pending("w", team="owner", fraction=0.5), active=active, base=base)
    assert victims(result) == ["f2"]


def test_work_stopping_for_a_later_workload_stays_its_own() -> None:
    # Nothing else to evict: the older workload may not take what stops for the newer one.
    active = (
        running("r1", "s1", {"n1": range(8)}, team="steady"),
        running("r2", "s1", {"n2": range(8)}, team="borrower", preempting=True, preempted_for="b"),
    )
    queue = (pending("a", at=1, team="owner", gpus=8), pending("b", at=2, team="owner", gpus=8))
    result = run(*queue, active=active)
    assert why(result)["a"][0] == "insufficient_free"
    assert result.unplaced[1].waiting_for == ("r2",)
    assert result.preemptions == ()


def test_gang_counts_a_partly_free_node_once() -> None:
    policy = Policy(teams=(Team("owner", quotas={"H100": Quota(8)}), Team("borrower")))
    active = (
        running("v2", "s1", {"n2": range(8)}, started=1, team="borrower"),
        running("v1", "s1", {"n1": range(4)}, started=2, team="borrower"),
    )
    result = run(pending("g", team="owner", gpus=4, nodes=2), active=active, policy=policy)
    assert victims(result) == ["v2"]


def test_freed_devices_go_to_the_workload_they_were_freed_for() -> None:
    """Once its victims stopped, the claimant goes before everything, so the victims (older,
    or of a higher class) do not take the devices back and get preempted again, forever."""
    from hub.core.model import Node, Snapshot, Spoke, Workload
    from hub.core.policy import Policy
    from schemas import SpokeKind, WorkloadSpec

    def spec(name: str, klass: str) -> WorkloadSpec:
        return WorkloadSpec(
            name=name, team="t", priority_class=klass, command=("x",), gpus_per_node=4
        )

    node = Node(name="n0", gpu_model="H100", gpu_count=4, free=(0, 1, 2, 3))
    snapshot = Snapshot(spokes=(Spoke(id="s", region="eu", kind=SpokeKind.ONPREM, nodes=(node,)),))
    victim = Workload("victim", spec("victim", "training"), submitted_at=0.0)
    claimant = Workload("claimant", spec("claimant", "batch"), submitted_at=50.0, claims_freed=True)
    result = plan(snapshot, [victim, claimant], [], Policy(), now=100.0)
    assert [p.workload_id for p in result.placements] == ["claimant"]
