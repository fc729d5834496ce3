"""Consolidation: work on a cloud spoke comes back on-prem once on-prem GPUs are free."""

from __future__ import annotations

from dataclasses import replace

from hub.core.consolidate import CONSOLIDATE
from hub.core.model import Plan, RunningWorkload
from hub.core.placement import plan
from hub.core.planstate import PlanState
from hub.core.policy import Consolidation, Policy, Team
from tests.unit.hub.core.builders import fleet, node, pending, running, spoke

HOUR = 3600.0
NOW = 10 * HOUR


def _policy(enabled: bool = True, after_s: float = HOUR, max_per_cycle: int = 4) -> Policy:
    return Policy(
        teams=(Team("vision", may_burst=True),),
        consolidation=Consolidation(enabled, after_s, max_per_cycle),
    )


def _fleet(onprem_free: tuple[int, ...] = (0, 1, 2, 3), cloud_free: tuple[int, ...] = ()):
    return fleet(
        spoke("onprem", node("n1", gpus=4, free=onprem_free)),
        spoke(
            "burst-1",
            node("c1", gpus=4, free=cloud_free),
            cloud=True,
            price=3.0,
            reserved_for=("vision",),
        ),
    )


def _on_cloud(wid: str = "long", started: float = 0.0, **kw: object) -> RunningWorkload:
    return running(wid, "burst-1", {"c1": [0, 1, 2, 3]}, started=started, **kw)


def _moved(result: Plan) -> list[str]:
    return [p.workload_id for p in result.preemptions if p.reason.startswith(CONSOLIDATE)]


def test_a_cloud_job_is_stopped_to_move_on_prem_once_on_prem_gpus_are_free() -> None:
    result = plan(_fleet(), [], [_on_cloud()], _policy(), NOW)
    assert _moved(result) == ["long"]
    (stop,) = result.preemptions
    assert stop.spoke_id == "burst-1" and stop.for_workload == ""
    assert "on-prem" in stop.reason


def test_queued_again_it_goes_on_prem_not_back_to_the_instance_it_left() -> None:
    again = pending("long", gpus=4)
    result = plan(_fleet(cloud_free=(0, 1, 2, 3)), [again], [], _policy(), NOW)
    assert [(p.workload_id, p.spoke_id) for p in result.placements] == [("long", "onprem")]


def test_work_waiting_on_prem_is_served_before_any_move() -> None:
    result = plan(_fleet(), [pending("new", gpus=4, at=NOW)], [_on_cloud()], _policy(), NOW)
    assert [p.workload_id for p in result.placements] == ["new"]
    assert result.preemptions == ()


def test_only_what_the_queue_leaves_free_is_offered() -> None:
    # 2 of the 4 free GPUs go to pending work: the 4-GPU cloud job no longer fits.
    result = plan(_fleet(), [pending("new", gpus=2, at=NOW)], [_on_cloud()], _policy(), NOW)
    assert _moved(result) == []
    small = running("small", "burst-1", {"c1": [0, 1]}, started=0.0)
    result = plan(_fleet(), [pending("new", gpus=2, at=NOW)], [small], _policy(), NOW)
    assert _moved(result) == ["small"]


def test_production_work_is_never_moved() -> None:
    result = plan(_fleet(), [], [_on_cloud(cls="production")], _policy(), NOW)
    assert result.preemptions == ()


def test_work_is_moved_only_after_running_long_enough_on_the_cloud() -> None:
    assert plan(_fleet(), [], [_on_cloud(started=NOW - 60)], _policy(), NOW).preemptions == ()
    assert _moved(plan(_fleet(), [], [_on_cloud(started=NOW - HOUR)], _policy(), NOW)) == ["long"]


def test_switched_off_nothing_moves() -> None:
    assert plan(_fleet(), [], [_on_cloud()], _policy(enabled=False), NOW).preemptions == ()
    assert plan(_fleet(), [], [_on_cloud()], Policy(), NOW).preemptions == ()


def test_moves_per_cycle_are_bounded_and_longest_running_go_first() -> None:
    snapshot = fleet(
        spoke("onprem", node("n1", gpus=8)),
        spoke("burst-1", node("c1", gpus=8, free=()), cloud=True, reserved_for=("vision",)),
    )
    jobs = [
        running(f"j{k}", "burst-1", {"c1": [k]}, started=float(100 * (8 - k))) for k in range(8)
    ]
    result = plan(snapshot, [], jobs, _policy(max_per_cycle=3), NOW)
    assert _moved(result) == ["j7", "j6", "j5"]


def test_two_moves_never_count_on_the_same_free_gpus() -> None:
    jobs = [
        running("a", "burst-1", {"c1": [0, 1, 2]}, started=0.0),
        running("b", "burst-1", {"c1": [3]}, started=1.0),
    ]
    free = fleet(
        spoke("onprem", node("n1", gpus=4, free=(0, 1, 2))),
        spoke("burst-1", node("c1", gpus=4, free=()), cloud=True, reserved_for=("vision",)),
    )
    assert _moved(plan(free, [], jobs, _policy(), NOW)) == ["a"]


def test_work_already_stopping_or_on_prem_is_left_alone() -> None:
    stopping = _on_cloud(preempting=True)
    onprem = running("here", "onprem", {"n1": [0]}, started=0.0)
    result = plan(_fleet(onprem_free=(1, 2, 3)), [], [stopping, onprem], _policy(), NOW)
    assert result.preemptions == ()


def test_the_kept_plan_state_moves_the_same_work() -> None:
    state = PlanState()
    runs = [_on_cloud()]
    for now in (NOW, NOW + 10):
        assert state.plan(_fleet(), [], runs, _policy(), now) == plan(
            _fleet(), [], runs, _policy(), now
        )
    runs = [replace(runs[0], preempting=True)]
    assert state.plan(_fleet(), [], runs, _policy(), NOW + 20).preemptions == ()
