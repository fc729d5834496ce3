"""Moving a workload record through its lifecycle, and writing down what happened.

The rules are `hub.core.lifecycle`'s; these functions apply them to a `WorkloadRecord` and add
the history entries a person reads. None of them saves, publishes or logs: the caller does
the first two, in that order, and logs what finished with `log_finished` once per batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from bus.loglines import LineThrottle
from hub.core import lifecycle
from hub.core.lifecycle import Attempt, EndReason, Verdict
from hub.core.model import RunningWorkload
from hub.core.ordering import served
from hub.records import WorkloadRecord
from schemas import Assignment, Phase

log = structlog.get_logger(__name__)


def place(
    w: WorkloadRecord, spoke_id: str, assignments: tuple[Assignment, ...], now: float
) -> None:
    """Open a new attempt on `spoke_id` (the next epoch)."""
    w.lifecycle = lifecycle.place(w.lifecycle, spoke_id, assignments, now)
    if w.reason or w.message:  # why it waited (most are placed by the cycle that takes them)
        w.reason = w.message = ""
    w.note(now, "placed", describe(assignments))


def start(w: WorkloadRecord, now: float, endpoint: str | None = None) -> None:
    """Its spoke reports the live attempt running (a session or service: at `endpoint`)."""
    w.lifecycle = lifecycle.start(w.lifecycle, w.epoch, now, endpoint)
    w.note(now, "running", f"at {endpoint}" if endpoint else "")


def mark_preempting(w: WorkloadRecord, for_workload: str | None, reason: str, now: float) -> None:
    """A Preempt goes out for its live attempt."""
    w.lifecycle = lifecycle.mark_preempting(w.lifecycle, w.epoch, for_workload)
    w.note(now, "preempting", reason)


def end(
    w: WorkloadRecord,
    reason: EndReason,
    now: float,
    detail: str,
    exit_code: int | None = None,
) -> Attempt:
    """End the live attempt for `reason`: the workload is queued again or finished.

    Returns the ended attempt.
    """
    rules = w.retry_rules
    verdict = lifecycle.verdict(reason, w.restarts, rules)
    w.note(now, reason.value, detail)
    w.lifecycle = lifecycle.end(w.lifecycle, w.epoch, reason, now, rules, exit_code)
    ended = w.attempts[-1]
    if verdict is Verdict.REQUEUE:
        w.note(now, "requeued")
        # Until a scheduling cycle says what it waits for (tens of milliseconds, longer when
        # cycles are paced under load), the queue shows why it is back in it: never a queued
        # workload that ran without a word. No reason code: no cycle has looked at it yet.
        w.message = f"queued again: its run on {ended.spoke_id} ended ({reason.value})"
        return ended
    w.finished_at = now
    w.reason = "" if w.phase == Phase.SUCCEEDED else reason.value
    w.message = f"{detail} (restarts exhausted)" if verdict is Verdict.EXHAUSTED else detail
    if w.phase != reason.phase:
        w.message = f"{w.message} (cancel requested)".strip()
    return ended


def log_finished(
    records: Sequence[WorkloadRecord], lines: LineThrottle | None = None, now: float = 0.0
) -> None:
    """One info line for the workloads of `records` that reached a terminal phase.

    One line per batch, not per workload: at hundreds of workloads a second a line each was a
    fifth of the hub's CPU; and at most a line a second (`lines`): a batch's line held back is
    counted in the next one's `unlisted`. A single one keeps its old shape (`workload_finished`).
    """
    done = [w for w in records if w.phase.terminal]
    if not done:
        return
    held = lines.allow(now, len(done)) if lines is not None else 0
    if held is None:
        return
    if len(done) == 1 and not held:
        w = done[0]
        log.info("workload_finished", workload=w.id, phase=w.phase.value, exit_code=_code(w))
        return
    log.info(
        "workloads_finished",
        count=len(done),
        workloads=[_finished(w) for w in done],
        **({"unlisted": held} if held else {}),
    )


def _code(w: WorkloadRecord) -> int | None:
    return w.attempts[-1].exit_code if w.attempts else None  # the attempt that just ended


def _finished(w: WorkloadRecord) -> str:
    code = _code(w)
    return f"{w.id}:{w.phase.value}" + (f":{code}" if code is not None else "")


def cancel_queued(w: WorkloadRecord, now: float) -> None:
    """Cancel a workload that holds nothing yet."""
    w.lifecycle = lifecycle.cancel_queued(w.lifecycle)
    w.finished_at = now
    w.reason = EndReason.CANCELLED.value
    w.message = "cancelled while queued"
    w.note(now, "cancelled", "cancelled while queued")


def as_running(w: WorkloadRecord) -> RunningWorkload | None:
    """The core's view of a workload that holds GPUs; None if it holds none."""
    live = w.live
    if live is None:
        return None
    return RunningWorkload(
        id=w.id,
        spec=w.spec,
        spoke_id=live.spoke_id,
        assignments=live.assignments,
        started_at=live.started_at or live.placed_at,
        preempting=live.preempting,
        preempted_for=live.preempted_for,
        attained_gpu_s=served(w.attempts, w.spec.total_gpus),
    )


def running_of(attempt: Attempt, w: WorkloadRecord) -> RunningWorkload:
    """The core's view of `w` as it was during `attempt` (for devices it may still hold)."""
    return RunningWorkload(
        id=w.id,
        spec=w.spec,
        spoke_id=attempt.spoke_id,
        assignments=attempt.assignments,
        started_at=attempt.started_at or attempt.placed_at,
        preempting=attempt.preempting,
        preempted_for=attempt.preempted_for,
    )


def describe(assignments: Sequence[Assignment]) -> str:
    """`node:devices[@fraction]; ...` for the history."""
    return "; ".join(
        f"{a.node}:{','.join(map(str, a.devices))}" + (f"@{a.fraction:g}" if a.fraction else "")
        for a in assignments
    )
