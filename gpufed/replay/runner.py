"""One replay end to end: pick the scheduler and burst setting, run, and run the reference.

`run_replay` is what `gpufed replay` and bench/replay_report.py call; it returns the raw
outcome(s) and `report.build_report` turns them into numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from burst.catalog import Catalog
from burst.core import BurstPolicy
from gpufed.replay.baselines import (
    SCHEDULERS,
    FifoScheduler,
    StaticScheduler,
    gpufed_scheduler,
    static_partition,
    window_wakeup,
)
from gpufed.replay.cloud import BURSTS, CloudBurst, make_burst
from gpufed.replay.cluster import Cluster
from gpufed.replay.fleet import Fleet
from gpufed.replay.simulator import Outcome, Progress, Scheduler, SimConfig, Simulator
from gpufed.replay.traces import Job
from hub.core.policy import Policy, quota_for


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    """Everything one replay needs besides the trace."""

    fleet: Fleet
    policy: Policy
    catalog: Catalog
    scheduler: str = "gpufed"
    burst: str = "none"
    burst_policy: BurstPolicy = field(default_factory=BurstPolicy)
    boot_s: float = 120.0
    sim: SimConfig = field(default_factory=SimConfig)
    start: float = 0.0  # the instant (epoch s) of virtual time 0, for the policy's time windows

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r}; use {', '.join(SCHEDULERS)}")
        if self.burst not in BURSTS:
            raise ValueError(f"unknown burst setting {self.burst!r}; use {', '.join(BURSTS)}")
        if self.boot_s < 0:
            raise ValueError("boot_s must not be negative")


@dataclass(slots=True)
class ReplayRun:
    """The outcome of one replay, with what the report needs to describe it."""

    setup: ReplaySetup
    outcome: Outcome
    cloud: CloudBurst
    guarantees: dict[str, float]
    unused_gpus: float = 0.0  # GPUs outside every guarantee (idle under `static`)
    isolated: Outcome | None = None  # the `static` run, for finish-time fairness


def run_replay(
    jobs: Sequence[Job],
    setup: ReplaySetup,
    *,
    progress: Callable[[Progress], None] | None = None,
    isolated: Outcome | None = None,
) -> ReplayRun:
    """Replay `jobs` under `setup`; `isolated` is a `static` outcome for fairness, if known."""
    fleet, unused = setup.fleet, 0.0
    scheduler: Scheduler
    if setup.scheduler == "static":
        fleet, unused = static_partition(setup.fleet, setup.policy)
        scheduler = StaticScheduler(setup.policy, incremental=setup.burst == "none")
    elif setup.scheduler == "fifo":
        scheduler = FifoScheduler(setup.policy)
    else:
        scheduler = gpufed_scheduler(setup.policy, setup.start)
    cloud = make_burst(setup.burst, setup.policy, setup.catalog, setup.burst_policy, setup.boot_s)
    simulator = Simulator(
        jobs,
        Cluster(fleet),
        scheduler,
        setup.sim,
        burst=cloud if setup.burst != "none" else None,
        progress=progress,
        capacity_gpus=setup.fleet.gpus,
        wakeup=window_wakeup(setup.policy, setup.start) if setup.scheduler == "gpufed" else None,
        plan_idle=setup.scheduler == "gpufed" and setup.policy.consolidation.enabled,
    )
    outcome = simulator.run()
    if setup.scheduler == "static" and setup.burst == "none":
        isolated = outcome  # partitions never interact: each team ran alone on its guarantee
    return ReplayRun(setup, outcome, cloud, guarantees(setup.policy, setup.fleet), unused, isolated)


def isolated_reference(
    jobs: Sequence[Job],
    setup: ReplaySetup,
    progress: Callable[[Progress], None] | None = None,
) -> Outcome:
    """Every team alone on its guarantee: the `static` scheduler without burst.

    Static partitions never share a device, so one run gives every team's isolated JCT.
    """
    reference = ReplaySetup(
        fleet=setup.fleet,
        policy=setup.policy,
        catalog=setup.catalog,
        scheduler="static",
        burst="none",
        sim=setup.sim,
    )
    return run_replay(jobs, reference, progress=progress).outcome


def guarantees(policy: Policy, fleet: Fleet) -> dict[str, float]:
    """GPUs guaranteed to each listed team over the fleet's on-prem GPU models."""
    models = {n.gpu_model for s in fleet.spokes for n in s.nodes}
    found = {}
    for team in policy.teams:
        total = 0.0
        for model in models:
            quota = quota_for(team.quotas, model)
            total += quota.guaranteed if quota is not None else 0.0
        found[team.name] = total
    return found
