"""The schedulers in the replay harness: static partitions, global FIFO, gpufed's plan()."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from burst.catalog import load_catalog
from gpufed.replay.baselines import static_partition
from gpufed.replay.fleet import Fleet, fleet_from_dict
from gpufed.replay.runner import ReplayRun, ReplaySetup, run_replay
from gpufed.replay.simulator import SimConfig
from gpufed.replay.traces import Job
from hub.core.policy import Policy, Quota, Team


def one_spoke(*nodes: int, model: str = "A100") -> Fleet:
    return fleet_from_dict(
        {
            "spokes": [
                {
                    "id": "dc",
                    "region": "eu",
                    "nodes": [
                        {"name": f"n{i}", "gpu_model": model, "gpu_count": g}
                        for i, g in enumerate(nodes)
                    ],
                }
            ]
        }
    )


def teams(**guaranteed: int) -> Policy:
    return Policy(
        teams=tuple(
            Team(name, quotas={"A100": Quota(guaranteed=float(g))})
            for name, g in guaranteed.items()
        )
    )


def job(i: int, submit: float, gpus: int, team: str, duration: float = 100.0) -> Job:
    return Job(f"j{i}", submit, duration, team, 1, gpus)


def replay(jobs: Sequence[Job], fleet: Fleet, policy: Policy, scheduler: str) -> ReplayRun:
    setup = ReplaySetup(
        fleet, policy, load_catalog(), scheduler=scheduler, sim=SimConfig(cycle_s=0.0)
    )
    return run_replay(jobs, setup)


def jct(run: ReplayRun, i: int) -> float | None:
    end = run.outcome.end[i]
    return None if end is None else end - run.outcome.jobs[i].submit


def test_static_team_cannot_use_another_teams_idle_gpus() -> None:
    fleet, policy = one_spoke(4, 4), teams(a=4, b=4)
    jobs = [job(0, 0, 4, "b"), job(1, 0, 4, "b")]  # team a submits nothing
    static = replay(jobs, fleet, policy, "static")
    assert [jct(static, 0), jct(static, 1)] == [100.0, 200.0]  # b's second job waits
    shared = replay(jobs, fleet, policy, "gpufed")
    assert [jct(shared, 0), jct(shared, 1)] == [100.0, 100.0]  # it borrows a's idle node


def test_static_team_without_guarantee_never_starts_and_is_reported() -> None:
    run = replay([job(0, 0, 1, "a"), job(1, 0, 1, "stray")], one_spoke(4), teams(a=4), "static")
    assert run.outcome.end[0] == 100.0
    assert run.outcome.end[1] is None
    assert run.outcome.waiting == {"j1": "reserved_for_other_teams"}


def test_static_partition_cuts_exact_guarantees_out_of_the_fleet() -> None:
    parts, unused = static_partition(one_spoke(8, 8), teams(a=6, b=6))
    sizes = {s.id: [n.gpu_count for n in s.nodes] for s in parts.spokes}
    assert sizes == {"static-a": [6], "static-b": [2, 4]}  # b's share spans both nodes
    assert unused == 4.0
    assert {s.id: s.reserved_for for s in parts.spokes} == {
        "static-a": ("a",),
        "static-b": ("b",),
    }


def test_fifo_head_of_line_blocking_holds_back_small_jobs() -> None:
    jobs = [job(0, 0, 6, "a"), job(1, 1, 4, "a"), job(2, 2, 1, "b", duration=10)]
    fifo = replay(jobs, one_spoke(8), Policy(), "fifo")
    # The 4-GPU job waits for the 6-GPU one; the 1-GPU job behind it waits too.
    assert fifo.outcome.first_start == [0.0, 100.0, 100.0]
    gpufed = replay(jobs, one_spoke(8), Policy(), "gpufed")
    assert gpufed.outcome.first_start == [0.0, 100.0, 2.0]  # plan() lets it go first


def test_fifo_sets_aside_a_job_too_big_for_the_fleet_instead_of_blocking_for_ever() -> None:
    jobs = [job(0, 0, 16, "a"), job(1, 1, 2, "a")]
    run = replay(jobs, one_spoke(8), Policy(), "fifo")
    assert run.outcome.first_start == [None, 1.0]
    assert run.outcome.waiting == {"j0": "shape_never_fits"}


def test_gpufed_beats_static_when_busy_teams_can_borrow_idle_guarantees() -> None:
    fleet, policy = one_spoke(8, 8, 8, 8), teams(a=8, b=8, c=8, d=8)
    # Team a has a burst of work while b, c and d are mostly idle.
    jobs = [job(i, float(i), 8, "a") for i in range(8)] + [job(8, 50.0, 8, "b")]
    static = replay(jobs, fleet, policy, "static")
    shared = replay(jobs, fleet, policy, "gpufed")
    static_jct = sum(j for i in range(9) if (j := jct(static, i)) is not None) / 9
    shared_jct = sum(j for i in range(9) if (j := jct(shared, i)) is not None) / 9
    assert shared_jct * 2 <= static_jct
    # b still gets its guarantee at once: borrowed work is reclaimed for it.
    assert shared.outcome.first_start[8] == pytest.approx(50.0 + 30.0)  # preempt grace
