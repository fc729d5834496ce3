"""report.json: the numbers of one replay (definitions in metrics.py and docs/replay.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from gpufed.replay import metrics
from gpufed.replay.runner import ReplayRun

WINDOW_DEFINITION = (
    "from the time 10% of the jobs had arrived to the time 90% had arrived "
    "(the ceil(0.1 n)-th and ceil(0.9 n)-th arrivals)"
)


def build_report(run: ReplayRun, trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every metric of `run` as plain JSON-safe data."""
    outcome, setup = run.outcome, run.setup
    window = metrics.steady_window([job.submit for job in outcome.jobs])
    jct = metrics.summary(metrics.jcts(outcome))
    wait = metrics.summary(metrics.waits(outcome))
    wide = metrics.summary(metrics.wide_waits(outcome))
    bsld = metrics.summary(metrics.bounded_slowdowns(outcome))
    cloud = metrics.cloud_stats(run.cloud.instances, outcome.finished_at)
    never = Counter(str(reason) for reason in outcome.waiting.values())
    never_by_team = Counter(outcome.jobs[i].team for i in _waiting_indexes(run))
    burst = setup.burst_policy
    return {
        "trace": trace or {},
        "scheduler": setup.scheduler,
        "burst": setup.burst,
        "settings": {
            "cycle_s": setup.sim.cycle_s,
            "preempt_grace_s": setup.sim.preempt_grace_s,
            "on_preempt": setup.sim.on_preempt,
            "boot_s": setup.boot_s,
            "burst_after_s": burst.burst_after_s,
            "idle_ttl_s": burst.idle_ttl_s,
            "cooldown_s": burst.cooldown_s,
            "max_instances": burst.max_instances,
            "markets": str(burst.markets),
        },
        "fleet": {
            "onprem_gpus": setup.fleet.gpus,
            "spokes": len(setup.fleet.spokes),
            "gpus_outside_guarantees": run.unused_gpus,
        },
        "window": {
            "start_s": window.start,
            "end_s": window.end,
            "definition": WINDOW_DEFINITION,
        },
        "utilization": metrics.utilization(outcome, window),
        "jobs": {
            "total": len(outcome.jobs),
            "finished": sum(1 for end in outcome.end if end is not None),
            "never_started": len(outcome.waiting),
            "never_started_by_reason": dict(sorted(never.items())),
            "never_started_by_team": dict(sorted(never_by_team.items())),
        },
        "avg_jct_s": jct["avg"],
        "p50_jct_s": jct["p50"],
        "p99_jct_s": jct["p99"],
        "avg_wait_s": wait["avg"],
        "p50_wait_s": wait["p50"],
        "p99_wait_s": wait["p99"],
        "avg_wait_wide_s": wide["avg"],
        "p99_wait_wide_s": wide["p99"],
        "avg_bounded_slowdown": bsld["avg"],
        "p99_bounded_slowdown": bsld["p99"],
        "preemptions": outcome.preemptions,
        "consolidations": outcome.consolidations,
        "cloud_instances": cloud["instances"],
        "cloud_unused_instances": cloud["unused_instances"],
        "cloud_gpu_hours": cloud["gpu_hours"],
        "cloud_cost": cloud["cost"],
        "teams": metrics.team_stats(outcome, window, run.guarantees, run.isolated),
        "makespan_s": outcome.finished_at,
        "cycles": outcome.cycles,
        "replay_seconds": outcome.wall_s,
    }


def write_report(report: dict[str, Any], out: Path) -> Path:
    """Write `report` as out/report.json; returns the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def _waiting_indexes(run: ReplayRun) -> list[int]:
    ids = set(run.outcome.waiting)
    return [i for i, job in enumerate(run.outcome.jobs) if job.id in ids]
