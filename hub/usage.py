"""GPU usage and cloud cost per team, from workload records and the spokes they ran on."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from hub.records import SpokeRecord, WorkloadRecord
from schemas import SpokeKind
from schemas.burst import InstanceEvent


def team_usage(
    workloads: Iterable[WorkloadRecord],
    spokes: Mapping[str, SpokeRecord],
    instances: Iterable[InstanceEvent],
    now: float,
    since: float = 0.0,
) -> dict[str, Any]:
    """GPU-hours on-prem and in the cloud, and cloud cost, per team since `since`.

    A workload's cloud cost is its GPU-hours times the per-GPU-hour price its spoke reported;
    running workloads count up to `now`.
    """
    teams: dict[str, dict[str, float]] = defaultdict(
        lambda: {
            "gpu_hours_onprem": 0.0,
            "gpu_hours_cloud": 0.0,
            "cloud_cost": 0.0,
            "gpus_now": 0.0,
        }
    )
    for w in workloads:
        if w.started_at is None:
            continue
        start = max(w.started_at, since)
        end = w.finished_at if w.finished_at is not None else now
        spoke_id = w.spoke_id or _last_spoke(w)
        if end <= start or spoke_id is None:
            continue
        gpus = w.spec.total_gpus
        hours = (end - start) / 3600 * gpus
        spoke = spokes.get(spoke_id)
        report = spoke.report if spoke else None
        entry = teams[w.spec.team]
        if spoke is not None and spoke.kind == SpokeKind.CLOUD.value:
            entry["gpu_hours_cloud"] += hours
            entry["cloud_cost"] += hours * (report.price_per_gpu_hour if report else 0.0)
        else:
            entry["gpu_hours_onprem"] += hours
        if w.finished_at is None and w.phase.active:
            entry["gpus_now"] += gpus
    live: dict[str, int] = defaultdict(int)
    for instance in instances:
        if instance.state.active:
            live[instance.team] += 1
    for team, count in live.items():
        teams[team]["cloud_instances_now"] = count
    return {
        "since": since,
        "teams": {t: {k: round(v, 6) for k, v in e.items()} for t, e in sorted(teams.items())},
    }


def _last_spoke(w: WorkloadRecord) -> str | None:
    for entry in reversed(w.history):
        if entry.spoke_id:
            return entry.spoke_id
    return None
