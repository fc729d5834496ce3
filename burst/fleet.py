"""What the burst controller knows of each instance, and the fleet view its planner gets.

No I/O: the controller feeds in capacity reports and the time; `cloud_fleet` turns the records
into the planner's `CloudInstance`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from burst.core.model import CloudInstance
from schemas.burst import DemandReport, InstanceEvent, InstanceState
from schemas.capacity import CapacityReport


@dataclass(slots=True)
class InstanceRecord:
    """One burst instance as the controller knows it: its latest event plus what spokes said."""

    event: InstanceEvent
    launched_at: float
    watched_since: float  # when this controller started listening for its spoke
    joined_at: float | None = None
    last_seen: float | None = None
    idle_since: float | None = None
    running: frozenset[str] = frozenset()

    @property
    def state(self) -> InstanceState:
        return self.event.state

    def observe(self, report: CapacityReport, now: float) -> bool:
        """Take a capacity report of this instance's spoke; True when it just joined while
        still `requested` (the controller then marks it running)."""
        self.last_seen = now
        running = frozenset(ref.workload_id for ref in report.running)
        if running:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        self.running = running
        if self.joined_at is not None:
            return False
        self.joined_at = now
        return self.state is InstanceState.REQUESTED


def cloud_fleet(
    fleet: Mapping[str, InstanceRecord],
    now: float,
    spoke_silent_s: float,
    non_preemptible: set[str],
) -> list[CloudInstance]:
    """The live instances as the planner sees them (a silent spoke's work counts as idle)."""
    out = []
    for burst_id, record in sorted(fleet.items()):
        if not record.state.active:
            continue
        heard = record.last_seen if record.last_seen is not None else record.watched_since
        silent = now - heard > spoke_silent_s
        idle_since = record.idle_since
        if silent and record.state is InstanceState.RUNNING:
            # Its work is the hub's to move elsewhere once the spoke is lost.
            idle_since = heard if idle_since is None else min(idle_since, heard)
        event = record.event
        out.append(
            CloudInstance(
                id=burst_id,
                instance_type=event.instance_type,
                region=event.region,
                market=event.market,
                team=event.team,
                state=event.state,
                launched_at=record.launched_at,
                price_per_hour=event.price_per_hour,
                zone=event.zone,
                idle_since=idle_since,
                runs_non_preemptible=not silent and bool(record.running & non_preemptible),
                workload_ids=event.workload_ids,
            )
        )
    return out


def still_listed(
    non_preemptible: set[str], demand: DemandReport | None, fleet: Mapping[str, InstanceRecord]
) -> set[str]:
    """Of `non_preemptible`, the ids still pending, running on a cloud spoke, or some
    instance's reason (the rest are forgotten)."""
    if not non_preemptible:
        return non_preemptible
    keep = {w for item in (demand.items if demand else ()) for w in item.workload_ids}
    for record in fleet.values():
        if record.state.active:
            keep |= record.running
            keep.update(record.event.workload_ids)
    return non_preemptible & keep
