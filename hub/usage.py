"""GPU usage and cloud cost that add up: every attempt counts, every rented hour is billed.

Usage is counted per *attempt* (one run of a workload on a spoke, from running to its end):
a preempted or requeued run counts as much as the last one. Cloud cost is the whole bill of
each rented instance, from the request to the end (boot, idle and busy time), attributed to
the team whose demand launched it; it is not derived from workload GPU-hours, so an idle or
booting instance is still paid by someone.

Everything here is pure: records and a `now` in, numbers out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from hub.records import SpokeRecord, WorkloadRecord
from schemas import SpokeKind
from schemas.burst import InstanceEvent, InstanceState


class GroupBy(StrEnum):
    TEAM = "team"
    USER = "user"
    SPOKE = "spoke"


@dataclass(frozen=True, slots=True)
class AttemptUse:
    """What one attempt of a workload used: its spoke, GPUs and run time (`end` None: running).

    Only attempts that started running count: a placement that never ran held no GPU time.
    """

    workload_id: str
    team: str
    user: str
    spoke_id: str
    gpus: float
    start: float
    end: float | None
    outcome: str  # the event that ended it, or "running"


class InstanceBill(BaseModel):
    """What one burst instance costs: accrued from its lifecycle events, kept in the store."""

    burst_id: str
    team: str
    spoke_id: str
    provider: str
    instance_type: str
    price_per_hour: float
    requested_at: float
    running_at: float | None = None
    ended_at: float | None = None


def attempts_of(w: WorkloadRecord) -> list[AttemptUse]:
    """The attempts of one workload that ran, oldest first (the record keeps every one)."""
    return [
        AttemptUse(
            workload_id=w.id,
            team=w.spec.team,
            user=w.user,
            spoke_id=a.spoke_id,
            gpus=w.spec.total_gpus,
            start=a.started_at,
            end=a.ended_at,
            outcome=a.end_reason.value if a.end_reason is not None else "running",
        )
        for a in w.attempts
        if a.started_at is not None
    ]


def accrue_bill(bill: InstanceBill | None, event: InstanceEvent) -> InstanceBill:
    """The bill after `event`: opened by the first event, closed by the first end (idempotent)."""
    if bill is None:
        bill = InstanceBill(
            burst_id=event.burst_id,
            team=event.team,
            spoke_id=event.spoke_id or event.burst_id,
            provider=event.provider,
            instance_type=event.instance_type,
            price_per_hour=event.price_per_hour,
            requested_at=event.at,
        )
    update: dict[str, Any] = {}
    if event.state == InstanceState.RUNNING and bill.running_at is None:
        update["running_at"] = event.at
    if event.state.gone and bill.ended_at is None:
        update["ended_at"] = event.at
    if event.at < bill.requested_at:
        update["requested_at"] = event.at  # events may arrive out of order after a restart
    return bill.model_copy(update=update) if update else bill


def bill_cost(
    bill: InstanceBill, now: float, since: float = 0.0, until: float | None = None
) -> float:
    """Dollars of the instance's life inside [since, until) (until defaults to `now`)."""
    return (
        _overlap(bill.requested_at, bill.ended_at or now, since, until or now)
        / 3600
        * (bill.price_per_hour)
    )


def team_cost(
    bills: Iterable[InstanceBill], now: float, since: float = 0.0, until: float | None = None
) -> dict[str, float]:
    """Dollars per team of its instance bills inside [since, until): the one figure the budget,
    the usage report and the metrics all show for what a team's burst instances cost."""
    cost: dict[str, float] = defaultdict(float)
    for bill in bills:
        dollars = bill_cost(bill, now, since, until)
        if dollars > 0:
            cost[bill.team] += dollars
    return dict(cost)


def bill_breakdown(
    bill: InstanceBill, attempts: Iterable[AttemptUse], now: float
) -> dict[str, float]:
    """Seconds booting (requested, not joined), busy (some work ran) and idle (joined, none)."""
    end = bill.ended_at or now
    ready = min(bill.running_at or end, end)
    intervals = sorted(
        (max(a.start, ready), min(a.end or now, end))
        for a in attempts
        if a.spoke_id == bill.spoke_id
    )
    busy = 0.0
    cursor = ready
    for start, stop in intervals:
        start = max(start, cursor)
        if stop > start:
            busy += stop - start
            cursor = stop
    return {
        "boot_s": max(0.0, ready - bill.requested_at),
        "busy_s": busy,
        "idle_s": max(0.0, end - ready - busy),
    }


