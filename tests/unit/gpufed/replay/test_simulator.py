"""The virtual-time loop: cycles, completions, preemption and requeueing, as the hub does."""

from __future__ import annotations

import pytest

from gpufed.replay.baselines import gpufed_scheduler
from gpufed.replay.cluster import Cluster
from gpufed.replay.fleet import Fleet, fleet_from_dict
from gpufed.replay.simulator import Progress, SimConfig, Simulator
from gpufed.replay.traces import Job
from hub.core.policy import Policy, Quota, Team


def fleet(*nodes: int) -> Fleet:
    entries = [{"name": f"n{i}", "gpu_model": "A100", "gpu_count": g} for i, g in enumerate(nodes)]
    return fleet_from_dict({"spokes": [{"id": "dc", "region": "eu", "nodes": entries}]})


def job(i: int, submit: float, gpus: float, team: str = "a", duration: float = 100.0) -> Job:
    if gpus < 1:
        return Job(f"j{i}", submit, duration, team, 1, 1, gpus)
    return Job(f"j{i}", submit, duration, team, 1, int(gpus))


def two_teams() -> Policy:
    quota = {"A100": Quota(guaranteed=4.0)}
    return Policy(teams=(Team("a", quotas=quota), Team("b", quotas=quota)))


@pytest.mark.parametrize(("on_preempt", "end"), [("resume", 141.0), ("restart", 200.0)])
def test_reclaimed_job_is_requeued_and_resumes_or_restarts(on_preempt: str, end: float) -> None:
    jobs = [
        job(0, 0, 4, "b"),  # within b's guarantee
        job(1, 1, 4, "b"),  # borrows a's idle guarantee
        job(2, 50, 4, "a"),  # a wants its guarantee back
    ]
    config = SimConfig(cycle_s=0.0, preempt_grace_s=10.0, on_preempt=on_preempt)
    sim = Simulator(jobs, Cluster(fleet(8)), gpufed_scheduler(two_teams()), config)
    out = sim.run()
    assert out.preemptions == 1
    assert out.first_start == [0.0, 1.0, 60.0]  # a starts once the victim has stopped
    assert out.end[2] == 160.0
    # The victim ran 1..60, waited for b's other job to end at 100, then ran the rest.
    assert out.end[1] == end
    assert out.segments[0] == (1.0, 60.0, 1, False)


def test_cycles_run_at_most_once_per_cycle_s() -> None:
    jobs = [job(0, 0, 1), job(1, 1, 1), job(2, 2, 1), job(3, 25, 1)]
    sim = Simulator(jobs, Cluster(fleet(8)), gpufed_scheduler(Policy()), SimConfig(cycle_s=10))
    out = sim.run()
    # Arrivals at 1 and 2 wait for the cycle at 10; the one at 25 finds the cluster quiet.
    assert out.first_start == [0.0, 10.0, 10.0, 25.0]
    assert out.cycles == 3


def test_fractions_share_a_device_and_never_overcommit_it() -> None:
    jobs = [job(0, 0, 0.5), job(1, 0, 0.5), job(2, 0, 0.5)]
    out = Simulator(jobs, Cluster(fleet(1)), gpufed_scheduler(Policy()), SimConfig(0.0)).run()
    assert out.first_start == [0.0, 0.0, 100.0]
    assert out.end == [100.0, 100.0, 200.0]


def test_progress_reports_jobs_done_and_utilisation() -> None:
    seen: list[Progress] = []
    jobs = [job(i, 0, 2) for i in range(4)]
    sim = Simulator(
        jobs, Cluster(fleet(4)), gpufed_scheduler(Policy()), SimConfig(0.0), progress=seen.append
    )
    sim.run()
    assert [p.done for p in seen] == [1, 2, 3, 4]  # one report per 5 % of the jobs at least
    assert seen[-1].utilization == pytest.approx(1.0)  # 4 GPUs busy from 0 to 200
    assert seen[-1].now == 200.0 and seen[-1].pending == 0


def test_cluster_refuses_to_give_a_device_twice() -> None:
    from schemas import Assignment

    cluster = Cluster(fleet(2))
    cluster.take("dc", [Assignment(node="n0", devices=(0,))])
    with pytest.raises(ValueError, match="GPU 0 is not free"):
        cluster.take("dc", [Assignment(node="n0", devices=(0,))])
    view = cluster.snapshot().spokes[0].nodes[0]
    assert view.free == (1,)
