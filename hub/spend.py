"""The hub's spend meter: accrues burst spend into the store and audits launches and releases.

Every `every_s` it accrues each burst instance's price since its mark (`hub.core.spend`) into
the store in one transaction, reloads this month's totals, and sets the budget the hub sends
burst with its demand (`HubState.burst_budget`). Instance events reach it through the hub's
instance listeners, and each launch and termination is appended to the audit log.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from hub.audit import Auditor
from hub.authstore import AuthStore
from hub.core.spend import accrue, burst_budget, month_of
from hub.service import HubService
from schemas.burst import InstanceEvent, InstanceState

log = structlog.get_logger(__name__)

#: The audit action of each state an instance enters.
_ACTIONS = {
    InstanceState.REQUESTED: ("burst.launch", "ok"),
    InstanceState.FAILED: ("burst.launch", "failed"),
    InstanceState.TERMINATING: ("burst.terminate", "ok"),
    InstanceState.TERMINATED: ("burst.terminate", "done"),
}


class SpendMeter:
    """Accrues burst spend, keeps the month's totals, audits burst's launches and releases."""

    def __init__(
        self, hub: HubService, store: AuthStore, auditor: Auditor, every_s: float = 5.0
    ) -> None:
        self.hub = hub
        self.store = store
        self.auditor = auditor
        self.every_s = every_s
        self.month_spend: dict[str, float] = {}
        hub.state.instance_listeners.append(self.on_instance)

    def spend(self) -> dict[str, float]:
        """Dollars accrued per team this month, as of the last step."""
        return dict(self.month_spend)

    async def run(self, stop: asyncio.Event) -> None:
        """Accrue until `stop` is set (a failed round is logged; the next one catches up)."""
        while not stop.is_set():
            try:
                await self.step()
            except Exception:
                log.exception("spend_accrual_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)

    async def step(self) -> None:
        """One accrual: store the spend since the marks, then refresh the budget sent to burst."""
        hub = self.hub
        now = hub.clock()
        month = month_of(now)
        marks = await hub.db(self.store.accruals)
        dollars, until = accrue(list(hub.instances.values()), marks, now)
        if dollars or until:
            await hub.db(self.store.accrue, month, dollars, until)
        self.month_spend = await hub.db(self.store.spend, month)
        hub.state.burst_budget = burst_budget(hub.policy, self.month_spend)

    async def on_instance(self, previous: InstanceEvent | None, event: InstanceEvent) -> None:
        """Audit an instance entering a new state (a repeated event is not audited twice)."""
        if previous is not None and previous.state is event.state:
            return
        action = _ACTIONS.get(event.state)
        if action is None:
            return
        name, result = action
        detail = f"{event.instance_type} {event.market.value} ${event.price_per_hour:g}/h"
        if event.reason:
            detail += f": {event.reason}"
        await self.auditor.record(
            None,
            name,
            actor="burst",
            team=event.team,
            target=event.burst_id,
            result=result,
            detail=detail,
        )