def usage_report(
    workloads: Iterable[WorkloadRecord],
    spokes: Mapping[str, SpokeRecord],
    bills: Iterable[InstanceBill],
    now: float,
    *,
    since: float = 0.0,
    until: float | None = None,
    by: GroupBy = GroupBy.TEAM,
) -> dict[str, Any]:
    """GPU-hours (on-prem and cloud) per team, user or spoke over [since, until), and cost.

    Every attempt's GPU-hours inside the window count; running ones up to `now`. Cloud cost is
    the instance bills inside the window: per team it goes to the team that launched each
    instance, per spoke to the instance's spoke; per user it is not split (a bill belongs to a
    team) and only the totals carry it. Totals equal the sum of the rows.
    """
    end = now if until is None else min(until, now)
    rows: dict[str, dict[str, float]] = defaultdict(_row)
    attempts = [a for w in workloads for a in attempts_of(w)]
    for a in attempts:
        hours = _overlap(a.start, a.end or now, since, end) / 3600 * a.gpus
        if hours <= 0:
            continue
        row = rows[_key(a, by)]
        spoke = spokes.get(a.spoke_id)
        cloud = spoke is not None and spoke.kind == SpokeKind.CLOUD.value
        row["gpu_hours_cloud" if cloud else "gpu_hours_onprem"] += hours
        row["attempts"] += 1
    instances = []
    total_cost = 0.0
    for bill in bills:
        cost = bill_cost(bill, now, since, end)
        if cost <= 0:
            continue
        total_cost += cost
        if by == GroupBy.TEAM:
            rows[bill.team]["cloud_cost"] += cost
        elif by == GroupBy.SPOKE:
            rows[bill.spoke_id]["cloud_cost"] += cost
        instances.append(
            {
                **bill.model_dump(),
                "cost": round(cost, 6),
                **{k: round(v, 3) for k, v in bill_breakdown(bill, attempts, now).items()},
            }
        )
    totals = {
        "gpu_hours_onprem": sum(r["gpu_hours_onprem"] for r in rows.values()),
        "gpu_hours_cloud": sum(r["gpu_hours_cloud"] for r in rows.values()),
        "attempts": sum(r["attempts"] for r in rows.values()),
        "cloud_cost": total_cost,
    }
    return {
        "since": since,
        "until": end,
        "by": by.value,
        "rows": {k: {n: round(v, 6) for n, v in r.items()} for k, r in sorted(rows.items())},
        "instances": sorted(instances, key=lambda i: i["requested_at"]),
        "totals": {k: round(v, 6) for k, v in totals.items()},
    }


def usage_series(
    workloads: Iterable[WorkloadRecord],
    bills: Iterable[InstanceBill],
    now: float,
    *,
    since: float,
    step: float,
) -> dict[str, Any]:
    """Per team and time bucket of `step` seconds from `since` to `now`: the average GPUs in
    use (GPU-seconds of its attempts / step) and the dollars of its instance bills."""
    count = max(1, int((now - since) // step) + 1)
    starts = [since + i * step for i in range(count)]
    gpus: dict[str, list[float]] = defaultdict(lambda: [0.0] * count)
    cost: dict[str, list[float]] = defaultdict(lambda: [0.0] * count)
    for w in workloads:
        for a in attempts_of(w):
            for i, t in enumerate(starts):
                seconds = _overlap(a.start, a.end or now, t, min(t + step, now))
                if seconds > 0:
                    gpus[a.team][i] += seconds * a.gpus / step
    for bill in bills:
        for i, t in enumerate(starts):
            dollars = bill_cost(bill, now, t, min(t + step, now))
            if dollars > 0:
                cost[bill.team][i] += dollars
    return {
        "since": since,
        "step": step,
        "t": starts,
        "gpus": {team: [round(v, 4) for v in values] for team, values in sorted(gpus.items())},
        "cost": {team: [round(v, 6) for v in values] for team, values in sorted(cost.items())},
    }


def _row() -> dict[str, float]:
    return {"gpu_hours_onprem": 0.0, "gpu_hours_cloud": 0.0, "attempts": 0.0, "cloud_cost": 0.0}


def _key(a: AttemptUse, by: GroupBy) -> str:
    if by == GroupBy.USER:
        return a.user or "(unknown)"
    if by == GroupBy.SPOKE:
        return a.spoke_id
    return a.team


def _overlap(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo))
