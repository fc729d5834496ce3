"""The hub's whole scheduling cycle (`hub.cycle.Cycle.run`) on bench/placement.py's world.

bench/placement.py times `plan()` alone; the hub's cycle also turns its records into the
core's views, builds the snapshot from the spokes' reports (assumed allocations taken off),
applies the plan to the records and sends the demand. This drives a real `Cycle` over a
`HubState` with the same fleet (100 spokes x 64 nodes x 8 GPUs), policy and workloads as
bench/placement.py, with a store and a bus that do nothing. Each iteration, as in the hub:
the spokes start what the last cycle placed and report it, some work ends, last cycle's victims
stop and are requeued, spokes whose work changed report (every node a new object, as parsed
off the wire) and so does a fifth of the rest and any not heard for 6 s (a heartbeat with
nothing new), 100 workloads
arrive, and one cycle runs. Prints one JSON object: wall and CPU (`time.process_time()`)
p50/p99 of the whole cycle, and CPU p50 of its parts (views, snapshot, plan, apply).

Run: .venv/bin/python bench/hub_cycle.py [--iterations N] [--seed S]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).parent))

from placement import ARRIVALS, GPUS, PENDING, Fleet, make_policy, make_workload

from gpufed import logs
from hub import transitions
from hub.core.lifecycle import EndReason
from hub.cycle import Cycle
from hub.leases import Leases
from hub.publishing import Publisher
from hub.records import SpokeRecord, WorkloadRecord
from hub.settings import HubSettings
from hub.state import HubState
from schemas import (
    CapacityReport,
    NodeCapacity,
    Phase,
    RunningRef,
    RuntimeCapabilities,
)

T = TypeVar("T")

#: A spoke reports at least this often with nothing new (the cycle runs every 2 s here).
HEARTBEAT_S = 6.0


class Ack:
    def __init__(self, seq: int) -> None:
        self.seq = seq


class NullBus:
    """Acks every durable publish with the next stream sequence; drops the rest."""

    def __init__(self) -> None:
        self.seq = 0

    async def publish_durable(self, subject: str, payload: bytes, msg_id: str) -> Ack:
        await asyncio.sleep(0)  # a real publish gives the loop a turn
        self.seq += 1
        return Ack(self.seq)

    async def publish_durable_many(self, messages: list[tuple[str, bytes, str]]) -> list[Ack]:
        return [await self.publish_durable(*m) for m in messages]

    async def publish(self, subject: str, payload: bytes) -> None:
        return None


class NullStore:
    def save(self, *args: object) -> None:
        return None

    def mark_published(self, ids: object = ()) -> None:
        return None

    def mark_published_later(self, ids: object) -> None:
        return None

    def pending_marks(self) -> int:
        return 0


class World:
    """What the spokes run, and the reports they send."""

    def __init__(self, rng: random.Random, state: HubState, now: float) -> None:
        self.rng = rng
        self.state = state
        self.fleet = Fleet(rng)
        self.running: dict[str, dict[str, int]] = {s: {} for s in self.fleet.spokes}
        self.applied: dict[str, int] = dict.fromkeys(self.fleet.spokes, 0)
        for sid in self.fleet.spokes:
            state.spokes[sid] = SpokeRecord(
                id=sid, region=self.fleet.spokes[sid].region, kind="onprem",
                first_seen=now - 3600, last_seen=now,
            )  # fmt: skip
            self.report(sid, now)

    def report(self, sid: str, now: float) -> None:
        s = self.fleet.spokes[sid]
        nodes = tuple(_node(n.name, n.model, n.free, n.shared) for n in s.nodes.values())
        running = tuple(
            RunningRef.model_construct(workload_id=w, epoch=e, gpu_util=None, quiet_s=None)
            for w, e in self.running[sid].items()
        )
        self.state.reports[sid] = CapacityReport.model_construct(
            spoke_id=sid, region=s.region, kind=s.kind, incarnation="x", seq=0, nodes=nodes,
            running=running, labels=s.labels, price_per_gpu_hour=s.price,
            applied_seq=self.applied[sid], sent_at=now, capabilities=RuntimeCapabilities(),
        )  # fmt: skip
        self.state.spokes[sid].last_seen = now

    def tick(self, now: float, seqs: dict[str, int]) -> None:
        """Spokes start what was placed, some work ends, victims stop; changed spokes report."""
        state, fleet = self.state, self.fleet
        changed: set[str] = set()
        for w in list(state.workloads.values()):
            live = w.lifecycle.live
            if w.phase == Phase.PLACED and live is not None:
                transitions.start(w, now)
                self.running[live.spoke_id][w.id] = live.epoch
                self.applied[live.spoke_id] = max(self.applied[live.spoke_id], seqs.get(w.id, 0))
                for a in live.assignments:
                    fleet.take(live.spoke_id, a)
                changed.add(live.spoke_id)
        running = [w for w in state.workloads.values() if w.phase == Phase.RUNNING]
        victims = [w for w in running if w.lifecycle.live and w.lifecycle.live.preempting]
        ends = self.rng.sample(running, min(ARRIVALS, len(running)))
        for w in {w.id: w for w in (*victims, *ends)}.values():
            live = w.lifecycle.live
            assert live is not None
            preempted = live.preempting
            del self.running[live.spoke_id][w.id]
            for a in live.assignments:
                fleet.give(live.spoke_id, a)
            changed.add(live.spoke_id)
            if preempted:
                transitions.end(w, EndReason.PREEMPTED, now, "")
            else:
                transitions.end(w, EndReason.SUCCEEDED, now, "")
                state.forget(w.id)
        for sid in fleet.spokes:
            heard = self.state.spokes[sid].last_seen
            if sid in changed or now - heard >= HEARTBEAT_S or self.rng.random() < 0.2:
                self.report(sid, now)


def _node(name: str, model: str, free: set[int], shared: dict[int, float]) -> NodeCapacity:
    return NodeCapacity.model_construct(
        name=name, gpu_model=model, gpu_count=GPUS, free_devices=tuple(sorted(free)),
        device_free_fraction=dict(shared), labels={}, schedulable=True,
    )  # fmt: skip


def timed(parts: dict[str, list[float]], name: str, fn: Callable[..., T]) -> Callable[..., T]:
    def wrapper(*args: Any, **kwargs: Any) -> T:
        cpu = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[name].append((time.process_time() - cpu) * 1000)

    return wrapper


async def run(iterations: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    now = 1_000_000.0
    clock = [now]
    state = HubState(HubSettings(), NullStore(), lambda: clock[0], policy=None)  # type: ignore[arg-type]
    world = World(rng, state, now)
    state.policy = make_policy(world.fleet, rng)
    bus = NullBus()
    seqs: dict[str, int] = {}
    publisher = Publisher(state, bus)  # type: ignore[arg-type]
    original_publish = publisher.publish

    async def publish(decisions: Any) -> None:
        await original_publish(decisions)
        for d in decisions:
            seqs[d.workload_id] = bus.seq  # the spoke applies up to the last one

    publisher.publish = publish  # type: ignore[method-assign]
    cycle = Cycle(state, Leases(suspect_after_s=15.0, lost_after_s=120.0), publisher)
    serial = 0

    def submit(at: float, count: int) -> None:
        nonlocal serial
        for _ in range(count):
            w = make_workload(rng, serial, at)
            record = WorkloadRecord(id=w.id, spec=w.spec, submitted_at=w.submitted_at)
            state.workloads[w.id] = record
            serial += 1

    submit(now, PENDING)
    await cycle.run()
    parts: dict[str, list[float]] = {"views": [], "snapshot": [], "plan": [], "apply": []}
    cycle._views = timed(parts, "views", cycle._views)  # type: ignore[method-assign]
    cycle._snapshot = timed(parts, "snapshot", cycle._snapshot)  # type: ignore[method-assign]
    cycle.placement.plan = timed(parts, "plan", cycle.placement.plan)  # type: ignore[method-assign]
    cycle._apply = timed(parts, "apply", cycle._apply)  # type: ignore[method-assign]
    wall: list[float] = []
    cpu: list[float] = []
    placed = 0
    for _ in range(iterations):
        now += 2.0
        clock[0] = now
        world.tick(now, seqs)
        submit(now, ARRIVALS)
        gc.freeze()
        started, cpu_start = time.perf_counter(), time.process_time()
        result = await cycle.run()
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_start) * 1000)
        placed += len(result.placements)
    return {
        "hub_cycle_ms_p50": round(statistics.median(wall), 2),
        "hub_cycle_ms_p99": _p99(wall),
        "hub_cycle_cpu_ms_p50": round(statistics.median(cpu), 2),
        "hub_cycle_cpu_ms_p99": _p99(cpu),
        "cpu_ms_p50_by_part": {k: round(statistics.median(v), 2) for k, v in parts.items()},
        "iterations": iterations,
        "placed": placed,
        "pending_at_end": sum(1 for w in state.workloads.values() if w.phase == Phase.QUEUED),
        "running_at_end": sum(1 for w in state.workloads.values() if w.phase == Phase.RUNNING),
        "placement_rebuilds": cycle.placement.rebuilds,
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    logs.configure(sys.stderr, json=False, level="warning")
    print(json.dumps(asyncio.run(run(args.iterations, args.seed))))


if __name__ == "__main__":
    main()
