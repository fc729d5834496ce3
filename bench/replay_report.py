"""Scheduling quality on the Philly trace: the scheduler x burst matrix as one JSON object.

Replays the Philly trace (`--trace`: Pollux's philly.csv, 82,247 jobs) on
bench/replay/philly-fleet.yaml (3 spokes, 2,816 GPUs = the virtual clusters' guarantees in
philly-policy.yaml) with `gpufed replay`'s harness, for gpufed/none, static/none, fifo/none,
gpufed/immediate and gpufed/gpufed, and prints one JSON object:

- `matrix`: per "scheduler/burst": utilization, avg_jct_s, p99_jct_s, avg_wait_s, cloud_cost
  (plus preemptions, cloud_gpu_hours, cloud_instances, never_started, replay_seconds);
- `replay_seconds`: wall seconds of the gpufed/none simulation (trace loading not included);
- `goals`: static avg JCT / gpufed avg JCT (goal >= 2), and gpufed burst's share of immediate's
  cut in the average wait over no burst (goal >= 0.9; its share of the avg-JCT gain too) and of
  its cloud cost (goal <= 0.5).

`--load-factor K` divides submit times by K (arrivals K times as fast); `--limit-jobs N`
replays the first N jobs; burst knobs as in `gpufed replay`, except that no instance cap
applies unless `--max-instances` sets one (`immediate` has none), and `immediate` runs without
the policy's consolidation, as the naive no-wait baseline (`--immediate-consolidates`: with).
`--trace F --format csv` (with `--fleet`, `--policy`) replays another trace. Matrix entries
(and the sweep's schedulers) run in parallel processes, `--workers` at a time (default: the
CPUs). docs/replay.md has the results.

`--sweep` instead finds each scheduler's *sustainable load*: the highest load factor at which
the average wait stays <= `--max-wait` (900 s) on the same fleet, by evaluating 4, 5 and 6 and
bisecting the bracket where the wait crosses the bound (to `--tolerance`), and reports avg/p99
bounded slowdown at load factors 4, 5 and 6 (`--plot FILE` draws the curve).

    .venv/bin/python bench/replay_report.py --trace philly.csv                    # as submitted
    .venv/bin/python bench/replay_report.py --trace philly.csv --load-factor 4    # 4x the load
    .venv/bin/python bench/replay_report.py --trace philly.csv --sweep --plot sweep.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from burst.catalog import Catalog, load_catalog
from burst.core import BurstPolicy
from gpufed.replay.fleet import Fleet, load_fleet
from gpufed.replay.report import build_report
from gpufed.replay.runner import ReplaySetup, run_replay
from gpufed.replay.simulator import SimConfig
from gpufed.replay.traces import Job, load_trace
from hub.core.policy import Policy
from hub.policyfile import load_policy

HERE = Path(__file__).resolve().parent
LOADS = (4.0, 5.0, 6.0)
SWEEP_KEYS = (
    "avg_wait_s",
    "p99_wait_s",
    "p99_wait_wide_s",
    "avg_bounded_slowdown",
    "p99_bounded_slowdown",
    "avg_jct_s",
    "utilization",
    "preemptions",
    "replay_seconds",
)
MATRIX = ("gpufed/none", "static/none", "fifo/none", "gpufed/immediate", "gpufed/gpufed")
KEYS = ("utilization", "avg_jct_s", "p99_jct_s", "avg_wait_s", "cloud_cost")
EXTRA = (
    "p50_jct_s",
    "p99_wait_s",
    "p99_wait_wide_s",
    "avg_bounded_slowdown",
    "p99_bounded_slowdown",
    "preemptions",
    "consolidations",
    "cloud_gpu_hours",
    "cloud_instances",
    "cloud_unused_instances",
    "replay_seconds",
)


def main() -> int:
    args = _args()
    if not args.trace.exists():
        print(f"trace not found: {args.trace}")
        return 1
    started = time.perf_counter()
    base = load_trace(args.trace, args.format, limit=args.limit_jobs)
    jobs = _scaled(base, args.load_factor)
    load_s = time.perf_counter() - started
    fleet = load_fleet(args.fleet)
    policy = load_policy(args.policy.read_text(encoding="utf-8"))
    policy = _ordering(policy, args)
    catalog = load_catalog()
    # No instance cap unless asked: `immediate` has none, so the burst goals compare the
    # planners, not the controller's safety cap of 10 (which binds early at load factor 4).
    knobs: dict[str, Any] = {"max_instances": args.max_instances}
    for name in ("burst_after", "idle_ttl", "cooldown", "wait_per_gpu"):
        if getattr(args, name) is not None:
            knobs[f"{name}_s"] = getattr(args, name)
    if args.right_size is not None:
        knobs["right_size"] = args.right_size == "on"
    if args.burst_restarted is not None:
        knobs["burst_restarted"] = args.burst_restarted == "on"
    burst_policy = BurstPolicy(**knobs)
    if args.sweep:
        result = sweep(base, fleet, policy, catalog, args)
        if args.plot is not None:
            _plot(result, args.plot)
        print(json.dumps(result, indent=2))
        return 0
    matrix: dict[str, dict[str, Any]] = {}
    setups = {}
    for entry in args.matrix:
        scheduler, burst = entry.split("/")
        setups[entry] = ReplaySetup(
            fleet,
            _naive(policy, args.immediate_consolidates) if burst == "immediate" else policy,
            catalog,
            scheduler=scheduler,
            burst=burst,
            burst_policy=burst_policy,
            sim=SimConfig(cycle_s=args.cycle_s),
        )
    # The entries never interact: one process each, up to --workers at a time.
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {entry: pool.submit(_entry, jobs, setup) for entry, setup in setups.items()}
        for entry, future in futures.items():
            matrix[entry] = future.result()
            print(f"  {entry}: {json.dumps(matrix[entry])}", file=sys.stderr, flush=True)
    wall_s = time.perf_counter() - started
    result = {
        "trace": str(args.trace),
        "jobs": len(jobs),
        "load_factor": args.load_factor,
        "onprem_gpus": fleet.gpus,
        "burst_policy": {
            k: getattr(burst_policy, k)
            for k in (
                "burst_after_s",
                "idle_ttl_s",
                "cooldown_s",
                "max_instances",
                "wait_per_gpu_s",
                "right_size",
                "burst_restarted",
            )
        },
        "matrix": matrix,
        "replay_seconds": matrix.get("gpufed/none", {}).get("replay_seconds"),
        "load_seconds": load_s,
        "matrix_wall_seconds": wall_s,
        "goals": _goals(matrix),
    }
    print(json.dumps(result, indent=2))
    return 0


def _ordering(policy: Policy, args: argparse.Namespace) -> Policy:
    """`policy` with the ordering and consolidation knobs given on the command line."""
    knobs: dict[str, Any] = {}
    if args.ordering is not None:
        knobs["mode"] = args.ordering
    for name in ("patience_s", "resumed_min_run_s"):
        if getattr(args, name) is not None:
            knobs[name] = getattr(args, name)
    if knobs:
        policy = replace(policy, ordering=replace(policy.ordering, **knobs))
    moves: dict[str, Any] = {}
    if args.consolidate is not None:
        moves["enabled"] = args.consolidate == "on"
    if args.consolidate_after_s is not None:
        moves["after_s"] = args.consolidate_after_s
    if args.consolidate_max is not None:
        moves["max_per_cycle"] = args.consolidate_max
    if moves:
        policy = replace(policy, consolidation=replace(policy.consolidation, **moves))
    return policy


def _entry(jobs: list[Job], setup: ReplaySetup) -> dict[str, Any]:
    """One matrix entry's figures (run in a worker process)."""
    report = build_report(run_replay(jobs, setup))
    found = {k: report[k] for k in (*KEYS, *EXTRA)}
    found["never_started"] = report["jobs"]["never_started"]
    return found


