"""What the API and the metrics read of a hub: its in-memory view and its queries.

A base of `HubService`, kept apart so the service only orchestrates. Reads only: nothing here
changes a workload, and store reads go through the hub's one database thread (`HubState.db`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from bus.client import Bus
from hub.apimodels import SpokeOut
from hub.core.policy import Policy
from hub.errors import NotFound
from hub.leases import Leases, SpokeStatus
from hub.metrics import HubMetrics, gpu_counts
from hub.ports import Store
from hub.publishing import Publisher
from hub.records import Cordon, SpokeRecord, WorkloadRecord
from hub.retention import not_found
from hub.state import HubState
from hub.usage import GroupBy, InstanceBill, usage_report, usage_series
from hub.views import teams_view
from schemas import CapacityReport, Phase
from schemas.burst import DemandReport, InstanceEvent


class HubView:
    """The hub's state as the API, the console and the metrics see it."""

    state: HubState
    store: Store
    bus: Bus
    leases: Leases
    publisher: Publisher
    clock: Callable[[], float]
    ready: asyncio.Event
    standby: bool
    leader_url: str  # the leading replica's API URL as last read from the store ("": unknown)

    # --- the in-memory view, as it was before the split (tests and the API read these) ---

    @property
    def policy(self) -> Policy:
        """The policy in force (`set_policy` validates and persists a new one)."""
        return self.state.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.state.put_policy(policy)

    @property
    def workloads(self) -> dict[str, WorkloadRecord]:
        """Non-terminal workloads by id."""
        return self.state.workloads

    @property
    def reports(self) -> dict[str, CapacityReport]:
        return self.state.reports

    @property
    def spokes(self) -> dict[str, SpokeRecord]:
        return self.state.spokes

    @property
    def fleet(self) -> dict[str, SpokeRecord]:
        """The spokes shown (`/v1/spokes`, the console, per-spoke metrics): all but a cloud
        spoke whose instance is gone (given back, reclaimed, failed) once the hub has declared
        it lost and moved its work. Its record stays (usage by spoke); listed for ever as
        lost, it would keep the spoke-lost alert firing after every burst."""
        instances = self.state.instances
        return {
            sid: spoke
            for sid, spoke in self.state.spokes.items()
            if spoke.lost_at is None or sid not in instances or not instances[sid].state.gone
        }

    @property
    def instances(self) -> dict[str, InstanceEvent]:
        return self.state.instances

    @property
    def cordons(self) -> dict[str, Cordon]:
        """Spokes out of placement (`hub.cordons`)."""
        return self.state.cordons

    @property
    def bills(self) -> dict[str, InstanceBill]:
        """What each burst instance costs (`hub.usage`)."""
        return self.state.bills

    @property
    def positions(self) -> dict[str, int]:
        """Queued workloads' places in the last cycle's queue order."""
        return self.state.positions

    @property
    def metrics(self) -> HubMetrics:
        return self.state.metrics

    @property
    def counters(self) -> Counter[str]:
        return self.state.counters

    @property
    def demand(self) -> DemandReport:
        """The demand report last published to burst."""
        return self.publisher.demand

    # --- queries (the API's) ---

    async def get_workload(self, workload_id: str) -> WorkloadRecord:
        """A workload, live or ended; raises NotFound."""
        record = self.workloads.get(workload_id) or await self.state.db(self.store.get, workload_id)
        if record is None:
            raise NotFound(not_found(workload_id, self.state.settings.keep_ended_s))
        return record

    async def find_by_ids(self, workload_ids: Sequence[str]) -> dict[str, WorkloadRecord]:
        """The workloads of these ids that there are, live or ended, by id."""
        found = {wid: w for wid in workload_ids if (w := self.workloads.get(wid)) is not None}
        rest = [wid for wid in workload_ids if wid not in found]
        if rest:
            found.update((w.id, w) for w in await self.state.db(self.store.get_many, rest))
        return found

    async def find_workloads(
        self,
        team: str | None = None,
        phases: Sequence[Phase] = (),
        limit: int = 500,
        teams: Sequence[str] | None = None,
        since: float | None = None,
    ) -> list[WorkloadRecord]:
        """Workloads of a team (or of `teams`) and phases (any if not given), newest first;
        submitted at or after `since` when given."""
        return await self.state.db(
            self.store.find,
            team=team,
            teams=teams,
            phases=phases,
            limit=max(1, limit),
            since=since,
        )

    async def usage(
        self,
        since: float = 0.0,
        until: float | None = None,
        by: GroupBy = GroupBy.TEAM,
        teams: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """GPU-hours of every attempt and instance bills over [since, until) (`hub.usage`);
        of `teams` only when given. `kept_since`: runs of workloads that ended before it may
        be gone from the store (`hub.retention` removed some), so a window reaching back
        further may miss them; None while none was removed."""
        now = self.clock()
        end = now if until is None else min(until, now)
        records = await self.state.db(self.store.used_between, since, end, teams)
        bills = await self.state.db(self.store.bills, since, end, teams)
        report = usage_report(records, self.spokes, bills, now, since=since, until=until, by=by)
        return {**report, "kept_since": await self.state.db(self.store.removed_before)}

    async def usage_series(
        self, since: float, step: float, teams: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """GPUs in use and cost per team in buckets of `step` seconds since `since`; of `teams`
        only when given."""
        now = self.clock()
        records = await self.state.db(self.store.used_between, since, now, teams)
        bills = await self.state.db(self.store.bills, since, now, teams)
        return usage_series(records, bills, now, since=since, step=step)

    def teams(self) -> list[dict[str, Any]]:
        """Per team: guaranteed, used and borrowed GPUs, queued work, cost (`hub.views`)."""
        return teams_view(
            self.policy, self.workloads.values(), self.spokes, self.bills.values(), self.clock()
        )

    def lease_state(self, spoke: SpokeRecord, now: float) -> str:
        """`ready`, `suspect` or `lost` (the metrics' label)."""
        if spoke.lost_at is not None:
            return "lost"
        return self.leases.status(spoke, now).value

    def nats_reconnects(self) -> int:
        """Times the hub's NATS connection came back since start."""
        return self.bus.reconnects

    def spoke_status(self, spoke: SpokeRecord, now: float) -> SpokeStatus:
        """Ready, suspect or lost."""
        return self.leases.status(spoke, now)

    def spoke_view(self, spoke_id: str, now: float) -> SpokeOut:
        """One spoke as `/v1/spokes` shows it: status, GPUs on offer, cordon."""
        spoke = self.spokes[spoke_id]
        report = spoke.report
        status = self.spoke_status(spoke, now)
        cordon = self.cordons.get(spoke_id)
        # Not on offer: a cordoned spoke's or node's idle GPUs, nor any of a lost spoke's (its
        # work was moved; a suspect one's idle GPUs are still its own, for the seconds it may be).
        on_offer = status is not SpokeStatus.LOST and cordon is None
        gpus = {
            model: {"total": total, "free": free}
            for model, total, _, free in (gpu_counts(report, on_offer) if report else ())
        }
        return SpokeOut.model_validate(
            {
                "id": spoke.id,
                "region": spoke.region,
                "kind": spoke.kind,
                "status": status.value,
                "last_seen_s_ago": round(now - spoke.last_seen, 1),
                "nodes": len(report.nodes) if report else 0,
                "gpus": gpus,
                "running": len(report.running) if report else 0,
                "labels": dict(report.labels) if report else {},
                "cordoned": cordon,
            }
        )

    def health(self) -> dict[str, Any]:
        """Readiness and counters for `/v1/health`."""
        return {
            "ok": self.ready.is_set(),
            "role": "standby" if self.standby else "leader",
            "term": self.state.term,
            "leader": self.leader_url,
            "store": "ok" if self.state.store_down_since is None else "unavailable",
            "store_unavailable_since": self.state.store_down_since,
            "workloads_active": len(self.workloads),
            "spokes": len(self.fleet),  # as /v1/spokes lists them
            "counters": dict(self.counters),
        }
