"""Cloud burst in the replay: `immediate` launches at once, gpufed's planner waits and packs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from burst.catalog import Catalog, parse_catalog
from burst.core import BurstPolicy
from gpufed.replay.fleet import Fleet, fleet_from_dict
from gpufed.replay.runner import ReplayRun, ReplaySetup, run_replay
from gpufed.replay.simulator import SimConfig
from gpufed.replay.traces import Job
from hub.core.policy import Consolidation, Policy, Team

CATALOG = """
as_of: 2025-01-15
instance_types:
  - {name: one.gpu, gpu_model: L4, gpu_count: 1, gpu_memory_gib: 24, vcpus: 4,
     prices: {us-east-1: {on_demand: 1.0}}}
  - {name: two.gpu, gpu_model: L4, gpu_count: 2, gpu_memory_gib: 24, vcpus: 8,
     prices: {us-east-1: {on_demand: 1.5}}}
"""


def catalog() -> Catalog:
    return parse_catalog(CATALOG)


def one_gpu() -> Fleet:
    node = {"name": "n0", "gpu_model": "A100", "gpu_count": 1}
    return fleet_from_dict({"spokes": [{"id": "dc", "region": "eu", "nodes": [node]}]})


def jobs(n: int, duration: float = 1000.0) -> list[Job]:
    return [Job(f"j{i}", 0.0, duration, "ml", 1, 1) for i in range(n)]


def replay(burst: str, policy: Policy | None = None, **knobs: float | bool) -> ReplayRun:
    setup = ReplaySetup(
        one_gpu(),
        policy or Policy(),
        catalog(),
        burst=burst,
        burst_policy=BurstPolicy(**knobs),
        boot_s=120.0,
        sim=SimConfig(cycle_s=1.0),
    )
    return run_replay(jobs(3), setup)


def test_immediate_launches_an_instance_for_every_unplaceable_job_at_once() -> None:
    run = replay("immediate")
    launched = [(i.launched_at, i.instance_type) for i in run.cloud.instances]
    assert launched == [(0.0, "one.gpu"), (0.0, "one.gpu")]  # one each, the cheapest fit
    assert run.outcome.first_start == [0.0, 120.0, 120.0]  # after the boot delay
    # Released as soon as a cycle finds it idle: billed from launch to the job's end.
    assert [i.terminated_at for i in run.cloud.instances] == [1120.0, 1120.0]


def test_gpufed_burst_waits_burst_after_and_packs_the_demand() -> None:
    run = replay("gpufed", burst_after_s=60.0, idle_ttl_s=300.0, cooldown_s=0.0, right_size=False)
    (instance,) = run.cloud.instances
    assert instance.launched_at == pytest.approx(60.0, abs=1e-3)  # not before burst_after
    assert instance.instance_type == "two.gpu"  # both jobs on one instance
    assert run.outcome.first_start[1:] == [pytest.approx(180.0, abs=1e-3)] * 2
    # Released after idle_ttl once both jobs are done.
    assert instance.terminated_at == pytest.approx(180.0 + 1000.0 + 300.0, abs=1e-3)
    assert instance.cost(0.0) == pytest.approx(1.5 * (1480.0 - 60.0) / 3600.0, rel=1e-6)


def test_no_burst_leaves_the_queue_to_on_prem() -> None:
    run = replay("none")
    assert run.cloud.instances == []
    assert run.outcome.first_start == [0.0, 1000.0, 2000.0]


def test_teams_that_may_not_burst_get_no_instances() -> None:
    policy = Policy(teams=(Team("ml", may_burst=False),))
    for burst in ("immediate", "gpufed"):
        run = replay(burst, policy, burst_after_s=0.0)
        assert run.cloud.instances == []
        assert run.outcome.first_start == [0.0, 1000.0, 2000.0]


def test_an_idle_instance_serves_only_the_team_it_was_launched_for() -> None:
    knobs = BurstPolicy(burst_after_s=0.0, idle_ttl_s=1000.0, cooldown_s=0.0)
    setup = ReplaySetup(one_gpu(), Policy(), catalog(), burst="gpufed", burst_policy=knobs)
    mixed = [Job("j0", 0.0, 5000.0, "ml", 1, 1), Job("j1", 0.0, 50.0, "ml", 1, 1)]
    mixed.append(Job("j2", 200.0, 50.0, "web", 1, 1))
    run = run_replay(mixed, setup)
    # ml's instance sits idle from 170, but web's job waits for an instance of its own.
    assert run.outcome.first_start == [0.0, 120.0, 320.0]
    assert [i.team for i in run.cloud.instances] == ["ml", "web"]


def test_right_sized_instances_are_released_as_their_own_job_ends() -> None:
    def run(right_size: bool) -> ReplayRun:
        knobs = BurstPolicy(burst_after_s=0.0, idle_ttl_s=60.0, cooldown_s=0.0)
        knobs = replace(knobs, right_size=right_size)
        setup = ReplaySetup(one_gpu(), Policy(), catalog(), burst="gpufed", burst_policy=knobs)
        short_and_long = [Job("j0", 0.0, 5000.0, "ml", 1, 1), Job("j1", 0.0, 100.0, "ml", 1, 1)]
        short_and_long.append(Job("j2", 0.0, 5000.0, "ml", 1, 1))
        return run_replay(short_and_long, setup)

    packed, sized = run(False), run(True)
    assert [i.instance_type for i in packed.cloud.instances] == ["two.gpu"]
    assert [i.instance_type for i in sized.cloud.instances] == ["one.gpu", "one.gpu"]
    # Same starts, but the short job's own instance goes an idle_ttl after it ends, while the
    # packed one is billed for both GPUs until the long job ends.
    assert sized.outcome.first_start == packed.outcome.first_start
    end = 10_000.0
    assert sum(i.cost(end) for i in sized.cloud.instances) < packed.cloud.instances[0].cost(end)


def test_a_long_cloud_job_moves_on_prem_once_on_prem_frees_and_its_instance_goes() -> None:
    node = {"name": "n0", "gpu_model": "A100", "gpu_count": 2}
    two = fleet_from_dict({"spokes": [{"id": "dc", "region": "eu", "nodes": [node]}]})
    knobs = BurstPolicy(burst_after_s=0.0, idle_ttl_s=60.0, cooldown_s=0.0)
    policy = Policy(consolidation=Consolidation(enabled=True, after_s=600.0))
    setup = ReplaySetup(
        two, policy, catalog(), burst="gpufed", burst_policy=knobs, sim=SimConfig(cycle_s=1.0)
    )
    trace = [Job(f"j{i}", 0.0, 1000.0, "ml", 1, 1) for i in range(2)]
    trace.append(Job("long", 0.0, 10_000.0, "ml", 1, 1))
    run = run_replay(trace, setup)
    long = [(start, end, cloud) for start, end, i, cloud in run.outcome.segments if i == 2]
    # On the cloud from its boot; the on-prem jobs end at 1,000 s with nothing queued, and the
    # cycle then (it plans with an empty queue while cloud spokes are up) moves it: stopped 30 s
    # later (the grace), resumed on-prem at once with no work lost.
    assert long == [(120.0, 1030.0, True), (1030.0, 10_120.0, False)]
    assert run.outcome.preemptions == run.outcome.consolidations == 1
    (instance,) = run.cloud.instances
    assert instance.terminated_at == pytest.approx(1030.0 + 60.0, abs=1e-3)  # its idle_ttl


def test_without_consolidation_the_cloud_job_stays_there_to_its_end() -> None:
    node = {"name": "n0", "gpu_model": "A100", "gpu_count": 2}
    two = fleet_from_dict({"spokes": [{"id": "dc", "region": "eu", "nodes": [node]}]})
    knobs = BurstPolicy(burst_after_s=0.0, idle_ttl_s=60.0, cooldown_s=0.0)
    setup = ReplaySetup(
        two, Policy(), catalog(), burst="gpufed", burst_policy=knobs, sim=SimConfig(cycle_s=1.0)
    )
    trace = [Job(f"j{i}", 0.0, 1000.0, "ml", 1, 1) for i in range(2)]
    trace.append(Job("long", 0.0, 10_000.0, "ml", 1, 1))
    trace.append(Job("later", 1500.0, 10.0, "ml", 1, 1))
    run = run_replay(trace, setup)
    assert [(s, e, c) for s, e, i, c in run.outcome.segments if i == 2] == [(120.0, 10_120.0, True)]
    assert run.outcome.preemptions == 0
