"""The plan alone under a deep queue of identical work on a small full fleet.

The placement side of `bench/e2e_latency.py --bulk 10000`: 3 spokes x 8 nodes x 8 GPUs
(H100, A100, L4; 192 GPUs), `gpufed up`'s policy, and 10,000 one-GPU workloads of one team and
class, all pending at once. The first plan fills the fleet; then per cycle `--freed` running
workloads end (at random) and one plan runs over everything pending, through
`hub.core.planstate.PlanState` as in the hub. Prints one JSON object: the plan's CPU time
(`time.process_time()`) per cycle, p50 / p99 / mean, and the pending count at the start and end.

`--check` compares every cycle's plan with `hub.core.placement.plan()`'s.

Run: .venv/bin/python bench/placement_bulk.py [--pending N] [--cycles N] [--freed N] [--check]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from placement import Fleet, NodeState, SpokeState

from gpufed.up import UP_POLICY
from hub.core.model import Workload
from hub.core.placement import plan
from hub.core.planstate import PlanState
from hub.policyfile import policy_from_dict
from schemas import SpokeKind, WorkloadSpec

SPOKES = (("eu-1", "eu", "H100"), ("eu-2", "eu", "A100"), ("us-1", "us", "L4"))
NODES = 8


def make_fleet() -> Fleet:
    fleet = Fleet(random.Random(0))
    fleet.spokes = {
        sid: SpokeState(
            id=sid,
            region=region,
            kind=SpokeKind.ONPREM,
            price=0.0,
            labels={},
            nodes={f"n{i}": NodeState(f"n{i}", model) for i in range(NODES)},
        )
        for sid, region, model in SPOKES
    }
    return fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--freed", type=int, default=50, help="workloads ending per cycle")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--check", action="store_true", help="compare with plan() each cycle")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    policy = policy_from_dict(dict(UP_POLICY))
    fleet = make_fleet()
    now = 1_000_000.0
    pending: dict[str, Workload] = {}
    for n in range(args.pending):
        spec = WorkloadSpec.model_validate({"name": "bench", "team": "bench", "command": ["true"]})
        pending[f"w{n:06d}"] = Workload(f"w{n:06d}", spec, now + n * 1e-4)
    kept = PlanState()
    result = kept.plan(fleet.snapshot(), list(pending.values()), [], policy, now)
    fleet.apply(result, pending, now)
    queued = len(pending)
    cpu_ms: list[float] = []
    for _ in range(args.cycles):
        now += 0.5
        for workload_id in rng.sample(sorted(fleet.running), min(args.freed, len(fleet.running))):
            fleet.stop(workload_id)
        snapshot = fleet.snapshot()
        running = list(fleet.running.values())
        queue = list(pending.values())
        gc.freeze()
        cpu = time.process_time()
        result = kept.plan(snapshot, queue, running, policy, now)
        cpu_ms.append((time.process_time() - cpu) * 1000)
        if args.check and result != plan(snapshot, queue, running, policy, now):
            raise SystemExit("the kept state planned differently from plan()")
        fleet.apply(result, pending, now)
    ordered = sorted(cpu_ms)
    print(
        json.dumps(
            {
                "plan_cpu_ms_p50": round(statistics.median(cpu_ms), 2),
                "plan_cpu_ms_p99": round(ordered[round(0.99 * (len(ordered) - 1))], 2),
                "plan_cpu_ms_mean": round(statistics.fmean(cpu_ms), 2),
                "cycles": len(cpu_ms),
                "pending_after_first": queued,
                "pending_at_end": len(pending),
                "running_at_end": len(fleet.running),
            }
        )
    )


if __name__ == "__main__":
    main()
