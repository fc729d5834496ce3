"""Replay honours the policy's time windows: the same pure function as the hub, and a cycle at
every window boundary while work waits."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufed.replay.baselines import gpufed_scheduler, window_wakeup
from gpufed.replay.cluster import Cluster
from gpufed.replay.fleet import Fleet, fleet_from_dict
from gpufed.replay.simulator import SimConfig, Simulator
from gpufed.replay.traces import Job
from hub.policyfile import load_policy

# Nights: research holds the whole guarantee; weekdays 08:00-20:00 UTC serving gets half.
POLICY = """
teams:
  - name: research
    quotas: {A100: {guaranteed: 8}}
  - name: serving
    quotas: {A100: {guaranteed: 0}}
windows:
  - name: day
    days: weekdays
    start: "08:00"
    end: "20:00"
    teams:
      research: {quotas: {A100: {guaranteed: 4}}}
      serving: {quotas: {A100: {guaranteed: 4}}}
"""
START = datetime(2026, 11, 30, 6, 0, tzinfo=UTC).timestamp()  # Monday 06:00 UTC
EIGHT_AM = 2 * 3600.0  # virtual seconds from START to 08:00


def fleet() -> Fleet:
    node = {"name": "n0", "gpu_model": "A100", "gpu_count": 8}
    return fleet_from_dict({"spokes": [{"id": "dc", "region": "eu", "nodes": [node]}]})


def replay(wakeup: bool) -> tuple[list[float | None], int]:
    policy = load_policy(POLICY)
    jobs = [
        Job("research", 0.0, 6 * 3600.0, "research", 1, 8),  # all 8 GPUs, within its guarantee
        Job("serving", 600.0, 3600.0, "serving", 1, 4),  # waits: no guarantee at night
    ]
    sim = Simulator(
        jobs,
        Cluster(fleet()),
        gpufed_scheduler(policy, START),
        SimConfig(cycle_s=10.0, preempt_grace_s=30.0),
        wakeup=window_wakeup(policy, START) if wakeup else None,
    )
    out = sim.run()
    return out.first_start, out.preemptions


def test_the_day_window_reclaims_at_eight_for_the_waiting_team() -> None:
    first_start, preemptions = replay(wakeup=True)
    serving = first_start[1]
    assert serving is not None
    # Not before 08:00 (research's night guarantee is not reclaimable), and at 08:00 the hub
    # reclaims: the victim gets its grace period, then serving starts.
    assert EIGHT_AM <= serving <= EIGHT_AM + 10.0 + 30.0 + 10.0
    assert preemptions == 1


def test_without_a_cycle_at_the_boundary_the_reclaim_would_wait_for_the_next_event() -> None:
    # The control: nothing else happens until research ends at 06:00 virtual, so serving would
    # start only then. The wakeup is what makes replay switch where the hub switches.
    first_start, preemptions = replay(wakeup=False)
    assert first_start[1] == 6 * 3600.0 and preemptions == 0