def _scaled(jobs: list[Job], factor: float) -> list[Job]:
    if factor == 1.0:
        return jobs
    return [replace(job, submit=job.submit / factor) for job in jobs]


def sweep(
    jobs: list[Job], fleet: Fleet, policy: Policy, catalog: Catalog, args: argparse.Namespace
) -> dict[str, Any]:
    """Sustainable load per scheduler (bisection) and bounded slowdown at 4, 5 and 6."""
    # One process per scheduler: their sweeps never interact.
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {
            name: pool.submit(_sweep_one, jobs, fleet, policy, catalog, name, args)
            for name in args.schedulers
        }
        schedulers = {name: future.result() for name, future in futures.items()}
    gpufed = schedulers.get("gpufed", {}).get("sustainable_load")
    static = schedulers.get("static", {}).get("sustainable_load")
    return {
        "trace": str(args.trace),
        "jobs": len(jobs),
        "max_wait_s": args.max_wait,
        "schedulers": schedulers,
        "goals": {
            "gpufed_sustainable_load": gpufed,
            "gpufed_at_least_5_5": gpufed is not None and gpufed >= 5.5,
            "gpufed_over_static": gpufed / static if gpufed and static else None,
            "gpufed_at_least_2_8x_static": bool(gpufed and static and gpufed / static >= 2.8),
        },
    }


