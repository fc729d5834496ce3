"""Read-only views the console and `gpufed top` show, built from the hub's memory (pure)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from hub.core.policy import Policy, quota_for
from hub.metrics import team_gpus
from hub.records import SpokeRecord, WorkloadRecord
from hub.usage import InstanceBill, team_cost
from schemas import Phase


def teams_view(
    policy: Policy,
    workloads: Iterable[WorkloadRecord],
    spokes: Mapping[str, SpokeRecord],
    bills: Iterable[InstanceBill],
    now: float,
) -> list[dict[str, Any]]:
    """Per team: GPUs guaranteed, used and borrowed per model, work waiting, cloud cost.

    Borrowed is what a team uses beyond its guarantee for that model (the part preemption may
    reclaim for others); a team the policy does not name gets the default team's quotas.
    """
    active = list(workloads)
    models = {
        (spoke.id, node.name): node.gpu_model
        for spoke in spokes.values()
        if spoke.report is not None
        for node in spoke.report.nodes
    }
    using = team_gpus(active, models)
    queued: dict[str, int] = defaultdict(int)
    for w in active:
        if w.phase == Phase.QUEUED:
            queued[w.spec.team] += 1
    cost = team_cost(bills, now)
    names = {t.name for t in policy.teams} | {t for t, _ in using} | set(queued) | set(cost)
    out = []
    for name in sorted(names):
        team = policy.team(name)
        per_model: dict[str, dict[str, float | None]] = {}
        for model, quota in team.quotas.items():
            per_model[model] = {"guaranteed": quota.guaranteed, "limit": quota.limit, "using": 0.0}
        for (t, model), gpus in using.items():
            if t != name:
                continue
            found = quota_for(team.quotas, model)
            entry = per_model.setdefault(
                model,
                {
                    "guaranteed": found.guaranteed if found else 0.0,
                    "limit": found.limit if found else None,
                    "using": 0.0,
                },
            )
            entry["using"] = gpus
        borrowing = 0.0
        for model, entry in per_model.items():
            if model == "*":
                continue
            used = float(entry["using"] or 0.0)
            borrowing += max(0.0, used - float(entry["guaranteed"] or 0.0))
        out.append(
            {
                "team": name,
                "listed": name in {t.name for t in policy.teams},
                "weight": team.weight,
                "may_burst": team.may_burst,
                "models": per_model,
                "using": sum(g for (t, _), g in using.items() if t == name),
                "guaranteed": sum(q.guaranteed for q in team.quotas.values()),
                "borrowing": borrowing,
                "queued": queued.get(name, 0),
                "cloud_cost": round(cost.get(name, 0.0), 6),
            }
        )
    return out
