"""Idle sessions and idle GPUs, applied: readings from the spokes' reports, stops sent as cancels.

`note_activity` keeps, from each capacity report, what `hub.core.idle.track` makes of the
readings of the workloads it lists (live attempts only). `IdleReaper.reap` asks
`hub.core.idle.decide` which running workloads the policy stops, and stops each the way a
user's cancel does, with the reason and a notice in its history: when its spoke reports it
cancelled, it ends `idle_culled`, `max_lifetime` or `idle_reclaimed` instead of `cancelled`.
"""

from __future__ import annotations

import structlog

from hub import publishing
from hub.core.idle import Activity, Watched, decide, flagged, track
from hub.core.policy import PriorityClass
from hub.publishing import Publisher
from hub.records import DecisionRecord, WorkloadRecord
from hub.state import HubState
from schemas import CapacityReport, Phase, WorkloadKind

log = structlog.get_logger(__name__)

#: Seconds between two looks at the running workloads (the cycle loop runs far more often).
REAP_EVERY_S = 0.5


def note_activity(state: HubState, report: CapacityReport, now: float) -> None:
    """Update the activity of the workloads `report` lists that run there under that epoch."""
    threshold = state.policy_at(now).idle.util_percent
    for ref in report.running:
        w = state.workloads.get(ref.workload_id)
        live = w.live if w is not None else None
        if live is None or live.epoch != ref.epoch or live.spoke_id != report.spoke_id:
            continue
        previous = state.activity.get(ref.workload_id)
        earlier = previous[1] if previous is not None and previous[0] == ref.epoch else None
        activity = track(earlier, ref.gpu_util, ref.quiet_s, threshold, now)
        state.activity[ref.workload_id] = (ref.epoch, activity)


def flagged_idle_s(state: HubState, w: WorkloadRecord, now: float) -> float | None:
    """Seconds `w`'s GPUs have been idle, once past the policy's flag time; else None."""
    entry = state.activity.get(w.id)
    if entry is None or entry[0] != w.epoch or w.phase != Phase.RUNNING:
        return None
    return flagged({w.id: entry[1]}, state.policy_at(now).idle, now).get(w.id)


def idle_seconds(state: HubState, now: float) -> dict[str, float]:
    """Workload id -> seconds its GPUs have been idle, for those past the policy's flag time."""
    current = {
        wid: activity
        for wid, (epoch, activity) in state.activity.items()
        if (w := state.workloads.get(wid)) is not None
        and w.phase == Phase.RUNNING
        and w.epoch == epoch
    }
    return flagged(current, state.policy_at(now).idle, now)


class IdleReaper:
    """Stops what the policy says sits idle too long (see the module docstring)."""

    def __init__(self, state: HubState, publisher: Publisher) -> None:
        self.state = state
        self.publisher = publisher
        self._last = float("-inf")

    async def reap(self) -> list[str]:
        """Stop the workloads the policy stops now; returns their ids.

        A failure is logged and costs this look only: it never holds up the scheduling cycle.
        """
        try:
            return await self._reap()
        except Exception:
            log.exception("idle_reap_failed")
            return []

    async def _reap(self) -> list[str]:
        state = self.state
        now = state.clock()
        if now - self._last < REAP_EVERY_S:
            return []
        self._last = now
        policy = state.policy_at(now)
        sessions = policy.sessions
        limits_sessions = sessions.idle_after_s is not None or sessions.max_lifetime_s is not None
        reclaims = policy.idle.reclaim_after_s is not None
        if not limits_sessions and not reclaims:
            return []  # the policy stops nothing (the default): no look at all
        classes = set(policy.idle.reclaim_classes) if reclaims else set()
        decisions: list[DecisionRecord] = []
        stopped: list[WorkloadRecord] = []
        async with state.lock:
            watched = [
                _watched(w, state, policy.priority_class(w.spec.priority_class))
                for w in state.workloads.values()
                if w.phase == Phase.RUNNING
                and not w.cancel_requested
                and w.started_at is not None
                and (w.spec.kind == WorkloadKind.SESSION or w.spec.priority_class in classes)
            ]
            for stop in decide(watched, policy.sessions, policy.idle, now):
                w = state.workloads[stop.workload_id]
                w.cancel_requested = True
                w.stop_reason, w.stop_notice = stop.reason.value, stop.message
                w.note(now, "stopping", stop.message)
                decisions.append(publishing.stop(w, "cancel", stop.reason.value, state.term, now))
                stopped.append(w)
                log.info("workload_idle_stop", workload=w.id, reason=stop.reason.value)
            if stopped:
                await state.save(stopped, decisions)
        await self.publisher.publish(decisions)
        return [w.id for w in stopped]


def _watched(w: WorkloadRecord, state: HubState, cls: PriorityClass | None) -> Watched:
    entry = state.activity.get(w.id)
    activity = entry[1] if entry is not None and entry[0] == w.epoch else Activity()
    assert w.started_at is not None
    return Watched(
        workload_id=w.id,
        kind=w.spec.kind,
        priority_class=w.spec.priority_class,
        started_at=w.started_at,
        activity=activity,
        preemptible=cls.preemptible if cls is not None else True,
    )
