"""The hub's spend meter: the budget sent to burst, and the audit of launches and releases.

What a team spent this month is read from the instance bills (`hub.usage.team_cost`), the
same figure `/v1/usage` and the metrics show: there is no second meter to drift from them.
Every `every_s` it sets the budget the hub sends burst with its demand
(`HubState.burst_budget`). Instance events reach it through the hub's instance listeners, and
each launch and termination is appended to the audit log.
"""

from __future__ import annotations

import asyncio

import structlog

from bus.tasks import pause
from hub.audit import Auditor
from hub.core.spend import burst_budget, month_start
from hub.service import HubService
from hub.usage import team_cost
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
    """Sets burst's budget from the month's instance bills; audits launches and releases."""

    def __init__(self, hub: HubService, auditor: Auditor, every_s: float = 5.0) -> None:
        self.hub = hub
        self.auditor = auditor
        self.every_s = every_s
        hub.state.instance_listeners.append(self.on_instance)

    def spend(self) -> dict[str, float]:
        """Dollars per team this calendar month (UTC): its instance bills since the 1st."""
        now = self.hub.clock()
        return team_cost(self.hub.bills.values(), now, since=month_start(now))

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh the budget until `stop` is set (a failed round is logged; the next one
        tries again)."""
        while not stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("spend_budget_failed")
            await pause(stop, self.every_s)

    def step(self) -> None:
        """Set the budget sent to burst from the policy and this month's spend."""
        self.hub.state.burst_budget = burst_budget(self.hub.policy, self.spend())

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
