"""Reconciliation: a spoke's full state against the hub's, and the work that moves as a result.

Two ways work leaves a spoke without an event: the spoke applied a placement but no longer has
it (requeued here, on a sync), or the spoke went silent past its lease (`declare_lost`).
"""

from __future__ import annotations

import structlog

from hub import transitions
from hub.core.lifecycle import EndReason
from hub.records import SpokeRecord, WorkloadRecord
from hub.state import HubState
from schemas import HubLoss, Phase, RunningRef, SyncReply, SyncRequest

log = structlog.get_logger(__name__)


async def reconcile(state: HubState, request: SyncRequest) -> SyncReply:
    """Compare a spoke's full state with ours; stop what was superseded, requeue what it lost.

    Idempotent: answering the same request again stops the same things and requeues nothing
    more (what was requeued is no longer assigned to that spoke).
    """
    spoke_id = request.spoke_id
    running = {r.workload_id: r.epoch for r in request.running}
    finished = {r.workload_id: r.epoch for r in request.finished}
    stop = []
    requeued: list[WorkloadRecord] = []
    async with state.lock:
        now = state.clock()
        for wid, epoch in sorted(running.items()):
            live = w.live if (w := state.workloads.get(wid)) else None
            if live is None or live.spoke_id != spoke_id or live.epoch != epoch:
                stop.append(RunningRef(workload_id=wid, epoch=epoch))
        for w in list(state.workloads.values()):
            live = w.live
            lost = (
                live is not None
                and live.spoke_id == spoke_id
                and w.id not in running
                and finished.get(w.id) != live.epoch
                and live.command_seq is not None
                and live.command_seq <= request.applied_seq
                and now - live.placed_at > state.settings.missing_grace_s
            )
            if lost:
                detail = f"{spoke_id} no longer has it"
                _end_unreported(state, w, EndReason.LOST_ON_SPOKE, now, detail)
                requeued.append(w)
        if requeued:
            await state.save(requeued)
    state.counters["syncs"] += 1
    if stop or requeued:
        log.warning(
            "sync_corrections",
            spoke=spoke_id,
            stop=[r.workload_id for r in stop],
            requeued=[w.id for w in requeued],
        )
        state.trigger()
    return SyncReply(stop=tuple(stop), requeued=tuple(w.id for w in requeued))


async def declare_lost(state: HubState, spoke: SpokeRecord, now: float) -> None:
    """Move the work of a spoke whose lease expired: requeued if it may restart, else failed."""
    async with state.lock:
        spoke.lost_at = now
        changed = []
        for w in list(state.workloads.values()):
            live = w.live
            if live is None or live.spoke_id != spoke.id:
                continue
            detail = f"spoke {spoke.id} silent for {now - spoke.last_seen:.0f}s"
            if w.spec.on_hub_loss == HubLoss.KEEP:
                # Its spoke keeps it running through any silence: moving it would run it
                # twice. It waits for its spoke (or a cancel) instead.
                w.note(now, "spoke_lost_kept", detail)
                changed.append(w)
                continue
            _end_unreported(state, w, EndReason.SPOKE_LOST, now, detail)
            changed.append(w)
        await state.save(changed)
    log.warning("spoke_lost", spoke=spoke.id, workloads=len(changed))
    state.counters["spokes_lost"] += 1
    state.trigger()


def _end_unreported(
    state: HubState, w: WorkloadRecord, reason: EndReason, now: float, detail: str
) -> None:
    # The spoke did not report this end: its last report may still list the devices, which
    # the snapshot must not count twice (see hub.core.fleet).
    ended = transitions.end(w, reason, now, detail)
    transitions.log_finished([w])
    state.metrics.attempt_ended(reason.value, requeued=w.phase == Phase.QUEUED)
    state.ended[w.id] = (transitions.running_of(ended, w), ended.epoch)
    if w.phase.terminal:
        state.forget(w.id)
