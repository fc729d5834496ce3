"""Inference services on the hub: keeps each service's replica workloads in line.

Every `tick_s` the controller, for each service: drops the replicas that ended (folding their
GPU cost into the service), probes the health of the running ones, asks `hub.core.autoscale`
how many replicas the load calls for and `hub.core.rollout` what to start and stop, then
submits new replica workloads (kind `service`, one workload per replica) and cancels the
ones to stop. The gateway (`hub.gateway`) routes requests to ready replicas through
`acquire`/`release`, which count what each replica serves: those counts are the load signal
and the denominator of cost per 1,000 requests.

Services are kept in the hub's store (the `services` setting, one JSON document); the
in-flight traffic and health of replicas live in memory and are rebuilt after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence

import httpx
import structlog

from bus.tasks import pause
from hub.core.autoscale import Load, decide_replicas
from hub.core.rollout import Replica, ReplicaPlan, choose_regions, plan_replicas
from hub.core.servicecost import ReplicaRun, gpu_dollars
from hub.errors import Conflict, HubError, NotFound, Unavailable
from hub.records import WorkloadRecord
from hub.servicerecords import (
    GIVE_UP_AFTER_FAILED,
    Health,
    ReplicaRef,
    ServiceRecord,
    Traffic,
    endpoint_of,
    no_replica,
    regions_with_room,
    runs_of,
    service_key,
    spec_index,
)
from hub.state import HubState
from schemas import Phase, WorkloadSpec
from schemas.services import ServiceSpec

log = structlog.get_logger(__name__)

#: Store key of the services document.
SERVICES_KEY = "services"
#: Who the replica workloads are submitted by (usage by user shows it).
CONTROLLER_USER = "service-controller"
#: Longest a replica being stopped keeps serving the requests it has (then it is cancelled).
DRAIN_S = 30.0

Submit = Callable[[WorkloadSpec, str], Awaitable[WorkloadRecord]]
Cancel = Callable[[str], Awaitable[WorkloadRecord]]


class ServiceController:
    """Keeps replicas of every service in line with its spec and its load (module doc)."""

    def __init__(
        self,
        state: HubState,
        submit: Submit,
        cancel: Cancel,
        guard: Callable[[], Awaitable[None]],
        tick_s: float = 0.25,
    ) -> None:
        self.state = state
        self._guard = guard  # raises NotLeader on a standby: changes go to the leader
        self._submit = submit
        self._cancel = cancel
        self.tick_s = tick_s
        self.services: dict[str, ServiceRecord] = {}
        self.health: dict[str, Health] = {}
        self.traffic: dict[str, Traffic] = {}
        self._dirty = False
        # Health probes and the gateway's proxied requests (closed when `run` ends).
        self._probes: set[asyncio.Task[None]] = set()
        self.http = httpx.AsyncClient(timeout=5.0, trust_env=False, follow_redirects=False)

    # --- what the API asks ---

    async def load(self) -> None:
        """Read the services from the store (at start, as the leader)."""
        stored = await self.state.db(self.state.store.get_setting, SERVICES_KEY)
        records = [ServiceRecord.model_validate(d) for d in json.loads(stored or "[]")]
        self.services = {r.key: r for r in records}

    def get(self, team: str, name: str) -> ServiceRecord:
        record = self.services.get(service_key(team, name))
        if record is None:
            raise NotFound(f"no service {name} of team {team}")
        return record

    def find(self, teams: Sequence[str] | None) -> list[ServiceRecord]:
        """The services of `teams` (None: all), by team and name."""
        return [
            r for k, r in sorted(self.services.items()) if teams is None or r.spec.team in teams
        ]

    async def create(self, spec: ServiceSpec, user: str) -> ServiceRecord:
        """A new service; Conflict if its team already has one of that name."""
        await self._guard()
        key = service_key(spec.team, spec.name)
        if key in self.services:
            raise Conflict(f"team {spec.team} already has a service {spec.name}", field="name")
        now = self.state.clock()
        record = ServiceRecord(spec=spec, created_at=now, updated_at=now, created_by=user)
        record.note(now, "created", f"{spec.min_replicas}..{spec.max_replicas} replicas")
        self.services[key] = record
        await self._save()
        return record

    async def update(self, spec: ServiceSpec, user: str) -> ServiceRecord:
        """A new spec; a changed replica template rolls the replicas over one at a time."""
        await self._guard()
        record = self.get(spec.team, spec.name)
        now = self.state.clock()
        rolling = spec.replica != record.spec.replica or spec.regions != record.spec.regions
        record.spec = spec
        record.updated_at = now
        if rolling:
            record.generation += 1
        record.note(now, "updated", f"by {user}; generation {record.generation}")
        await self._save()
        return record

    async def delete(self, team: str, name: str) -> ServiceRecord:
        """Remove the service and stop all its replicas."""
        await self._guard()
        record = self.get(team, name)
        del self.services[record.key]
        self.traffic.pop(record.key, None)
        await self._save()
        for ref in record.replicas:
            await self._stop(ref.workload_id)
            self.health.pop(ref.workload_id, None)
        return record

    def status(self, record: ServiceRecord) -> dict[str, object]:
        """What `gpufed service show` prints: replicas, ready, rps, cost per 1,000 requests."""
        now = self.state.clock()
        traffic = self.traffic.get(record.key) or Traffic()
        seconds, dollars = gpu_dollars(self._runs(record), now)
        seconds += record.retired_gpu_seconds
        dollars += record.retired_dollars
        replicas = []
        for ref in record.replicas:
            w = self.state.workloads.get(ref.workload_id)
            health = self.health.get(ref.workload_id) or Health()
            replicas.append(
                {
                    "workload_id": ref.workload_id,
                    "generation": ref.generation,
                    "phase": w.phase.value if w else "ended",
                    "spoke_id": w.spoke_id if w else None,
                    "endpoint": endpoint_of(w),
                    "ready": self._ready(ref, w),
                    "stopping": ref.stopping,
                    "requests": health.requests,
                }
            )
        return {
            "generation": record.generation,
            "desired": record.desired,
            "ready": sum(1 for r in replicas if r["ready"]),
            "rps": round(traffic.rps(record.spec.autoscaling.window_s, now), 3),
            "in_flight": traffic.in_flight,
            "waiting": traffic.waiting,
            "requests": record.requests,
            "gpu_seconds": round(seconds, 3),
            "cost_dollars": round(dollars, 6),
            "cost_per_1k_requests": (
                round(dollars / record.requests * 1000, 6) if record.requests else None
            ),
            "replicas": replicas,
        }

    # --- what the gateway asks ---

    async def acquire(self, team: str, name: str, hold_s: float) -> tuple[str, str]:
        """A ready replica for one request, round robin: (workload id, endpoint URL).

        Counts the request; while the service has no ready replica (scaled to zero, starting)
        the request waits up to `hold_s` for one. Raises NotFound, or Unavailable when none
        became ready in time. Pair every successful call with `release`.
        """
        record = self.get(team, name)
        traffic = self.traffic.setdefault(record.key, Traffic())
        now = self.state.clock()
        traffic.arrivals.append(now)
        traffic.last_request_at = now
        deadline = now + hold_s
        traffic.in_flight += 1
        failed_before = traffic.failed_in_row
        try:
            while True:
                picked = self._pick(record, traffic)
                if picked is not None:
                    return picked
                remaining = deadline - self.state.clock()
                failed = traffic.failed_in_row - failed_before
                if (
                    remaining <= 0
                    or failed >= GIVE_UP_AFTER_FAILED
                    or record.key not in self.services
                ):
                    raise Unavailable(no_replica(record, hold_s, failed))
                traffic.waiting += 1
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(traffic.changed.wait(), min(remaining, 1.0))
                finally:
                    traffic.waiting -= 1
        except BaseException:
            traffic.in_flight -= 1
            raise

    def release(
        self, team: str, name: str, workload_id: str, served: bool, broken: bool = False
    ) -> None:
        """The request `acquire` routed to `workload_id` is done: `served` (it answered), or
        `broken` (the replica could not be reached; a caller who went away is neither)."""
        traffic = self.traffic.get(service_key(team, name))
        if traffic is not None:
            traffic.in_flight -= 1
        record = self.services.get(service_key(team, name))
        health = self.health.get(workload_id)
        if health is not None:
            health.active -= 1
        if record is None or health is None:
            return
        if served:
            health.requests += 1
            record.requests += 1
            self._dirty = True
        elif broken:
            health.failures += 1  # out of the rotation at the threshold; the next probe decides

    # --- the loop ---

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile every service every tick_s until `stop` (the leader runs this)."""
        saved_at = 0.0
        try:
            while not stop.is_set():
                try:
                    await self.reconcile()
                    now = self.state.clock()
                    if self._dirty and now - saved_at >= 1.0:
                        await self._save()
                        saved_at = now
                except Exception:
                    log.exception("services_reconcile_failed")
                await pause(stop, self.tick_s)
        finally:
            for task in list(self._probes):
                task.cancel()
            await asyncio.gather(*self._probes, return_exceptions=True)
            await self.http.aclose()
            with contextlib.suppress(Exception):
                await self._save()

    async def reconcile(self) -> None:
        """One pass over every service (see the module doc)."""
        for record in list(self.services.values()):
            await self._reconcile(record)

    async def _reconcile(self, record: ServiceRecord) -> None:
        now = self.state.clock()
        spec = record.spec
        traffic = self.traffic.setdefault(record.key, Traffic())
        await self._drop_ended(record, traffic, now)
        self._probe(record, now)
        load = Load(
            rps=traffic.rps(record.spec.autoscaling.window_s, now),
            in_flight=traffic.in_flight,
            waiting=traffic.waiting,
            last_request_at=traffic.last_request_at,
        )
        decision = decide_replicas(
            spec.autoscaling,
            spec.min_replicas,
            spec.max_replicas,
            load,
            traffic.history,
            now,
            record.created_at,
        )
        traffic.history = decision.history
        if decision.replicas != record.desired:
            record.note(
                now, "scaled", f"{record.desired} -> {decision.replicas} ({decision.reason.value})"
            )
            log.info("service_scaled", service=record.key, replicas=decision.replicas)
            record.desired, self._dirty = decision.replicas, True
        record.reason = decision.reason.value
        plan = plan_replicas(self._replicas(record, now), record.desired, record.generation)
        await self._apply(record, traffic, plan, now)

    async def _drop_ended(self, record: ServiceRecord, traffic: Traffic, now: float) -> None:
        for ref in list(record.replicas):
            if ref.workload_id in self.state.workloads:
                continue
            ended = await self.state.db(self.state.store.get, ref.workload_id)
            record.replicas.remove(ref)
            self.health.pop(ref.workload_id, None)
            self._dirty = True
            if ended is None:
                continue
            seconds, dollars = gpu_dollars(runs_of(ended, self.state.reports), now)
            record.retired_gpu_seconds += seconds
            record.retired_dollars += dollars
            if not ref.stopping:
                traffic.failed_in_row += 1
                traffic.start_after = now + min(30.0, 0.5 * 2**traffic.failed_in_row)
                why = ended.message or ended.reason or ended.phase.value
                record.message = f"replica {ref.workload_id} {ended.phase.value}: {why}"[:500]
                record.note(now, "replica_ended", f"{ref.workload_id} {ended.phase.value}")
            traffic.notify()

    def _replicas(self, record: ServiceRecord, now: float) -> tuple[Replica, ...]:
        out = []
        for ref in record.replicas:
            w = self.state.workloads.get(ref.workload_id)
            if ref.stopping or w is None:  # ended since: dropped at the next tick
                continue
            health = self.health.setdefault(ref.workload_id, Health())
            ready = self._ready(ref, w)
            started = w.started_at
            late = (
                not health.ready
                and started is not None
                and now - started > record.spec.health.startup_s
            )
            failing = health.ready and health.failures >= record.spec.health.failure_threshold
            spoke = self.state.spokes.get(w.spoke_id) if w.spoke_id else None
            out.append(
                Replica(
                    ref.workload_id,
                    ref.generation,
                    started_at=w.submitted_at,
                    ready=ready,
                    unhealthy=late or failing,
                    region=spoke.region if spoke else None,
                )
            )
        return tuple(out)

    async def _apply(
        self, record: ServiceRecord, traffic: Traffic, plan: ReplicaPlan, now: float
    ) -> None:
        for workload_id in plan.stop:
            ref = next(r for r in record.replicas if r.workload_id == workload_id)
            ref.stopping, self._dirty = True, True
            why = "unhealthy, replaced" if workload_id in plan.replaced else "stopped"
            record.note(now, "replica_stopping", f"{workload_id} {why}")
            traffic.notify()
        await self._drain(record, now)
        if not plan.start or now < traffic.start_after:
            return
        if self.services.get(record.key) is not record:
            return  # deleted while this pass ran: start nothing for it
        alive = [r for r in self._replicas(record, now) if not r.unhealthy]
        room = regions_with_room(record.spec, self.state.reports, self.state.spokes)
        regions = choose_regions(
            [r.region for r in alive], record.spec.regions, plan.start, record.spec.spread, room
        )
        for region in regions:
            spec = record.spec.replica_spec(record.next_index, region, pin=region in room)
            try:
                workload = await self._submit(spec, CONTROLLER_USER)
            except HubError as exc:
                if record.message != exc.message:
                    record.note(now, "replica_refused", exc.message)
                record.message, self._dirty = exc.message, True
                traffic.start_after = now + 2.0
                return
            if self.services.get(record.key) is not record:
                await self._stop(workload.id)  # deleted meanwhile: no orphan replica
                return
            record.next_index += 1
            record.replicas.append(
                ReplicaRef(
                    workload_id=workload.id, generation=record.generation, index=spec_index(spec)
                )
            )
            self.health[workload.id] = Health()
            record.note(now, "replica_started", f"{workload.id} generation {record.generation}")
            self._dirty = True

    async def _drain(self, record: ServiceRecord, now: float) -> None:
        """Cancel the replicas to stop once the requests they serve are done (or DRAIN_S)."""
        for ref in record.replicas:
            if not ref.stopping or ref.cancelled:
                continue
            health = self.health.setdefault(ref.workload_id, Health())
            if health.stopping_since is None:
                health.stopping_since = now
            if health.active == 0 or now - health.stopping_since > DRAIN_S:
                ref.cancelled, self._dirty = True, True
                await self._stop(ref.workload_id)

    async def _stop(self, workload_id: str) -> None:
        with contextlib.suppress(NotFound, Conflict):
            await self._cancel(workload_id)

    # --- health ---

    def _probe(self, record: ServiceRecord, now: float) -> None:
        check = record.spec.health
        for ref in record.replicas:
            w = self.state.workloads.get(ref.workload_id)
            url = endpoint_of(w)
            health = self.health.setdefault(ref.workload_id, Health())
            if ref.stopping or url is None or health.probing or now < health.next_probe:
                continue
            health.probing = True
            health.next_probe = now + check.period_s
            task = asyncio.create_task(self._probe_one(record, ref.workload_id, url, health))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    async def _probe_one(
        self, record: ServiceRecord, workload_id: str, url: str, health: Health
    ) -> None:
        check = record.spec.health
        try:
            answer = await self.http.get(url.rstrip("/") + check.path, timeout=check.timeout_s)
            healthy = answer.status_code < 400
        except httpx.HTTPError:
            healthy = False
        finally:
            health.probing = False
        was_ready = health.ready
        if healthy:
            health.failures = 0
            health.ready = True
        elif health.ready:
            health.failures += 1
        if health.ready and not was_ready:
            traffic = self.traffic.setdefault(record.key, Traffic())
            traffic.failed_in_row = 0
            record.message = ""
            record.note(self.state.clock(), "replica_ready", workload_id)
            traffic.notify()

    # --- helpers ---

    def _ready(self, ref: ReplicaRef, w: WorkloadRecord | None) -> bool:
        health = self.health.get(ref.workload_id)
        return (
            not ref.stopping
            and w is not None
            and w.phase == Phase.RUNNING
            and endpoint_of(w) is not None
            and health is not None
            and health.ready
        )

    def _pick(self, record: ServiceRecord, traffic: Traffic) -> tuple[str, str] | None:
        ready = []
        for ref in record.replicas:
            w = self.state.workloads.get(ref.workload_id)
            url = endpoint_of(w)
            health = self.health.get(ref.workload_id)
            threshold = record.spec.health.failure_threshold
            if url and self._ready(ref, w) and health and health.failures < threshold:
                ready.append((ref.workload_id, url))
        if not ready:
            return None
        traffic.turn += 1
        picked = ready[traffic.turn % len(ready)]
        self.health[picked[0]].active += 1
        return picked

    def _runs(self, record: ServiceRecord) -> list[ReplicaRun]:
        return [
            run
            for ref in record.replicas
            if (w := self.state.workloads.get(ref.workload_id)) is not None
            for run in runs_of(w, self.state.reports)
        ]

    async def _save(self) -> None:
        document = json.dumps([r.model_dump(mode="json") for r in self.services.values()])
        self._dirty = False
        await self.state.db(
            self.state.store.put_setting, SERVICES_KEY, document, self.state.clock()
        )
