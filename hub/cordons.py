"""Cordoned spokes: an operator takes a spoke out of placement, for maintenance or a fault.

A cordoned spoke gets no new work (placement sees it as not accepting work, as a suspect
one) while what runs there runs on, and its idle GPUs are not on offer (`/v1/spokes`,
`gpufed_gpus_free`); burst sees the waiting work as no spoke's. Cordons are kept in the
store's settings (key `cordons`, JSON), so a restarted hub, or a standby that takes over,
keeps them. Setting one is admin only and audited (`spoke.cordon`, `spoke.uncordon`).

`drain` cordons a spoke and moves its work too: each workload its spoke's loss would move
(`WorkloadSpec.moved_when_spoke_lost`) gets a Preempt, so its spoke stops it (its stop grace
given) and it is queued again, without counting a restart, for placement elsewhere. The rest
(restart_policy `never`, on_hub_loss `keep`: work that must not run twice or be cut) runs on,
named in the answer, for its owners to end or the operator to cancel. Audited `spoke.drain`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from hub import publishing, transitions
from hub.records import Cordon, DecisionRecord, WorkloadRecord
from hub.state import HubState
from schemas import HubLoss

CORDONS_KEY = "cordons"

_CORDONS = TypeAdapter(dict[str, Cordon])


async def load(state: HubState) -> None:
    """The cordons the store keeps (none when it keeps none)."""
    text = await state.db(state.store.get_setting, CORDONS_KEY)
    state.cordons = _CORDONS.validate_json(text) if text else {}


async def put(state: HubState, spoke_id: str, cordon: Cordon | None) -> None:
    """Cordon `spoke_id` (None: uncordon), stored before it takes effect; then a cycle.

    Under the state's lock: two operators cordoning two spokes at once each read the other's
    write, rather than the later one storing the set without the earlier one's spoke."""
    async with state.lock:
        cordons = dict(state.cordons)
        if cordon is None:
            cordons.pop(spoke_id, None)
        else:
            cordons[spoke_id] = cordon
        document = json.dumps({k: v.model_dump() for k, v in sorted(cordons.items())})
        await state.db(state.store.put_setting, CORDONS_KEY, document, state.clock())
        state.cordons = cordons
    state.trigger()  # uncordoned: its GPUs are on offer again at once


@dataclass
class Drained:
    """What `drain` did: the workloads requeued, those left running (with why), and the
    Preempts to publish."""

    requeued: list[WorkloadRecord] = field(default_factory=list)
    left: list[tuple[WorkloadRecord, str]] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)


async def drain(state: HubState, spoke_id: str, cordon: Cordon) -> Drained:
    """Cordon `spoke_id` and preempt the work its loss would move (see the module); the
    Preempts are saved with their records, for the caller to publish."""
    await put(state, spoke_id, cordon)
    drained = Drained()
    async with state.lock:
        now = state.clock()
        why = f"spoke {spoke_id} drained by {cordon.by}" + (
            f": {cordon.reason}" if cordon.reason else ""
        )
        for w in list(state.workloads.values()):
            live = w.live
            if live is None or live.spoke_id != spoke_id or w.preempting or w.cancel_requested:
                continue
            if not w.spec.moved_when_spoke_lost:
                drained.left.append((w, _stays(w)))
                continue
            transitions.mark_preempting(w, None, why, now)
            drained.decisions.append(publishing.stop(w, "preempt", why, state.term, now))
            drained.requeued.append(w)
        await state.save(drained.requeued, drained.decisions)
    return drained


def _stays(w: WorkloadRecord) -> str:
    """Why drain leaves `w` running: what its spec says."""
    if w.spec.on_hub_loss == HubLoss.KEEP:
        return "on_hub_loss keep: it is never moved"
    return "restart_policy never: moved, it would run again from the start"
