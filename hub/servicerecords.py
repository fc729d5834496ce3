"""What the hub keeps of each inference service (in the store) and of its replicas' health and
traffic (in memory only), as `hub.services` and the gateway use them."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from hub.core.autoscale import Recommendation
from hub.core.servicecost import ReplicaRun
from hub.records import HistoryEntry, SpokeRecord, WorkloadRecord
from schemas import CapacityReport, WorkloadSpec
from schemas.events import without_log_path
from schemas.services import ServiceSpec

MAX_HISTORY = 200
#: Replicas that fail while a request waits for one, after which it is answered at once (it
#: would wait the whole `wake_timeout_s` for a service that cannot start).
GIVE_UP_AFTER_FAILED = 2


class ReplicaRef(BaseModel):
    """One replica workload of a service, of spec `generation`."""

    workload_id: str
    generation: int
    index: int
    stopping: bool = False  # to stop: no longer counted or routed to; drained, then cancelled
    cancelled: bool = False


class ServiceRecord(BaseModel):
    """A service as the hub keeps it: its spec, its replicas, what they served and cost."""

    spec: ServiceSpec
    generation: int = 1
    created_at: float
    updated_at: float
    created_by: str = ""
    replicas: list[ReplicaRef] = Field(default_factory=list)
    next_index: int = 0
    requests: int = 0
    retired_gpu_seconds: float = 0.0  # of replicas that ended
    retired_dollars: float = 0.0
    desired: int = 0
    reason: str = ""
    message: str = ""
    history: list[HistoryEntry] = Field(default_factory=list)

    @property
    def key(self) -> str:
        return service_key(self.spec.team, self.spec.name)

    def note(self, at: float, event: str, detail: str = "") -> None:
        self.history.append(HistoryEntry(at=at, event=event, detail=detail))
        del self.history[:-MAX_HISTORY]


def service_key(team: str, name: str) -> str:
    return f"{team}/{name}"


@dataclass
class Health:
    """What the controller knows of one replica's health (memory only)."""

    ready: bool = False
    failures: int = 0
    next_probe: float = 0.0
    probing: bool = False
    requests: int = 0
    active: int = 0  # requests the gateway is proxying to it now
    stopping_since: float | None = None


@dataclass
class Traffic:
    """A service's requests as the gateway routes them (memory only)."""

    in_flight: int = 0
    waiting: int = 0
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))
    last_request_at: float | None = None
    turn: int = 0  # round robin
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    history: tuple[Recommendation, ...] = ()
    start_after: float = 0.0  # back-off after failed replicas
    failed_in_row: int = 0

    def rps(self, window_s: float, now: float) -> float:
        """Requests a second over the last `window_s` (older arrivals are forgotten)."""
        while self.arrivals and now - self.arrivals[0] > window_s:
            self.arrivals.popleft()
        return len(self.arrivals) / window_s

    def notify(self) -> None:
        """Wake the requests waiting for a replica: something changed."""
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


def no_replica(record: ServiceRecord, waited_s: float, failed: int) -> str:
    """Why a request found no ready replica: replicas failing while it waited (`failed`), or
    none ready in `waited_s`; with the last replica's failure, where there is one, unless the
    service is `public` (its callers are anyone's: they learn nothing of its workloads)."""
    key = f"service {record.spec.team}/{record.spec.name} has no ready replica"
    why = without_log_path(record.message) if not record.spec.public else ""
    last = f" (last: {why})" if why else ""
    if failed >= GIVE_UP_AFTER_FAILED:
        return f"{key}: its replicas keep failing{last}; see `gpufed service show`"
    return f"{key} (waited {waited_s:g} s){last}"


def spec_index(spec: WorkloadSpec) -> int:
    """The replica index a replica workload's name ends with (`<service>-r<index>`)."""
    return int(spec.name.rsplit("-r", 1)[1])


def endpoint_of(w: WorkloadRecord | None) -> str | None:
    """The URL a running replica is reached at, as its spoke reported it."""
    return w.endpoint if w is not None else None


def runs_of(w: WorkloadRecord, reports: Mapping[str, CapacityReport]) -> list[ReplicaRun]:
    """The runs of one replica workload, priced at its spokes' price per GPU-hour."""
    runs = []
    for attempt in w.attempts:
        if attempt.started_at is None:
            continue
        report = reports.get(attempt.spoke_id)
        price = report.price_per_gpu_hour if report is not None else 0.0
        runs.append(ReplicaRun(w.spec.total_gpus, attempt.started_at, attempt.ended_at, price))
    return runs


def regions_with_room(
    spec: ServiceSpec,
    reports: Mapping[str, CapacityReport],
    spokes: Mapping[str, SpokeRecord],
) -> frozenset[str]:
    """The regions whose spokes reported room for one replica in their last report."""
    replica = spec.replica
    models = set(replica.gpu_models)
    room: set[str] = set()
    for spoke_id, report in reports.items():
        spoke = spokes.get(spoke_id)
        if spoke is None or spoke.region in room:
            continue
        for node in report.nodes:
            if not node.schedulable or (models and node.gpu_model not in models):
                continue
            whole = len(node.free_devices)
            if replica.gpu_fraction is None:
                fits = whole >= replica.gpus
            else:
                shares = node.device_free_fraction.values()
                fits = whole > 0 or any(f >= replica.gpu_fraction for f in shares)
            if fits:
                room.add(spoke.region)
                break
    return frozenset(room)
