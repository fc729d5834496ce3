"""A fenced Job stops once its spoke's lease runs out, spoke or no spoke.

A spoke stops its movable work once it has not heard the hub for fence_after (`spoke.fencing`),
before the hub, after lost_after, runs that work elsewhere. A spoke process that stays dead
stops nothing, and the Jobs it made would run on beside the hub's copies. So a fenced Job
carries the lease in its own `spec.activeDeadlineSeconds`: seconds from its `status.startTime`
to the spoke's deadline (heard_at + fence_after), rounded down, never past the workload's
`max_runtime_s`. The Job controller fails a Job past it (reason `DeadlineExceeded`) and
terminates its pods, given the stop grace (`terminationGracePeriodSeconds`); a spoke that
comes back reports it preempted, reason `fenced` (no restart counted).

While the spoke lives it moves the deadline on as the hub acknowledges its reports: one PATCH
per fenced Job once less than half of fence_after is left before its deadline (about one a
minute per Job at the default lost_after of 120 s), and at once where the lease came closer
(the hub's lost_after lowered). A Job's deadline is therefore never later than the spoke's own.
The cluster's clock must agree with the spoke host's (NTP) to well within the margin between
fence_after and lost_after (the stop grace and three heartbeats).

Pure functions; `keeper.DeadlineKeeper` applies them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: On a Job the lease may stop: "true".
ANNOTATION_FENCED = "gpufed.io/fenced"
#: The workload's own limit, by which a Job past its deadline is told from a fenced one.
ANNOTATION_MAX_RUNTIME = "gpufed.io/max-runtime-s"
#: The shortest fence_after a Job carries: its deadline is whole seconds, looked at every
#: second, and moved on once half of fence_after is left, so that a PATCH has seconds to land.
#: A shorter one (test set-ups, not the default's 109 s) the spoke applies only while it lives.
MIN_FENCE_AFTER_S = 6.0
#: What a Job's end says when its lease stopped it.
FENCED_MESSAGE = "stopped by its lease: the spoke had not heard the hub for fence_after"


@dataclass(frozen=True, slots=True)
class JobLease:
    """What a fenced Job's manifest carries: its first deadline (None while the hub was never
    heard: set once it is) and the grace its pods get when the deadline ends them."""

    deadline_s: int | None
    grace_s: int


def active_deadline(deadline: float, started_at: float, max_runtime_s: int | None) -> int:
    """The `activeDeadlineSeconds` that ends a Job started at `started_at` by `deadline`
    (unix seconds): whole seconds, rounded down (early, the safe side), at least 1 (the API's
    least; a lease already run out ends the Job at once), and never past `max_runtime_s`."""
    seconds = max(1, math.floor(deadline - started_at))
    return seconds if max_runtime_s is None else min(seconds, max_runtime_s)


def renewed(
    current: int | None,
    started_at: float,
    deadline: float,
    max_runtime_s: int | None,
    now: float,
    renew_within_s: float,
) -> int | None:
    """The new `activeDeadlineSeconds` of a running fenced Job, or None to leave it.

    Lowered at once when the lease's deadline came before the Job's; raised to the lease's
    only once the Job's deadline is within `renew_within_s` of `now`, so that each PATCH buys
    a good stretch of time rather than a heartbeat's.
    """
    wanted = active_deadline(deadline, started_at, max_runtime_s)
    if current is None or wanted < current:
        return wanted
    if wanted == current or started_at + current - now >= renew_within_s:
        return None
    return wanted


def start_time_of(job: Mapping[str, Any]) -> float | None:
    """When a Job started, as unix seconds: its `status.startTime`, else its
    `metadata.creationTimestamp` (a moment before it); None when it has neither as an RFC 3339
    time."""
    for text in (
        (job.get("status") or {}).get("startTime"),
        (job.get("metadata") or {}).get("creationTimestamp"),
    ):
        if isinstance(text, str):
            try:
                return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def max_runtime_of(annotations: Mapping[str, str]) -> int | None:
    """The workload's own `max_runtime_s` a fenced Job's annotations carry (None: none)."""
    limit = annotations.get(ANNOTATION_MAX_RUNTIME, "")
    return int(limit) if limit.isdigit() else None


def fenced_by_lease(job: Mapping[str, Any]) -> bool:
    """Whether a Job that ran past its `activeDeadlineSeconds` was stopped by its lease rather
    than its workload's `max_runtime_s`: a fenced Job whose deadline is below that limit."""
    metadata = job.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if annotations.get(ANNOTATION_FENCED) != "true":
        return False
    seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
    limit = max_runtime_of(annotations)
    return not isinstance(seconds, int) or limit is None or seconds < limit
