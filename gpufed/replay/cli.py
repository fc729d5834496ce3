"""`gpufed replay`: replay a GPU-cluster trace through gpufed's schedulers in virtual time.

The lead wires it into `gpufed` with `add_replay_parser(sub)`; `python -m gpufed.replay` runs
the same command on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufed.replay.baselines import SCHEDULERS
from gpufed.replay.cloud import BURSTS
from gpufed.when import parse_when

FORMATS = ("philly", "alibaba", "csv")
_DAY = 86400.0


def add_replay_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `replay` command to a `gpufed` subparsers object."""
    p = sub.add_parser(
        "replay",
        help="replay a GPU-cluster trace through the scheduler in virtual time",
        description="Replay a job trace through gpufed's placement (or a baseline) and cloud "
        "burst in virtual time on simulated spokes; write report.json and PNG plots.",
    )
    p.add_argument("--trace", type=Path, default=None, help="trace file")
    p.add_argument("--format", choices=FORMATS, default=None, help="trace format")
    p.add_argument(
        "--from-hub",
        metavar="URL",
        default=None,
        help="instead of --trace: the hub's own workloads (REST API) under --policy and under "
        "the policy in force, side by side (with the token the other commands send)",
    )
    p.add_argument("--since", default="7d", help="--from-hub: workloads submitted since (7d)")
    p.add_argument("--fleet", type=Path, default=None, help="fleet YAML (or openb node list)")
    p.add_argument("--policy", type=Path, default=None, help="policy YAML (default: no quotas)")
    p.add_argument(
        "--ordering",
        choices=("fifo", "las"),
        default=None,
        help="the policy's ordering of borrowed GPUs, overridden (docs/policy.md)",
    )
    p.add_argument("--scheduler", choices=SCHEDULERS, default="gpufed")
    p.add_argument("--burst", choices=BURSTS, default="none")
    p.add_argument("--out", type=Path, required=True, help="directory for report.json and PNGs")
    run = p.add_argument_group("simulation")
    run.add_argument("--cycle-s", type=float, default=10.0, help="at most one cycle per N s")
    run.add_argument("--preempt-grace-s", type=float, default=30.0, help="s a victim takes to stop")
    run.add_argument(
        "--on-preempt",
        choices=("resume", "restart"),
        default="resume",
        help="a preempted job keeps its progress (checkpoint) or starts over",
    )
    run.add_argument("--limit-jobs", type=int, default=None, help="replay the first N jobs")
    run.add_argument(
        "--load-factor",
        type=float,
        default=1.0,
        help="divide submit times by K (K > 1: arrivals K times as fast, about K x the load)",
    )
    run.add_argument(
        "--start",
        default="2024-01-01T00:00:00+00:00",
        help="the instant the trace starts, ISO 8601 (for the policy's time windows; "
        "default: Monday 2024-01-01 00:00 UTC)",
    )
    run.add_argument("--no-fairness", action="store_true", help="skip the isolated static run")
    run.add_argument("--no-plots", action="store_true", help="write report.json only")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    cloud = p.add_argument_group("cloud burst")
    cloud.add_argument("--catalog", type=Path, default=None, help="instance catalog YAML")
    cloud.add_argument("--boot-s", type=float, default=120.0, help="s from launch to joining")
    cloud.add_argument("--burst-after", type=float, default=None)
    cloud.add_argument("--idle-ttl", type=float, default=None)
    cloud.add_argument("--cooldown", type=float, default=None)
    cloud.add_argument("--max-instances", type=int, default=None)
    cloud.add_argument("--unlimited-instances", action="store_true")
    cloud.add_argument("--max-dollars-per-hour", type=float, default=None)
    cloud.add_argument("--markets", choices=("spot_first", "on_demand_only"), default=None)
    cloud.add_argument("--wait-per-gpu", type=float, default=None, help="s of waiting per GPU")
    cloud.add_argument(
        "--right-size", choices=("on", "off"), default=None, help="an instance per workload"
    )
    cloud.add_argument(
        "--burst-restarted", choices=("on", "off"), default=None, help="burst preempted work"
    )
    fgd = p.add_argument_group("Alibaba workload inflation (FGD)")
    fgd.add_argument(
        "--inflate",
        action="store_true",
        help="alibaba only: draw tasks until the first does not fit; report the GPU share",
    )
    fgd.add_argument("--seed", type=int, default=0, help="random draws of --inflate")
    p.set_defaults(func=run_command)
    parser: argparse.ArgumentParser = p
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m gpufed.replay ...`: the replay command alone."""
    parser = argparse.ArgumentParser(prog="gpufed")
    sub = parser.add_subparsers(metavar="COMMAND")
    add_replay_parser(sub)
    args = parser.parse_args(["replay", *(sys.argv[1:] if argv is None else argv)])
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run the replay the arguments describe; 1 with a message on bad input."""
    from burst.errors import CatalogError
    from gpufed.replay.fleet import FleetError
    from gpufed.replay.plots import PlotError
    from gpufed.replay.traces import TraceError

    try:
        if args.from_hub is not None:
            if args.trace is not None:
                raise ValueError("use either --trace or --from-hub, not both")
            return _from_hub(args)
        if args.trace is None or args.format is None:
            raise ValueError("--trace and --format are required (or --from-hub URL)")
        if args.inflate:
            return _inflate(args)
        return _replay(args)
    except (TraceError, FleetError, CatalogError, PlotError, ValueError, OSError) as exc:
        print(f"gpufed replay: {exc}", file=sys.stderr)
        return 1


def _replay(args: argparse.Namespace) -> int:
    from gpufed.replay.fleet import load_fleet
    from gpufed.replay.report import build_report, write_report
    from gpufed.replay.runner import ReplaySetup, isolated_reference, run_replay
    from gpufed.replay.simulator import SimConfig
    from gpufed.replay.traces import load_trace

    if args.fleet is None:
        raise ValueError("--fleet is required")
    fleet = load_fleet(args.fleet)
    jobs = load_trace(args.trace, args.format, node_gpus=fleet.max_node_gpus or 8)
    jobs = _scaled(_first(jobs, args.limit_jobs), args.load_factor)
    if not jobs:
        raise ValueError(f"{args.trace}: no jobs to replay")
    setup = ReplaySetup(
        fleet=fleet,
        policy=_ordered(_policy(args.policy), args.ordering),
        catalog=_catalog(args.catalog),
        scheduler=args.scheduler,
        burst=args.burst,
        burst_policy=_burst_policy(args),
        boot_s=args.boot_s,
        sim=SimConfig(args.cycle_s, args.preempt_grace_s, args.on_preempt),
        start=_instant(args.start),
    )
    isolated = None
    if not args.no_fairness and setup.scheduler != "static" and setup.policy.teams:
        isolated = isolated_reference(jobs, setup, progress=_progress(args, "static reference"))
    run = run_replay(jobs, setup, progress=_progress(args, "replay"), isolated=isolated)
    trace = {
        "path": str(args.trace),
        "format": args.format,
        "jobs": len(jobs),
        "limit_jobs": args.limit_jobs,
        "load_factor": args.load_factor,
        "span_s": jobs[-1].submit - jobs[0].submit,
    }
    report = build_report(run, trace)
    path = write_report(report, args.out)
    paths = [path]
    if not args.no_plots:
        from gpufed.replay.plots import write_plots

        paths += write_plots(run, report, args.out)
    _summary(report, paths)
    return 0


def _from_hub(args: argparse.Namespace) -> int:
    from gpufed.replay.fleet import load_fleet
    from gpufed.replay.fromhub import fetch, fleet_from_spokes, parse_since
    from gpufed.replay.report import build_report, write_report
    from gpufed.replay.runner import ReplaySetup, run_replay
    from gpufed.replay.simulator import SimConfig
    from hub.policyfile import PolicyError, policy_from_dict

    if args.policy is None:
        raise ValueError("--from-hub needs --policy: the proposed policy to compare")
    since_s = parse_since(args.since)
    history = fetch(args.from_hub, since_s, time.time(), args.on_preempt == "resume")
    if not history.jobs:
        raise ValueError(f"{args.from_hub}: no workload ran in the last {args.since}")
    fleet = load_fleet(args.fleet) if args.fleet else fleet_from_spokes(history.spokes)
    try:
        in_force = policy_from_dict(history.policy)
    except PolicyError as exc:
        raise ValueError(f"{args.from_hub}: its policy does not load: {exc}") from exc
    jobs = _scaled(_first(history.jobs, args.limit_jobs), args.load_factor)
    trace = {
        "hub": args.from_hub,
        "since": args.since,
        "jobs": len(jobs),
        "skipped": dict(history.skipped),
        "load_factor": args.load_factor,
        "start": datetime.fromtimestamp(history.start, UTC).isoformat(),
    }
    side: dict[str, dict[str, Any]] = {}
    paths: list[Path] = []
    for name, policy in (("in_force", in_force), ("proposed", _policy(args.policy))):
        setup = ReplaySetup(
            fleet=fleet,
            policy=policy,
            catalog=_catalog(args.catalog),
            scheduler=args.scheduler,
            burst=args.burst,
            burst_policy=_burst_policy(args),
            boot_s=args.boot_s,
            sim=SimConfig(args.cycle_s, args.preempt_grace_s, args.on_preempt),
            start=history.start,  # time windows as they were in force when the work came
        )
        report = build_report(run_replay(jobs, setup, progress=_progress(args, name)), trace)
        paths.append(write_report(report, args.out / name.replace("_", "-")))
        _never_started(report, f"{name}: ")
        side[name] = report
    keys = (*_KEYS, "p99_wait_s", "avg_bounded_slowdown")
    print(json.dumps({"jobs": len(jobs), "skipped": dict(history.skipped)}))
    print(json.dumps({k: {n: side[n][k] for n in side} for k in keys}))
    for path in paths:
        print(path)
    return 0


def _inflate(args: argparse.Namespace) -> int:
    from gpufed.replay.baselines import FifoScheduler, gpufed_scheduler
    from gpufed.replay.fleet import load_fleet
    from gpufed.replay.inflate import inflate
    from gpufed.replay.report import write_report
    from gpufed.replay.simulator import Scheduler
    from gpufed.replay.traces import alibaba_pods

    if args.format != "alibaba":
        raise ValueError("--inflate works on --format alibaba traces")
    fleet_path = args.fleet or args.trace.with_name("openb_node_list_gpu_node.csv")
    fleet = load_fleet(fleet_path)
    pods = [pod for _, pod in alibaba_pods(args.trace)]
    policy = _policy(args.policy)
    scheduler: Scheduler
    if args.scheduler == "gpufed":
        scheduler = gpufed_scheduler(policy)
    elif args.scheduler == "fifo":
        scheduler = FifoScheduler(policy)
    else:
        raise ValueError("--inflate compares packing: use --scheduler gpufed or fifo")
    result = inflate(pods, fleet, scheduler, seed=args.seed)
    report = {
        "trace": {"path": str(args.trace), "format": "alibaba", "gpu_tasks": len(pods)},
        "fleet": {"path": str(fleet_path), "onprem_gpus": fleet.gpus},
        "mode": "inflate",
        "scheduler": args.scheduler,
        "seed": args.seed,
        **result.as_dict(),
    }
    path = write_report(report, args.out)
    print(
        f"allocated {100 * result.allocated_share:.1f}% of {fleet.gpus} GPUs when "
        f"{result.first_failure} first did not fit ({result.placed} tasks placed)\n{path}"
    )
    return 0


def _scaled(jobs: list[Any], factor: float) -> list[Any]:
    if factor <= 0:
        raise ValueError("--load-factor must be greater than 0")
    if factor == 1.0:
        return jobs
    return [replace(job, submit=job.submit / factor) for job in jobs]


def _policy(path: Path | None) -> Any:
    from hub.core.policy import Policy
    from hub.policyfile import PolicyError, load_policy

    if path is None:
        return Policy()
    try:
        return load_policy(path.read_text(encoding="utf-8"))
    except PolicyError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _first(jobs: list[Any], limit: int | None) -> list[Any]:
    """`--limit-jobs`: the first `limit` jobs (all when not given), from a trace or a hub."""
    return jobs[:limit] if limit else jobs


def _ordered(policy: Any, mode: str | None) -> Any:
    """`policy` with its ordering mode replaced by `--ordering`, when given."""
    if mode is None:
        return policy
    return replace(policy, ordering=replace(policy.ordering, mode=mode))


def _instant(text: str) -> float:
    try:
        return parse_when(text, time.time())
    except ValueError as exc:
        raise ValueError(f"--start: {exc}") from None


def _catalog(path: Path | None) -> Any:
    from burst.catalog import load_catalog

    return load_catalog(path)


def _burst_policy(args: argparse.Namespace) -> Any:
    from burst.core import BurstPolicy, MarketPreference

    knobs: dict[str, Any] = {}
    for flag, name in (
        ("burst_after", "burst_after_s"),
        ("idle_ttl", "idle_ttl_s"),
        ("cooldown", "cooldown_s"),
        ("max_instances", "max_instances"),
        ("max_dollars_per_hour", "max_dollars_per_hour"),
        ("wait_per_gpu", "wait_per_gpu_s"),
    ):
        value = getattr(args, flag)
        if value is not None:
            knobs[name] = value
    if args.unlimited_instances:
        knobs["max_instances"] = None
    if args.markets is not None:
        knobs["markets"] = MarketPreference(args.markets)
    if args.right_size is not None:
        knobs["right_size"] = args.right_size == "on"
    if args.burst_restarted is not None:
        knobs["burst_restarted"] = args.burst_restarted == "on"
    return BurstPolicy(**knobs)


def _progress(args: argparse.Namespace, label: str) -> Any:
    if args.quiet:
        return None

    def show(p: Any) -> None:
        print(
            f"{label}: {100 * p.done / p.total:5.1f}% done ({p.done:,}/{p.total:,}) "
            f"t={p.now / _DAY:.1f}d pending={p.pending:,} running={p.running:,} "
            f"util={100 * p.utilization:.1f}% wall={p.wall_s:.1f}s",
            file=sys.stderr,
            flush=True,
        )

    return show


_KEYS = ("utilization", "avg_jct_s", "p99_jct_s", "avg_wait_s", "preemptions", "cloud_cost")


def _summary(report: dict[str, Any], paths: list[Path]) -> None:
    print(json.dumps({k: report[k] for k in _KEYS}))
    for path in paths:
        print(path)
    _never_started(report)


def _never_started(report: dict[str, Any], label: str = "") -> None:
    """Say on stderr which jobs never ran: the averages printed leave them out."""
    jobs = report["jobs"]
    if not jobs["never_started"]:
        return
    why = ", ".join(
        f"{n} {reason}" for reason, n in sorted(jobs["never_started_by_reason"].items())
    )
    print(
        f"gpufed replay: {label}{jobs['never_started']} of {jobs['total']} jobs never started "
        f"({why}), left out of the averages; report.json has them by team",
        file=sys.stderr,
    )
