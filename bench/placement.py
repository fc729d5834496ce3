"""Placement throughput and cycle latency on a synthetic fleet.

A fleet of 100 spokes x 64 nodes x 8 GPUs (H100/A100/L4, four regions, some cloud), a policy of
20 teams (two departments), and 10,000 pending workloads of mixed shapes (1/2/4/8 GPUs, gangs of
2-4 x 8, fractions). Prints one JSON object:

- placements_per_s: one full plan() from an empty fleet, placements / wall seconds;
- incremental_cycle_ms_p50 / _p99: after that, per iteration some work completes, last cycle's
  victims stop and are requeued, 100 new workloads arrive, and one plan runs over everything
  pending (only the plan is timed). The plan is the hub's: `hub.core.planstate.PlanState`,
  which keeps the fleet, the tally of running work and the queue's order between cycles and
  follows the changed nodes and workloads (told which workloads moved and which joined or
  left the queue, as the hub's cycle tells it; `untold` counts plans that had to read the
  queue through);
  `--from-scratch` times `hub.core.placement.plan()`, which sets both up from the whole
  snapshot each time (the same plans: `--check` compares every cycle);
- incremental_cycle_cpu_ms_p50 / _p99: the same cycles in this process's CPU time
  (`time.process_time()`), which other work on a shared machine inflates far less;
- pending, gpus: the size of the first cycle;
- machine_ref_us: how fast the machine ran the hub's Python just before (`bench/machine.py`).

Before each timed cycle the bench calls gc.freeze(), as a long-running hub can: the world this
process holds is large, and a full cyclic-GC pass over it (about 100 ms here) would land inside
a cycle now and then. `--gc` leaves the collector as it is, to see that effect.

Run: .venv/bin/python bench/placement.py [--iterations N] [--seed S] [--gc] [--from-scratch]
     [--check]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import machine

from hub.core.model import Node, Plan, RunningWorkload, Snapshot, Spoke, Workload
from hub.core.placement import plan
from hub.core.planstate import PlanState
from hub.core.policy import Department, Policy, Quota, Team
from schemas import Assignment, SpokeKind, WorkloadSpec

SPOKES = 100
NODES = 64
GPUS = 8
PENDING = 10_000
ARRIVALS = 100
REGIONS = ("us-east", "us-west", "eu-west", "ap-south")
MODELS = ("H100", "A100", "L4")
TEAMS = tuple(f"team-{i:02d}" for i in range(20))
CLASSES = (("production", 0.05), ("training", 0.30), ("dev", 0.20), ("batch", 0.45))


@dataclass
class NodeState:
    name: str
    model: str
    free: set[int] = field(default_factory=lambda: set(range(GPUS)))
    shared: dict[int, float] = field(default_factory=dict)
    view: Node | None = None  # as the last snapshot showed it; None once it changed

    def node(self) -> Node:
        if self.view is None:
            self.view = Node(
                self.name, self.model, GPUS, tuple(sorted(self.free)), dict(self.shared)
            )
        return self.view


@dataclass
class SpokeState:
    id: str
    region: str
    kind: SpokeKind
    price: float
    labels: dict[str, str]
    nodes: dict[str, NodeState]
    view: Spoke | None = None

    def spoke(self) -> Spoke:
        if self.view is None:
            self.view = Spoke(
                id=self.id,
                region=self.region,
                kind=self.kind,
                nodes=tuple(n.node() for n in self.nodes.values()),
                labels=self.labels,
                price_per_gpu_hour=self.price,
            )
        return self.view

    def touch(self, node: NodeState) -> None:
        node.view = None
        self.view = None


class Fleet:
    """The simulated world: what runs where, turned into a Snapshot each cycle."""

    def __init__(self, rng: random.Random) -> None:
        self.spokes: dict[str, SpokeState] = {}
        for s in range(SPOKES):
            cloud = s % 10 == 9
            model = rng.choices(MODELS, weights=(3, 4, 3))[0]
            second = rng.choice(MODELS) if rng.random() < 0.2 else model
            nodes = {
                f"node-{n:02d}": NodeState(f"node-{n:02d}", model if n < NODES // 2 else second)
                for n in range(NODES)
            }
            self.spokes[f"spoke-{s:03d}"] = SpokeState(
                id=f"spoke-{s:03d}",
                region=REGIONS[s % len(REGIONS)],
                kind=SpokeKind.CLOUD if cloud else SpokeKind.ONPREM,
                price=rng.uniform(2.0, 4.0) if cloud else 0.0,
                labels={"ib": "true"} if rng.random() < 0.3 else {},
                nodes=nodes,
            )
        self.running: dict[str, RunningWorkload] = {}
        # what started, ended or began stopping since the last plan (None: ended), as the
        # hub's cycle tells its PlanState (`moved`)
        self.moved: dict[str, RunningWorkload | None] = {}

    def snapshot(self) -> Snapshot:
        """The fleet now; nodes and spokes that did not change are the same objects as before
        (as the replay's cluster does), which lets `PlanState` skip them with an `is`."""
        return Snapshot(tuple(s.spoke() for s in self.spokes.values()))

    def models(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.spokes.values():
            for n in s.nodes.values():
                counts[n.model] = counts.get(n.model, 0) + GPUS
        return counts

    def take(self, spoke_id: str, a: Assignment) -> None:
        """`a`'s devices (or its share of them) are in use on `spoke_id`."""
        spoke = self.spokes[spoke_id]
        node = spoke.nodes[a.node]
        spoke.touch(node)
        for d in a.devices:
            if a.fraction is None:
                node.free.remove(d)
            else:
                if d in node.free:
                    node.free.remove(d)
                    node.shared[d] = 1.0
                node.shared[d] -= a.fraction

    def give(self, spoke_id: str, a: Assignment) -> None:
        """`a`'s devices (or its share of them) are free again on `spoke_id`."""
        spoke = self.spokes[spoke_id]
        node = spoke.nodes[a.node]
        spoke.touch(node)
        for d in a.devices:
            if a.fraction is None:
                node.free.add(d)
            else:
                node.shared[d] += a.fraction
                if node.shared[d] >= 1.0 - 1e-9:
                    del node.shared[d]
                    node.free.add(d)

    def apply(self, result: Plan, pending: dict[str, Workload], now: float) -> None:
        for p in result.placements:
            workload = pending.pop(p.workload_id)
            for a in p.assignments:
                self.take(p.spoke_id, a)
            self.running[workload.id] = self.moved[workload.id] = RunningWorkload(
                workload.id, workload.spec, p.spoke_id, p.assignments, now
            )
        for v in result.preemptions:
            r = self.running[v.workload_id]
            self.running[v.workload_id] = self.moved[v.workload_id] = RunningWorkload(
                r.id, r.spec, r.spoke_id, r.assignments, r.started_at, True, v.for_workload
            )

    def stop(self, workload_id: str) -> RunningWorkload:
        r = self.running.pop(workload_id)
        self.moved[workload_id] = None
        for a in r.assignments:
            self.give(r.spoke_id, a)
        return r


def make_policy(fleet: Fleet, rng: random.Random) -> Policy:
    totals = fleet.models()
    departments = (
        Department("research", {m: Quota(guaranteed=totals[m] * 0.2) for m in totals}),
        Department("product", {m: Quota(guaranteed=totals[m] * 0.15) for m in totals}),
    )
    teams = []
    for i, name in enumerate(TEAMS):
        dept = "research" if i < 5 else "product" if i < 10 else None
        share = 0.02 if dept else 0.035
        quotas = {}
        for m, total in totals.items():
            guaranteed = round(total * share * rng.uniform(0.5, 1.0))
            limit = None if rng.random() < 0.3 else guaranteed * 4 + 64
            quotas[m] = Quota(guaranteed=guaranteed, limit=limit)
        teams.append(
            Team(
                name,
                department=dept,
                quotas=quotas,
                weight=rng.choice((1.0, 1.0, 2.0, 3.0)),
                may_burst=rng.random() < 0.5,
            )
        )
    return Policy(teams=tuple(teams), departments=departments)


def make_workload(rng: random.Random, serial: int, now: float) -> Workload:
    shape = rng.random()
    extra: dict[str, object] = {}
    if shape < 0.25:
        extra["gpus_per_node"] = 1
    elif shape < 0.40:
        extra["gpus_per_node"] = 2
    elif shape < 0.60:
        extra["gpus_per_node"] = 4
    elif shape < 0.85:
        extra["gpus_per_node"] = 8
    elif shape < 0.92:
        extra["gpus_per_node"] = 8
        extra["nodes"] = rng.randint(2, 4)
    else:
        extra["gpu_fraction"] = rng.choice((0.25, 0.5))
    pick = rng.random()
    if pick < 0.5:
        extra["gpu_models"] = (rng.choice(MODELS),)
    elif pick < 0.75:
        extra["gpu_models"] = tuple(rng.sample(MODELS, 2))
    affinity: dict[str, object] = {}
    if rng.random() < 0.2:
        affinity["required_regions"] = (rng.choice(REGIONS),)
    elif rng.random() < 0.2:
        affinity["preferred_regions"] = (rng.choice(REGIONS),)
    if rng.random() < 0.1:
        affinity["required_labels"] = {"ib": "true"}
    spec = WorkloadSpec.model_validate(
        {
            "name": f"job-{serial}",
            "team": rng.choice(TEAMS),
            "priority_class": rng.choices([c for c, _ in CLASSES], [w for _, w in CLASSES])[0],
            "command": ["train"],
            "affinity": affinity,
            **extra,
        }
    )
    return Workload(f"w{serial:06d}", spec, now - rng.uniform(0, 4 * 3600))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gc", action="store_true", help="do not gc.freeze() before cycles")
    parser.add_argument(
        "--from-scratch", action="store_true", help="time plan(), not the kept PlanState"
    )
    parser.add_argument(
        "--check", action="store_true", help="compare every cycle's plan with plan()'s"
    )
    args = parser.parse_args()
    machine_ref_us = machine.reference_us()
    kept = PlanState()
    planner = plan if args.from_scratch else kept.plan
    rng = random.Random(args.seed)
    fleet = Fleet(rng)
    policy = make_policy(fleet, rng)
    now = 1_000_000.0
    serial = 0
    pending: dict[str, Workload] = {}
    for _ in range(PENDING):
        w = make_workload(rng, serial, now)
        pending[w.id] = w
        serial += 1

    snapshot = fleet.snapshot()
    started = time.perf_counter()
    first = planner(snapshot, list(pending.values()), [], policy, now)
    full_s = time.perf_counter() - started
    fleet.apply(first, pending, now)
    # what joined or left the queue since the last plan (None: left), as the hub's cycle
    # tells its PlanState (`queued`)
    queued: dict[str, Workload | None] = dict.fromkeys(p.workload_id for p in first.placements)

    cycles_ms: list[float] = []
    cpu_ms: list[float] = []
    preempted = 0
    for _ in range(args.iterations):
        now += 30.0
        for r in [r for r in fleet.running.values() if r.preempting]:
            stopped = fleet.stop(r.id)  # last cycle's victims are gone; requeue them
            pending[stopped.id] = queued[stopped.id] = Workload(
                stopped.id, stopped.spec, stopped.started_at
            )
        done = rng.sample(sorted(fleet.running), min(ARRIVALS, len(fleet.running)))
        for workload_id in done:
            if not fleet.running[workload_id].preempting:
                fleet.stop(workload_id)
        for _ in range(ARRIVALS):
            w = make_workload(rng, serial, now)
            w = Workload(w.id, w.spec, now)
            pending[w.id] = queued[w.id] = w
            serial += 1
        snapshot = fleet.snapshot()
        running = list(fleet.running.values())
        queue = list(pending.values())
        moved, fleet.moved = fleet.moved, {}
        told, queued = queued, {}
        if not args.gc:
            gc.freeze()  # long-lived state out of the collector, as a hub process can do
        started, cpu = time.perf_counter(), time.process_time()
        if args.from_scratch:
            result = plan(snapshot, queue, running, policy, now)
        else:
            result = kept.plan(snapshot, queue, running, policy, now, moved, told)
        cycles_ms.append((time.perf_counter() - started) * 1000)
        cpu_ms.append((time.process_time() - cpu) * 1000)
        if args.check and result != plan(snapshot, queue, running, policy, now):
            raise SystemExit("the kept state planned differently from plan()")
        preempted += len(result.preemptions)
        fleet.apply(result, pending, now)
        queued.update(dict.fromkeys(p.workload_id for p in result.placements))

    print(
        json.dumps(
            {
                "placements_per_s": round(len(first.placements) / full_s),
                "incremental_cycle_ms_p50": round(statistics.median(cycles_ms), 2),
                "incremental_cycle_ms_p99": _p99(cycles_ms),
                "incremental_cycle_cpu_ms_p50": round(statistics.median(cpu_ms), 2),
                "incremental_cycle_cpu_ms_p99": _p99(cpu_ms),
                "pending": PENDING,
                "gpus": SPOKES * NODES * GPUS,
                "full_cycle_s": round(full_s, 3),
                "first_cycle_placed": len(first.placements),
                "iterations": len(cycles_ms),
                "pending_at_end": len(pending),
                "running_at_end": len(fleet.running),
                "preemptions": preempted,
                "gc_frozen": not args.gc,
                "path": "from_scratch" if args.from_scratch else "kept_state",
                "rebuilds": kept.rebuilds,
                "untold": kept.untold,  # plans whose queue changes were not all told
                "machine_ref_us": machine_ref_us,
            }
        )
    )


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], 2)


if __name__ == "__main__":
    main()
