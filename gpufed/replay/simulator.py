"""The replay's virtual-time loop: arrivals, scheduling cycles, completions, preemptions.

Jobs arrive at their submit time and wait as `Workload`s; a scheduling cycle hands the fleet
(`Cluster.snapshot()`), the queue and the running work to the scheduler (gpufed's `plan()` or a
baseline) and applies the `Plan` the way the hub does, moving each job through the hub's own
lifecycle (`hub.core.lifecycle`: every placement an attempt under a new epoch):

- a placement takes the devices at once (the simulated spoke starts the job) and the job ends
  after its remaining work;
- a preemption marks the job `preempting` (with `preempted_for`), as the hub does once its
  Preempt command went out; the spoke stops it `preempt_grace_s` later, frees its devices and
  the job is queued again with its original submit time. With `on_preempt="resume"` it keeps
  the work it has done (checkpointed training), with `"restart"` it starts over. Moves of
  cloud work back on-prem (`hub.core.consolidate`) are such preemptions, also counted apart;
- unplaced jobs stay queued (their last reason is kept for the report).

Cycles are coalesced like the hub's debounce: one runs after something changed (an arrival, a
completion, a stop, a cloud spoke joining or leaving), at most once per `cycle_s` of virtual
time, and none while the queue is empty. A cycle in which nothing changed would plan the same
again, so none is run.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpufed.replay.cluster import Cluster
from gpufed.replay.traces import Job
from hub.core import lifecycle
from hub.core.consolidate import CONSOLIDATE
from hub.core.lifecycle import EndReason, Lifecycle, RetryRules
from hub.core.model import Plan, RunningWorkload, Snapshot, Workload
from schemas import SpokeKind, WorkloadSpec

#: A scheduling cycle: fleet, queue (in arrival order) and running work in, a Plan out.
Scheduler = Callable[[Snapshot, Collection[Workload], Collection[RunningWorkload], float], Plan]

_EMPTY = Plan()
#: Replayed jobs neither fail nor get cancelled; a preempted one is requeued (free of restarts).
_RULES = RetryRules()
_END, _STOP, _BURST = 0, 1, 2


class BurstHooks(Protocol):
    """What the simulator tells the cloud-burst side (cloud.py), and when."""

    def after_cycle(self, sim: Simulator, now: float, plan: Plan) -> None:
        """A scheduling cycle was applied (or skipped: `plan` is empty)."""

    def on_event(self, sim: Simulator, now: float, payload: object) -> None:
        """An event the burst side scheduled with `Simulator.schedule` is due."""

    def on_load(self, sim: Simulator, now: float, spoke_id: str, workloads: int) -> None:
        """The number of workloads on a cloud spoke changed to `workloads`."""


_WEEK_S = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of the virtual-time loop (seconds of virtual time)."""

    cycle_s: float = 10.0
    preempt_grace_s: float = 30.0
    on_preempt: str = "resume"  # or "restart"

    def __post_init__(self) -> None:
        if self.cycle_s < 0 or self.preempt_grace_s < 0:
            raise ValueError("cycle_s and preempt_grace_s must not be negative")
        if self.on_preempt not in ("resume", "restart"):
            raise ValueError("on_preempt must be 'resume' or 'restart'")


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a replay stands, for the progress line."""

    now: float
    done: int
    total: int
    pending: int
    running: int
    utilization: float  # allocated on-prem GPU-time / capacity GPU-time so far
    wall_s: float


@dataclass(slots=True)
class Outcome:
    """What happened to every job, for the metrics."""

    jobs: Sequence[Job]
    capacity_gpus: int
    first_start: list[float | None]
    end: list[float | None]
    # (start, end, job index, on a cloud spoke) per stretch a job held devices
    segments: list[tuple[float, float, int, bool]] = field(default_factory=list)
    preemptions: int = 0
    consolidations: int = 0  # of the preemptions: cloud work moved on-prem (hub.core.consolidate)
    cycles: int = 0
    waiting: dict[str, str] = field(default_factory=dict)  # job never started -> last reason
    finished_at: float = 0.0
    wall_s: float = 0.0


class Simulator:
    """Replays `jobs` on `cluster` with `scheduler`; `run()` returns the Outcome."""

    def __init__(
        self,
        jobs: Sequence[Job],
        cluster: Cluster,
        scheduler: Scheduler,
        config: SimConfig | None = None,
        burst: BurstHooks | None = None,
        progress: Callable[[Progress], None] | None = None,
        capacity_gpus: int | None = None,
        wakeup: Callable[[float], float | None] | None = None,
        plan_idle: bool = False,
    ) -> None:
        # `wakeup(now)`: the next virtual time the scheduler's inputs change by themselves (a
        # policy time window starts or ends); a cycle runs there while work is pending.
        self.wakeup = wakeup
        # Plan with an empty queue too while cloud spokes are up (consolidation moves their
        # work home), as the hub does with consolidation on.
        self.plan_idle = plan_idle
        self.jobs = jobs
        self.cluster = cluster
        self.scheduler = scheduler
        self.config = config or SimConfig()
        self.burst = burst
        self.progress = progress
        n = len(jobs)
        if any(jobs[k].submit > jobs[k + 1].submit for k in range(n - 1)):
            raise ValueError("jobs must be sorted by submit time")
        capacity = capacity_gpus
        if capacity is None:
            capacity = sum(
                s.spec.gpus for s in cluster.spokes.values() if s.spec.kind is SpokeKind.ONPREM
            )
        self.outcome = Outcome(jobs, capacity, [None] * n, [None] * n)
        self.index = {job.id: i for i, job in enumerate(jobs)}
        self.workloads = _workloads(jobs)
        self.remaining = [job.duration for job in jobs]
        self.attained = [0.0] * n  # GPU-seconds run in earlier stretches (ordering las)
        self.lifecycles = [Lifecycle()] * n
        self.started = [0.0] * n  # start of the current stretch
        self.pending: dict[str, Workload] = {}
        self.running: dict[str, RunningWorkload] = {}
        self.reasons: dict[str, str] = {}
        self.now = 0.0
        self.done = 0
        self._heap: list[tuple[float, int, int, int, object]] = []
        self._seq = 0
        self._dirty = False
        self._cycle_at = -math.inf
        self._last_cycle = -math.inf
        self._last_event = 0.0  # virtual time of the last thing that happened besides a wakeup
        self._allocated = 0.0  # on-prem GPUs held now
        self._integral = 0.0  # on-prem GPU-seconds held so far
        self._clock = 0.0
        self._next_report = 0
        self._wall0 = 0.0

    def schedule(self, at: float, payload: object) -> None:
        """Call the burst side's `on_event(payload)` at virtual time `at`."""
        self._push(at, _BURST, -1, payload)

    def changed(self) -> None:
        """Something the scheduler should see changed: run a cycle soon."""
        if not self._dirty:
            self._dirty = True
            self._cycle_at = max(self.now, self._last_cycle + self.config.cycle_s)

    def run(self) -> Outcome:
        """Replay every job until nothing is left to happen."""
        self._wall0 = time.perf_counter()
        jobs, heap, n = self.jobs, self._heap, len(self.jobs)
        arrived = 0
        while True:
            t = jobs[arrived].submit if arrived < n else math.inf
            if heap and heap[0][0] < t:
                t = heap[0][0]
            if self._dirty and self._cycle_at < t:
                t = self._cycle_at
            woke = self._woken_before(t)
            if woke is not None:
                t = woke
            if t == math.inf:
                break
            if woke is None:
                self._last_event = t
            self._advance(t)
            while arrived < n and jobs[arrived].submit <= t:
                self._arrive(arrived)
                arrived += 1
            while heap and heap[0][0] <= t:
                _, _, kind, i, payload = heapq.heappop(heap)
                if kind == _END:
                    self._end(i, payload)
                elif kind == _STOP:
                    self._stop(i, payload)
                elif self.burst is not None:
                    self.burst.on_event(self, t, payload)
            if woke is not None:
                self.changed()
            if self._dirty and self._cycle_at <= t:
                self._cycle(t)
        return self._finish()

    def _woken_before(self, t: float) -> float | None:
        """A policy change before `t` while work waits, or None.

        With nothing else left to happen, pending work gets one more week of policy changes
        (a window might let it run); after that the replay ends and reports it as waiting.
        """
        if self.wakeup is None or not self.pending:
            return None
        at = self.wakeup(self.now)
        if at is None or at >= t:
            return None
        if t == math.inf and at > self._last_event + _WEEK_S:
            return None
        return at

    # --- events ---

    def _advance(self, t: float) -> None:
        self._integral += self._allocated * (t - self._clock)
        self._clock = self.now = t

    def _arrive(self, i: int) -> None:
        workload = self.workloads[i]
        self.pending[workload.id] = workload
        self.changed()

    def _end(self, i: int, epoch: object) -> None:
        if not self._live(i, epoch):
            return  # stopped (preempted) before it could finish
        job = self.jobs[i]
        self._release(i, job, EndReason.SUCCEEDED)
        self.outcome.end[i] = self.now
        self.done += 1
        if self.progress is not None and self.done >= self._next_report:
            self._report()
        self.changed()

    def _stop(self, i: int, epoch: object) -> None:
        if not self._live(i, epoch):
            return  # it finished during its grace period
        job = self.jobs[i]
        self._release(i, job, EndReason.PREEMPTED)
        if self.config.on_preempt == "resume":
            self.remaining[i] -= self.now - self.started[i]
        else:
            self.remaining[i] = job.duration
        workload = self.workloads[i]
        self.attained[i] += (self.now - self.started[i]) * workload.spec.total_gpus
        self.pending[job.id] = replace(workload, attained_gpu_s=self.attained[i])
        self.changed()

    def _live(self, i: int, epoch: object) -> bool:
        live = self.lifecycles[i].live
        return live is not None and live.epoch == epoch

    def _release(self, i: int, job: Job, reason: EndReason) -> None:
        running = self.running.pop(job.id)
        lc = self.lifecycles[i]
        lc = self.lifecycles[i] = lifecycle.end(lc, lc.epoch, reason, self.now, _RULES)
        claimant = lifecycle.freed_for(lc.attempts[-1])
        if claimant is not None and claimant in self.pending:
            # As the hub does: the workload the victim stopped for goes first next cycle.
            self.pending[claimant] = replace(self.pending[claimant], claims_freed=True)
        cloud = self.cluster.is_cloud(running.spoke_id)
        self.cluster.give_back(running.spoke_id, running.assignments)
        self.outcome.segments.append((self.started[i], self.now, i, cloud))
        if cloud:
            if self.burst is not None:
                load = self.cluster.spokes[running.spoke_id].workloads
                self.burst.on_load(self, self.now, running.spoke_id, load)
        else:
            self._allocated -= job.gpus

    # --- cycles ---

    def _cycle(self, now: float) -> None:
        self._dirty = False
        self._last_cycle = now
        result = _EMPTY
        if self.pending or (self.plan_idle and self._cloud_up()):
            self.outcome.cycles += 1
            snapshot = self.cluster.snapshot()
            result = self.scheduler(snapshot, self.pending.values(), self.running.values(), now)
            self._apply(result, now)
        if self.burst is not None:
            self.burst.after_cycle(self, now, result)

    def _cloud_up(self) -> bool:
        return any(s.spec.kind is not SpokeKind.ONPREM for s in self.cluster.spokes.values())

    def _apply(self, result: Plan, now: float) -> None:
        index, jobs, cluster = self.index, self.jobs, self.cluster
        for placement in result.placements:
            workload = self.pending.pop(placement.workload_id)
            i = index[workload.id]
            cluster.take(placement.spoke_id, placement.assignments)
            # The simulated spoke starts it at once.
            lc = lifecycle.place(self.lifecycles[i], placement.spoke_id, placement.assignments, now)
            lc = self.lifecycles[i] = lifecycle.start(lc, lc.epoch, now)
            self.running[workload.id] = RunningWorkload(
                workload.id,
                workload.spec,
                placement.spoke_id,
                placement.assignments,
                now,
                attained_gpu_s=self.attained[i],
            )
            if self.outcome.first_start[i] is None:
                self.outcome.first_start[i] = now
            self.started[i] = now
            self._push(now + self.remaining[i], _END, i, lc.epoch)
            if cluster.is_cloud(placement.spoke_id):
                if self.burst is not None:
                    load = cluster.spokes[placement.spoke_id].workloads
                    self.burst.on_load(self, now, placement.spoke_id, load)
            else:
                self._allocated += jobs[i].gpus
        for preemption in result.preemptions:
            victim = self.running.get(preemption.workload_id)
            if victim is None or victim.preempting:
                continue
            self.running[victim.id] = replace(
                victim, preempting=True, preempted_for=preemption.for_workload or None
            )
            self.outcome.preemptions += 1
            if preemption.reason.startswith(CONSOLIDATE):
                self.outcome.consolidations += 1
            i = index[victim.id]
            lc = self.lifecycles[i]
            for_workload = preemption.for_workload or None
            lc = self.lifecycles[i] = lifecycle.mark_preempting(lc, lc.epoch, for_workload)
            self._push(now + self.config.preempt_grace_s, _STOP, i, lc.epoch)
        reasons = self.reasons
        for unplaced in result.unplaced:
            reasons[unplaced.workload_id] = unplaced.reason

    def _push(self, at: float, kind: int, i: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, i, payload))

    # --- reporting ---

    def _report(self) -> None:
        total = len(self.jobs)
        step = max(1, total // 20)
        self._next_report = (self.done // step + 1) * step
        assert self.progress is not None
        self.progress(self.snapshot_progress())

    def snapshot_progress(self) -> Progress:
        """Where the replay stands now."""
        capacity = self.outcome.capacity_gpus * self.now
        return Progress(
            now=self.now,
            done=self.done,
            total=len(self.jobs),
            pending=len(self.pending),
            running=len(self.running),
            utilization=self._integral / capacity if capacity > 0 else 0.0,
            wall_s=time.perf_counter() - self._wall0,
        )

    def _finish(self) -> Outcome:
        outcome = self.outcome
        outcome.finished_at = self.now
        outcome.waiting = {wid: self.reasons.get(wid, "never_scheduled") for wid in self.pending}
        outcome.wall_s = time.perf_counter() - self._wall0
        return outcome


def _workloads(jobs: Sequence[Job]) -> list[Workload]:
    """One Workload per job; jobs of the same shape share one validated spec."""
    specs: dict[tuple[object, ...], WorkloadSpec] = {}
    out = []
    for job in jobs:
        key = (job.team, job.nodes, job.gpus_per_node, job.fraction, job.gpu_models, job.priority)
        spec = specs.get(key)
        if spec is None:
            spec = specs[key] = WorkloadSpec(
                name="replay",
                team=job.team,
                priority_class=job.priority,
                command=("replay",),
                nodes=job.nodes,
                gpus_per_node=job.gpus_per_node,
                gpu_fraction=job.fraction,
                gpu_models=job.gpu_models,
            )
        out.append(Workload(job.id, spec, job.submit))
    return out
