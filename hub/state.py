"""What the hub holds in memory between messages, shared by its handlers and its cycle.

The store is the source of truth; this is its non-terminal part plus what only lives in memory
(capacity reports, counters). Every change to it happens under `lock`, and is written through
with `db` before anything is published.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from bus.loglines import LineThrottle
from bus.urls import mask_url
from hub.authstore import AuditEntry
from hub.cloudwait import Verdicts
from hub.core import gpumodels
from hub.core.idle import Activity
from hub.core.model import RunningWorkload, Unplaced
from hub.core.policy import Policy
from hub.core.windows import active_window, apply_window
from hub.dbworker import DbWorker
from hub.errors import StoreUnavailable
from hub.metrics import HubMetrics
from hub.ports import Store
from hub.records import Cordon, DecisionRecord, Records, SpokeRecord, WorkloadRecord
from hub.settings import HubSettings
from hub.usage import InstanceBill
from schemas import CapacityReport, WorkloadSpec
from schemas.burst import BurstBudget, InstanceEvent

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(eq=False)
class HubState:
    """The hub's in-memory view; one per hub process."""

    settings: HubSettings
    store: Store
    clock: Callable[[], float]
    policy: Policy
    workloads: Records = field(default_factory=Records)  # non-terminal only
    reports: dict[str, CapacityReport] = field(default_factory=dict)
    # Every GPU model a spoke has reported: case-folded name -> its spelling (core.gpumodels).
    gpu_models: dict[str, str] = field(default_factory=dict)
    spokes: dict[str, SpokeRecord] = field(default_factory=dict)
    instances: dict[str, InstanceEvent] = field(default_factory=dict)  # latest per instance
    cordons: dict[str, Cordon] = field(default_factory=dict)  # spokes out of placement
    bills: dict[str, InstanceBill] = field(default_factory=dict)  # what each instance costs
    # Each burst controller's latest word on why it rents nothing for waiting work, by provider.
    verdicts: Verdicts = field(default_factory=Verdicts)
    # The last cycle's queue order: what its plan left pending, in the order it looked at them.
    queue: Sequence[Unplaced] = ()
    metrics: HubMetrics = field(default_factory=HubMetrics)
    counters: Counter[str] = field(default_factory=Counter)
    # Told (previous, new) for every burst instance event (the spend meter audits launches).
    instance_listeners: list[Callable[[InstanceEvent | None, InstanceEvent], Awaitable[None]]] = (
        field(default_factory=list)
    )
    burst_budget: BurstBudget | None = None  # the policy's burst limits, sent with the demand
    # Told (spec, workload id or None, result) of every submission over NATS whose audit
    # entry `submit_audit` did not already save with the workload (refusals; all without it).
    submit_listeners: list[Callable[[WorkloadSpec, str | None, str], Awaitable[None]]] = field(
        default_factory=list
    )
    # The audit entry of an accepted submission over NATS (spec, workload id, "ok"), saved in
    # the workload's own transaction: no write of its own, and answered once both are stored.
    submit_audit: Callable[[WorkloadSpec, str | None, str], AuditEntry] | None = None
    # Workloads seen ending whose spoke's last report may still list them (see fleet).
    ended: dict[str, tuple[RunningWorkload, int]] = field(default_factory=dict)
    # Running workloads' activity (hub.idle): workload id -> (epoch it was read under, activity).
    activity: dict[str, tuple[int, Activity]] = field(default_factory=dict)
    # Pending workloads whose preemption victims have stopped: they go first next cycle.
    claims: set[str] = field(default_factory=set)
    # Records moved by spokes' events and not yet saved: while the cycle loop runs, those the
    # next cycle saves in its own transaction; else (or once a save failed, while the events
    # come back as stale) those the next batch of events saves. No event is acked before its
    # records are saved (hub.handlers.on_events).
    unsaved: dict[str, WorkloadRecord] = field(default_factory=dict)
    # Batches of events waiting for the cycle that saves `unsaved`: done once it committed, or
    # failed with why it did not (their events are then not acked and come back).
    unsaved_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    # The leadership term this hub leads under (hub.leadership); 0 while it stands by.
    term: int = 0
    # True while the cycle loop runs: a lone submission waits for the next cycle, which saves
    # every one that waits in one transaction before it plans (hub.submissions, hub.intake).
    paced: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _db_worker: DbWorker = field(default_factory=DbWorker)
    _save_all: _SaveAll | None = None
    _down_lines: LineThrottle = field(default_factory=LineThrottle)  # `store_unavailable`
    # Since when every store call has failed for the store's own sake (None: the last answered).
    store_down_since: float | None = None
    # The policy in force for the last (policy, window) asked for: windows switch a few times
    # a day, cycles run many times a second.
    _in_force: tuple[Policy, str | None, Policy] | None = None
    _positions: tuple[Sequence[Unplaced], dict[str, int]] | None = None  # from which queue

    @property
    def positions(self) -> dict[str, int]:
        """Queued workloads' places in the last cycle's queue order (1 goes first): worked out
        when asked, not by every cycle (10,000 queued is 10,000 entries)."""
        queue = self.queue
        if self._positions is None or self._positions[0] is not queue:
            self._positions = (queue, {u.workload_id: i for i, u in enumerate(queue, 1)})
        return self._positions[1]

    def policy_at(self, now: float) -> Policy:
        """The policy in force at `now`: `policy` with its active time window applied."""
        policy = self.policy
        if not policy.windows:
            return policy
        window = active_window(policy, now)
        name = window.name if window is not None else None
        cached = self._in_force
        if cached is None or cached[0] is not policy or cached[1] != name:
            cached = self._in_force = (policy, name, apply_window(policy, window))
        return cached[2]

    def put_policy(self, policy: Policy) -> None:
        """Put `policy` in force, its quotas keyed by their models in the fleet's spelling (a
        team's `h100` quota is an `H100` one); again whenever a spoke reports a new model."""
        self.policy = gpumodels.respelt_policy(policy, self.gpu_models)

    def trigger(self) -> None:
        """Ask for a scheduling cycle soon (debounced by the cycle loop)."""
        self.wakeup.set()

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking store call off the event loop, one at a time (`save` for saves)."""
        # One thread: SQLite wants a single writer, and the event loop stays free.
        context = contextvars.copy_context()
        return await self._call(functools.partial(context.run, fn, *args, **kwargs))

    async def save(
        self,
        workloads: Iterable[WorkloadRecord] = (),
        decisions: Iterable[DecisionRecord] = (),
        audits: Iterable[AuditEntry] = (),
    ) -> None:
        """`store.save` on the store thread, after every store call made before it.

        Saves waiting together are committed in one transaction (see `hub.dbworker`); each
        caller returns once its own rows are committed.
        """
        merge = self._save_all
        if merge is None or merge.store is not self.store:
            merge = self._save_all = _SaveAll(self.store)
        part = (list(workloads), list(decisions), list(audits))
        save = functools.partial(contextvars.copy_context().run, self.store.save, *part)
        await self._call(save, merge, part)

    async def _call(
        self, fn: Callable[[], T], merge: Callable[[list[Any]], Any] | None = None, part: Any = None
    ) -> T:
        """`fn` on the store's thread. A failure of the store's own (`Store.down`: its disk, its
        server) is raised as StoreUnavailable, which callers are told as such (REST 503, a NATS
        reply `store_unavailable`), not as the hub failing; the log says it at most every
        second, with how many failed since."""
        try:
            result = await self._db_worker.call(fn, merge, part)
        except Exception as exc:
            if not self.store.down(exc):
                raise
            self.metrics.store_unavailable.inc()
            if self.store_down_since is None:
                self.store_down_since = self.clock()
            held = self._down_lines.allow(self.clock(), 1)
            if held is not None:
                why = mask_url(str(getattr(exc, "orig", None) or exc).splitlines()[0])
                log.warning("store_unavailable", error=why, failed_since=held + 1)
            raise StoreUnavailable(
                "the hub's store is not answering; try again in a moment"
            ) from exc
        self.store_down_since = None
        return result

    async def save_unsaved(self) -> None:
        """Save `unsaved` on its own (under the lock); when that fails they stay unsaved."""
        await self.save(self.unsaved.values())
        self.unsaved_saved()

    def unsaved_saved(self) -> None:
        """`unsaved` is in the store now: the ended among them leave memory."""
        for record in self.unsaved.values():
            if record.phase.terminal:
                self.forget(record.id)
        self.unsaved.clear()

    def claim(self, workload_id: str) -> None:
        """Stopping work preempted for `workload_id` has ended: it goes first next cycle."""
        self.claims.add(workload_id)
        self.workloads.moved.add(workload_id)  # its view says so (hub.cycle)

    def forget(self, workload_id: str) -> None:
        """Drop a workload that reached a terminal phase from the in-memory view."""
        self.workloads.pop(workload_id, None)
        self.claims.discard(workload_id)
        self.activity.pop(workload_id, None)


_SavePart = tuple[list[WorkloadRecord], list[DecisionRecord], list[AuditEntry]]


@dataclass(eq=False)
class _SaveAll:
    """Saves waiting together, as one `store.save` (group commit)."""

    store: Store

    def __call__(self, parts: list[_SavePart]) -> None:
        self.store.save(
            [w for workloads, _, _ in parts for w in workloads],
            [d for _, decisions, _ in parts for d in decisions],
            [e for _, _, audits in parts for e in audits],
        )
