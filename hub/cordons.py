"""Cordoned spokes: an operator takes a spoke out of placement, for maintenance or a fault.

A cordoned spoke gets no new work (placement sees it as not accepting work, as a suspect
one) while what runs there runs on, and its idle GPUs are not on offer (`/v1/spokes`,
`gpufed_gpus_free`); burst sees the waiting work as no spoke's. Cordons are kept in the
store's settings (key `cordons`, JSON), so a restarted hub, or a standby that takes over,
keeps them. Setting one is admin only and audited (`spoke.cordon`, `spoke.uncordon`).
"""

from __future__ import annotations

import json

from pydantic import TypeAdapter

from hub.records import Cordon
from hub.state import HubState

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