def _sweep_one(
    jobs: list[Job],
    fleet: Fleet,
    policy: Policy,
    catalog: Catalog,
    scheduler: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    return _sustainable(_Points(jobs, fleet, policy, catalog, scheduler, args), args)


class _Points:
    """Replays of one scheduler at load factors, each run once."""

    def __init__(
        self,
        jobs: list[Job],
        fleet: Fleet,
        policy: Policy,
        catalog: Catalog,
        scheduler: str,
        args: argparse.Namespace,
    ) -> None:
        self.jobs, self.scheduler, self.max_wait = jobs, scheduler, args.max_wait
        sim = SimConfig(cycle_s=args.cycle_s)
        self.setup = ReplaySetup(fleet, policy, catalog, scheduler=scheduler, sim=sim)
        self.seen: dict[float, dict[str, Any]] = {}

    def at(self, factor: float) -> dict[str, Any]:
        factor = round(factor, 3)
        if factor not in self.seen:
            started = time.perf_counter()
            report = build_report(run_replay(_scaled(self.jobs, factor), self.setup))
            point = self.seen[factor] = {k: report[k] for k in SWEEP_KEYS}
            point["wall_s"] = time.perf_counter() - started
            line = {"scheduler": self.scheduler, "load_factor": factor} | point
            print(f"  {json.dumps(line)}", file=sys.stderr, flush=True)
        return self.seen[factor]

    def ok(self, factor: float) -> bool:
        wait = self.at(factor)["avg_wait_s"]
        return wait is not None and wait <= self.max_wait


def _sustainable(points: _Points, args: argparse.Namespace) -> dict[str, Any]:
    """Bisect the bracket of (1, 4, 5, 6) where the average wait crosses the bound."""
    grid = [1.0, *LOADS]
    passed = [points.ok(f) for f in grid]
    lo = 0.0
    for factor, good in zip(grid, passed, strict=True):
        if not good:
            break
        lo = factor
    if lo == grid[-1]:
        found, note = lo, f"at least {lo} (the largest load factor tried)"
    else:
        hi = next(f for f in grid if f > lo)
        while hi - lo > args.tolerance:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if points.ok(mid) else (lo, mid)
        found, note = round(lo, 3), f"avg wait above {args.max_wait:g} s at {round(hi, 3)}"
    return {
        "sustainable_load": found,
        "note": note,
        "points": {str(f): p for f, p in sorted(points.seen.items())},
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    """Average wait against load factor, one line per scheduler, the bound dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, found in result["schedulers"].items():
        xs = [float(f) for f in found["points"]]
        ys = [max(1.0, p["avg_wait_s"] or 0.0) for p in found["points"].values()]
        ax.plot(xs, ys, marker="o", label=f"{name} (sustainable {found['sustainable_load']})")
    ax.axhline(result["max_wait_s"], color="grey", linestyle="--", label="15 min")
    ax.set_yscale("log")
    ax.set_xlabel("load factor (arrivals x K)")
    ax.set_ylabel("average wait (s)")
    ax.set_title(f"{Path(result['trace']).name}: average wait against load")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        cut = gpufed["avg_wait_s"] - immediate["avg_wait_s"]
        ours_cut = gpufed["avg_wait_s"] - planned["avg_wait_s"]
        wait_share = ours_cut / cut if cut > 0 else None
        goals["burst_share_of_immediate_jct_gain"] = share
        goals["burst_share_of_immediate_wait_cut"] = wait_share
        goals["burst_share_of_immediate_cost"] = spent
        goals["burst_goal_met"] = (
            wait_share is not None and spent is not None and wait_share >= 0.9 and spent <= 0.5
        )
    return goals


def _naive(policy: Policy, keep: bool) -> Policy:
    """`immediate` is the no-wait baseline the burst goal measures against: no consolidation
    (moving cloud work home is gpufed's, not the baseline's) unless `keep`
    (`--immediate-consolidates`)."""
    if keep:
        return policy
    return replace(policy, consolidation=replace(policy.consolidation, enabled=False))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="Pollux's philly.csv (or --format)")
    p.add_argument("--format", default="philly", help="philly, csv or alibaba")
    p.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="matrix entries run at once"
    )
    p.add_argument("--sweep", action="store_true", help="sustainable load per scheduler")
    p.add_argument(
        "--schedulers", type=lambda s: s.split(","), default=["gpufed", "static", "fifo"]
    )
    p.add_argument("--max-wait", type=float, default=900.0, help="sweep: avg wait bound (s)")
    p.add_argument("--plot", type=Path, default=None, help="sweep: PNG of wait against load")
    p.add_argument("--tolerance", type=float, default=0.1, help="sweep: bisection precision")
    p.add_argument("--fleet", type=Path, default=HERE / "replay" / "philly-fleet.yaml")
    p.add_argument("--policy", type=Path, default=HERE / "replay" / "philly-policy.yaml")
    p.add_argument("--limit-jobs", type=int, default=None, help="the first N jobs only")
    p.add_argument("--load-factor", type=float, default=1.0, help="divide submit times by K")
    p.add_argument("--cycle-s", type=float, default=10.0)
    p.add_argument("--matrix", type=lambda s: s.split(","), default=list(MATRIX))
    p.add_argument(
        "--max-instances", type=int, default=None, help="burst: instance cap (default: none)"
    )
    p.add_argument(
        "--unlimited-instances", action="store_true", help="the default; kept for scripts"
    )
    p.add_argument("--burst-after", type=float, default=None)
    p.add_argument("--idle-ttl", type=float, default=None)
    p.add_argument("--cooldown", type=float, default=None)
    p.add_argument("--wait-per-gpu", type=float, default=None, help="burst: s of wait per GPU")
    p.add_argument("--right-size", choices=("on", "off"), default=None, help="burst: packing")
    p.add_argument(
        "--burst-restarted", choices=("on", "off"), default=None, help="burst: preempted work"
    )
    p.add_argument(
        "--ordering", choices=("fifo", "las"), default=None, help="override the policy's ordering"
    )
    p.add_argument("--patience-s", type=float, default=None, help="override ordering.patience_s")
    p.add_argument(
        "--resumed-min-run-s", type=float, default=None, help="override ordering.resumed_min_run_s"
    )
    p.add_argument(
        "--consolidate", choices=("on", "off"), default=None, help="override consolidation.enabled"
    )
    p.add_argument(
        "--immediate-consolidates",
        action="store_true",
        help="burst: immediate keeps the policy's consolidation (default: off, the naive baseline)",
    )
    p.add_argument("--consolidate-after-s", type=float, default=None)
    p.add_argument("--consolidate-max", type=int, default=None, help="moves per cycle")
    return p.parse_args()


if __name__ == "__main__":
    raise SystemExit(main())
