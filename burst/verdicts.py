"""Why the burst controller rents nothing for waiting work: logged, and told to the hub.

Each round's skips (`burst.core.model.Skip`) are logged once per change, and sent to the hub
as `BurstVerdicts` when they change and every VERDICTS_EVERY_S while there are any, so the
hub can say in `gpufed explain` why no cloud instance comes (a spent budget, no instance type
that fits, a team that may not burst) instead of leaving the user to read this log.
"""

from __future__ import annotations

import contextlib

import structlog

from burst.core.model import BurstPlan, SkipReason
from bus.client import Bus
from schemas.burst import (
    BURST_VERDICTS,
    MAX_DEMAND_ITEMS,
    MAX_WORKLOAD_IDS,
    BurstVerdict,
    BurstVerdicts,
)

log = structlog.get_logger(__name__)

#: Sent again, unchanged, this often while there are any (a hub that restarted learns them).
VERDICTS_EVERY_S = 10.0

#: ShortText's bound: a skip's message is cut to it, not refused.
MAX_MESSAGE = 256

#: Said elsewhere: `covered` work waits for the instance rented for it (`cloud_instance`).
_UNSAID = frozenset({SkipReason.COVERED})


def verdicts_of(plan: BurstPlan) -> tuple[BurstVerdict, ...]:
    """The round's skips that a waiting workload's owner should hear of, with their ids;
    within the message's bounds, so a long message or many skips never fail a round."""
    said = [s for s in plan.skipped if s.reason not in _UNSAID and s.workload_ids]
    return tuple(
        BurstVerdict(
            reason=s.reason.value,
            message=s.message[:MAX_MESSAGE],
            workload_ids=s.workload_ids[:MAX_WORKLOAD_IDS],
        )
        for s in said[:MAX_DEMAND_ITEMS]
    )


class SkipReports:
    """Logs a round's skips once per change and sends the hub the verdicts."""

    def __init__(self, bus: Bus, provider: str) -> None:
        self.bus = bus
        self.provider = provider
        self._logged: tuple[tuple[str, str, int], ...] = ()
        self._sent: tuple[BurstVerdict, ...] = ()
        self._sent_at = float("-inf")

    async def report(self, plan: BurstPlan, now: float) -> None:
        self._log(plan)
        verdicts = verdicts_of(plan)
        unchanged = verdicts == self._sent
        if unchanged and (not verdicts or now - self._sent_at < VERDICTS_EVERY_S):
            return
        message = BurstVerdicts(provider=self.provider, at=now, verdicts=verdicts)
        with contextlib.suppress(Exception):  # a lost report is replaced by the next one
            await self.bus.publish(BURST_VERDICTS, message.model_dump_json().encode())
            self._sent, self._sent_at = verdicts, now

    def _log(self, plan: BurstPlan) -> None:
        skips = tuple((s.item.team, s.reason.value, s.count) for s in plan.skipped)
        if skips == self._logged:
            return
        self._logged = skips
        for skip in plan.skipped:
            log.info(
                "burst_demand_skipped",
                team=skip.item.team,
                reason=skip.reason.value,
                count=skip.count,
                detail=skip.message,
            )
