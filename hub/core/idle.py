"""Idle sessions and idle GPUs: when a running workload is stopped for sitting idle.

Spokes report, with every heartbeat, each running workload's GPU utilisation (the busiest of
the devices it holds, percent) and, for a session or service, how long its port has carried
no traffic. `track` turns those readings into since-when facts on the hub's clock; `decide`
says which workloads the policy stops now:

- a **session** whose GPUs have stayed under `idle.util_percent` *and* whose port has been
  quiet for `sessions.idle_after_s` is culled (`idle_culled`); one running longer than
  `sessions.max_lifetime_s` is stopped (`max_lifetime`);
- any running workload of a class in `idle.reclaim_classes`, and any session, whose GPUs have
  stayed idle for `idle.reclaim_after_s` is reclaimed (`idle_reclaimed`) — never one of a
  class that may not be preempted (production).

A reading that is missing (no telemetry, no port) never makes anything idle: a session on a
spoke that cannot tell is only ever stopped by its maximum lifetime.

Pure: values in, values out; `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hub.core.lifecycle import EndReason
from schemas import WorkloadKind


@dataclass(frozen=True, slots=True)
class SessionRules:
    """The policy's `sessions:` section (None: that limit is off)."""

    idle_after_s: float | None = None
    max_lifetime_s: float | None = None


@dataclass(frozen=True, slots=True)
class IdleRules:
    """The policy's `idle:` section.

    Allocated GPUs idle for `flag_after_s` are flagged (`gpufed jobs`, `explain`); those of
    sessions and of `reclaim_classes` idle for `reclaim_after_s` (None: never) are reclaimed.
    """

    util_percent: float = 5.0
    flag_after_s: float = 600.0
    reclaim_after_s: float | None = None
    reclaim_classes: tuple[str, ...] = ("dev",)


@dataclass(frozen=True, slots=True)
class Activity:
    """What the hub knows of a running workload's activity, on its own clock.

    `gpu_idle_since`: since when its GPUs have been under the threshold without a break (None:
    busy, or not measured). `quiet_since`: since when its port has carried no traffic (None:
    no port, or not measured).
    """

    gpu_idle_since: float | None = None
    quiet_since: float | None = None


@dataclass(frozen=True, slots=True)
class Watched:
    """A running workload as `decide` sees it."""

    workload_id: str
    kind: WorkloadKind
    priority_class: str
    started_at: float
    activity: Activity
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class IdleStop:
    """Stop this workload, for this reason; `message` is the notice kept in its history."""

    workload_id: str
    reason: EndReason
    message: str


def track(
    previous: Activity | None,
    gpu_util: float | None,
    quiet_s: float | None,
    threshold: float,
    now: float,
) -> Activity:
    """The activity after one report: utilisation `gpu_util` and `quiet_s` quiet seconds.

    A GPU idle since an earlier report keeps its start; a busy reading clears it. The quiet
    time is the spoke's own count, so it needs no earlier report (and no shared clock).
    """
    gpu_idle_since = None
    if gpu_util is not None and gpu_util < threshold:
        earlier = previous.gpu_idle_since if previous is not None else None
        gpu_idle_since = earlier if earlier is not None else now
    quiet_since = None if quiet_s is None else now - max(0.0, quiet_s)
    return Activity(gpu_idle_since, quiet_since)


def idle_for(activity: Activity | None, now: float) -> float | None:
    """Seconds its GPUs have been idle without a break; None when they are not idle."""
    if activity is None or activity.gpu_idle_since is None:
        return None
    return max(0.0, now - activity.gpu_idle_since)


def decide(
    watched: Iterable[Watched], sessions: SessionRules, idle: IdleRules, now: float
) -> tuple[IdleStop, ...]:
    """The workloads to stop now, each once, in the order given."""
    stops = []
    for w in watched:
        stop = _stop(w, sessions, idle, now)
        if stop is not None:
            stops.append(stop)
    return tuple(stops)


def flagged(activities: Mapping[str, Activity], idle: IdleRules, now: float) -> dict[str, float]:
    """Workload id -> idle seconds, for those idle at least `flag_after_s`."""
    out = {}
    for wid, activity in activities.items():
        seconds = idle_for(activity, now)
        if seconds is not None and seconds >= idle.flag_after_s:
            out[wid] = seconds
    return out


def describe_duration(seconds: float) -> str:
    """`14m`, `2h05m`, `45s`: how long, for a person."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _stop(w: Watched, sessions: SessionRules, idle: IdleRules, now: float) -> IdleStop | None:
    if not w.preemptible:
        return None  # production is never stopped behind its owner's back
    session = w.kind == WorkloadKind.SESSION
    gpu_idle = idle_for(w.activity, now)
    under = f"under {idle.util_percent:g} %"
    lifetime = sessions.max_lifetime_s
    if session and lifetime is not None and now - w.started_at >= lifetime:
        return IdleStop(
            w.workload_id,
            EndReason.MAX_LIFETIME,
            f"session stopped: it reached the maximum lifetime of "
            f"{describe_duration(lifetime)} (policy sessions.max_lifetime)",
        )
    quiet = w.activity.quiet_since
    if session and sessions.idle_after_s is not None and gpu_idle is not None and quiet is not None:
        quiet_s = now - quiet
        if min(gpu_idle, quiet_s) >= sessions.idle_after_s:
            return IdleStop(
                w.workload_id,
                EndReason.IDLE_CULLED,
                f"session culled: GPUs {under} and no traffic on its port for "
                f"{describe_duration(min(gpu_idle, quiet_s))} (policy sessions.idle_after "
                f"{describe_duration(sessions.idle_after_s)})",
            )
    reclaimable = session or w.priority_class in idle.reclaim_classes
    after = idle.reclaim_after_s
    if reclaimable and after is not None and gpu_idle is not None and gpu_idle >= after:
        return IdleStop(
            w.workload_id,
            EndReason.IDLE_RECLAIMED,
            f"GPUs reclaimed: {under} busy for {describe_duration(gpu_idle)} "
            f"(policy idle.reclaim_after {describe_duration(after)})",
        )
    return None
