"""Scheduling quality on the Philly trace: the scheduler x burst matrix as one JSON object.

Replays the Philly trace (`--trace`: Pollux's philly.csv, 82,247 jobs) on
bench/replay/philly-fleet.yaml (3 spokes, 2,816 GPUs = the virtual clusters' guarantees in
philly-policy.yaml) with `gpufed replay`'s harness, for gpufed/none, static/none, fifo/none,
gpufed/immediate and gpufed/gpufed, and prints one JSON object:

- `matrix`: per "scheduler/burst": utilization, avg_jct_s, p99_jct_s, avg_wait_s, cloud_cost
  (plus preemptions, cloud_gpu_hours, cloud_instances, never_started, replay_seconds);
- `replay_seconds`: wall seconds of the gpufed/none simulation (trace loading not included);
- `goals`: static avg JCT / gpufed avg JCT (goal >= 2), and gpufed burst's share of immediate's
  avg-JCT gain over no burst (goal >= 0.9) and of its cloud cost (goal <= 0.5).

`--load-factor K` divides submit times by K (arrivals K times as fast); `--limit-jobs N`
replays the first N jobs; burst knobs as in `gpufed replay`. docs/replay.md has the results.

    .venv/bin/python bench/replay_report.py --trace philly.csv                    # as submitted
    .venv/bin/python bench/replay_report.py --trace philly.csv --load-factor 4    # 4x the load
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from burst.catalog import load_catalog
from burst.core import BurstPolicy
from gpufed.replay.fleet import load_fleet
from gpufed.replay.report import build_report
from gpufed.replay.runner import ReplaySetup, run_replay
from gpufed.replay.simulator import SimConfig
from gpufed.replay.traces import load_trace
from hub.policyfile import load_policy

HERE = Path(__file__).resolve().parent
MATRIX = ("gpufed/none", "static/none", "fifo/none", "gpufed/immediate", "gpufed/gpufed")
KEYS = ("utilization", "avg_jct_s", "p99_jct_s", "avg_wait_s", "cloud_cost")
EXTRA = (
    "p50_jct_s",
    "preemptions",
    "cloud_gpu_hours",
    "cloud_instances",
    "cloud_unused_instances",
    "replay_seconds",
)


def main() -> int:
    args = _args()
    if not args.trace.exists():
        print(f"trace not found: {args.trace} (expected ../shared/traces beside the repo)")
        return 1
    started = time.perf_counter()
    jobs = load_trace(args.trace, "philly", limit=args.limit_jobs)
    if args.load_factor != 1.0:
        jobs = [replace(job, submit=job.submit / args.load_factor) for job in jobs]
    load_s = time.perf_counter() - started
    fleet = load_fleet(args.fleet)
    policy = load_policy(args.policy.read_text(encoding="utf-8"))
    catalog = load_catalog()
    knobs: dict[str, Any] = {}
    if args.max_instances is not None:
        knobs["max_instances"] = args.max_instances
    if args.unlimited_instances:
        knobs["max_instances"] = None
    for name in ("burst_after", "idle_ttl", "cooldown"):
        if getattr(args, name) is not None:
            knobs[f"{name}_s"] = getattr(args, name)
    burst_policy = BurstPolicy(**knobs)
    matrix: dict[str, dict[str, Any]] = {}
    isolated = None
    for entry in args.matrix:
        scheduler, burst = entry.split("/")
        setup = ReplaySetup(
            fleet,
            policy,
            catalog,
            scheduler=scheduler,
            burst=burst,
            burst_policy=burst_policy,
            sim=SimConfig(cycle_s=args.cycle_s),
        )
        print(f"replaying {entry} ...", file=sys.stderr, flush=True)
        run = run_replay(jobs, setup, isolated=isolated)
        if scheduler == "static" and burst == "none":
            isolated = run.outcome
        report = build_report(run)
        matrix[entry] = {k: report[k] for k in (*KEYS, *EXTRA)}
        matrix[entry]["never_started"] = report["jobs"]["never_started"]
        print(f"  {json.dumps(matrix[entry])}", file=sys.stderr, flush=True)
    result = {
        "trace": str(args.trace),
        "jobs": len(jobs),
        "load_factor": args.load_factor,
        "onprem_gpus": fleet.gpus,
        "burst_policy": {k: getattr(burst_policy, k) for k in ("burst_after_s", "idle_ttl_s")}
        | {"cooldown_s": burst_policy.cooldown_s, "max_instances": burst_policy.max_instances},
        "matrix": matrix,
        "replay_seconds": matrix.get("gpufed/none", {}).get("replay_seconds"),
        "load_seconds": load_s,
        "goals": _goals(matrix),
    }
    print(json.dumps(result, indent=2))
    return 0


def _goals(matrix: dict[str, dict[str, Any]]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    gpufed, static = matrix.get("gpufed/none"), matrix.get("static/none")
    if gpufed and static and gpufed["avg_jct_s"]:
        speedup = static["avg_jct_s"] / gpufed["avg_jct_s"]
        goals["static_over_gpufed_avg_jct"] = speedup
        goals["gpufed_2x_better_than_static"] = speedup >= 2.0
    immediate, planned = matrix.get("gpufed/immediate"), matrix.get("gpufed/gpufed")
    if gpufed and immediate and planned:
        gain = gpufed["avg_jct_s"] - immediate["avg_jct_s"]
        ours = gpufed["avg_jct_s"] - planned["avg_jct_s"]
        cost = immediate["cloud_cost"]
        share = ours / gain if gain > 0 else None
        spent = planned["cloud_cost"] / cost if cost else None
        goals["burst_share_of_immediate_jct_gain"] = share
        goals["burst_share_of_immediate_cost"] = spent
        goals["burst_goal_met"] = (
            share is not None and spent is not None and share >= 0.9 and spent <= 0.5
        )
    return goals


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="Pollux's philly.csv")
    p.add_argument("--fleet", type=Path, default=HERE / "replay" / "philly-fleet.yaml")
    p.add_argument("--policy", type=Path, default=HERE / "replay" / "philly-policy.yaml")
    p.add_argument("--limit-jobs", type=int, default=None, help="the first N jobs only")
    p.add_argument("--load-factor", type=float, default=1.0, help="divide submit times by K")
    p.add_argument("--cycle-s", type=float, default=10.0)
    p.add_argument("--matrix", type=lambda s: s.split(","), default=list(MATRIX))
    p.add_argument("--max-instances", type=int, default=None)
    p.add_argument("--unlimited-instances", action="store_true")
    p.add_argument("--burst-after", type=float, default=None)
    p.add_argument("--idle-ttl", type=float, default=None)
    p.add_argument("--cooldown", type=float, default=None)
    return p.parse_args()


if __name__ == "__main__":
    raise SystemExit(main())
