"""The burst controller: the hub's unplaceable demand in, cloud instances out.

Every `tick_s` it plans with the pure `plan_burst` on the latest DemandReport and its fleet, and
applies the plan through a Provisioner. Every lifecycle change of an instance is published
durably on `gpufed.v1.burst.instances` *before* the provider is asked to act, so the hub's
record (its reply on `gpufed.v1.burst.state`) is what a restarted controller starts from; the
provider is then asked what really exists (describe), and instances nobody recorded are swept
after a grace.

What the controller learns from the spokes' capacity reports (spoke id == burst id): the first
report of an instance's spoke means it joined (`running`); an empty `running` list means idle
since the first such report; a spoke silent for `spoke_silent_s` counts as idle since it was
last heard. A report cannot say whether work may be interrupted, so cloud work counts as
preemptible unless the hub's demand listed that workload with `spot_ok=False`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace

import nats.errors
import structlog
from nats.aio.msg import Msg
from pydantic import ValidationError

from burst.catalog import Catalog
from burst.core.budget import with_hub_budget
from burst.core.model import BurstPlan, BurstPolicy, CloudInstance, Launch, PlannerState, Terminate
from burst.core.planner import plan_burst
from burst.core.state import accrue_spend, commit_plan, record_capacity_error
from burst.credentials import InstanceCredentials
from burst.errors import BurstError, InsufficientCapacityError
from burst.fleet import InstanceRecord, cloud_fleet, still_listed
from burst.ports import CredentialIssuer, InstanceInfo, LaunchRequest, Provisioner
from burst.settings import BurstSettings
from burst.verdicts import SkipReports
from bus.client import Bus
from bus.tasks import pause, supervise, unless_stopped
from schemas import subjects
from schemas.burst import (
    BURST_DEMAND,
    BURST_INSTANCES,
    BURST_STATE,
    BURST_STREAM,
    BurstStateReply,
    BurstStateRequest,
    DemandReport,
    InstanceEvent,
    InstanceState,
)
from schemas.capacity import CapacityReport

log = structlog.get_logger(__name__)

#: How long the loop may finish a round after `stop` before it is cancelled.
STOP_GRACE_S = 10.0
_REASON_MAX = 256


class BurstController:
    """Runs the burst loop for one provider; `run(stop)` until `stop` is set."""

    def __init__(
        self,
        settings: BurstSettings,
        bus: Bus,
        provider: Provisioner,
        catalog: Catalog,
        policy: BurstPolicy,
        clock: Callable[[], float] = time.time,
        issuer: CredentialIssuer | None = None,
    ) -> None:
        self.settings = settings
        self.credentials = InstanceCredentials(issuer, provider, settings.instance_credential_ttl_s)
        self.bus = bus
        self.provider = provider
        self.catalog = catalog
        self.policy = policy
        self.clock = clock
        self.fleet: dict[str, InstanceRecord] = {}
        self.planner_state = PlannerState()
        self.demand: DemandReport | None = None
        self.ready = asyncio.Event()  # set once the hub's state is loaded and reconciled
        self.rounds = 0
        self._non_preemptible: set[str] = set()  # workloads the demand said must not be cut
        self._wake = asyncio.Event()
        self._accrued_at = 0.0
        self._next_reconcile = 0.0
        self.skips = SkipReports(bus, provider.name)

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, load the hub's record of the fleet, reconcile it, then plan every tick.

        Returns at once when `stop` is set while NATS is still unreachable."""
        if not await unless_stopped(self.bus.connect(), stop):
            log.info("burst_stopped", connected=False)
            return
        subs = []
        try:
            await self.bus.wait_for_stream(BURST_STREAM, stop)
            if stop.is_set():
                return
            nc = self.bus.nc
            subs.append(await nc.subscribe(subjects.CAPACITY_SUBJECTS, cb=self._on_capacity))
            subs.append(await nc.subscribe(BURST_DEMAND, cb=self._on_demand))  # kept, not acted on
            if not await self._load_state(stop):
                return
            now = self.clock()
            self._accrued_at = now
            await self._reconcile(now)
            self._next_reconcile = now + self.settings.reconcile_s
            self.ready.set()
            log.info(
                "burst_ready",
                provider=self.provider.name,
                instances=sum(1 for r in self.fleet.values() if r.state.active),
            )
            loop = supervise(self._loop(stop), "burst-loop")
            await stop.wait()
            self._wake.set()
            try:
                await asyncio.wait_for(loop, STOP_GRACE_S)
            except TimeoutError:
                log.warning("burst_round_cancelled_at_stop")
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            await self.bus.close()
            log.info("burst_stopped")

    async def step(self) -> BurstPlan:
        """One round: note joins, accrue spend, plan, launch and terminate; returns the plan."""
        now = self.clock()
        self.planner_state = accrue_spend(
            self.planner_state, self._cloud_fleet(now), now - self._accrued_at
        )
        self._accrued_at = now
        await self._publish_joins(now)
        await self.credentials.revoke_pending(now)
        await self.credentials.renew_due({k: r.state for k, r in self.fleet.items()}, now)
        demand = self.demand or DemandReport(sent_at=now, seq=0)
        # The hub's policy budgets (and the spend its store accrued) tighten our own limits.
        policy = with_hub_budget(self.policy, demand.budget, self.planner_state.team_spend)
        plan = plan_burst(
            demand,
            self._cloud_fleet(now),
            self.catalog,
            policy,
            self.planner_state,
            now,
            self.settings.id_prefix,
        )
        await self.skips.report(plan, now)
        launched = [launch for launch in plan.launches if await self._launch(launch, now)]
        terminated = [t for t in plan.terminations if await self._terminate(t, now)]
        done = replace(plan, launches=tuple(launched), terminations=tuple(terminated))
        self.planner_state = commit_plan(self.planner_state, done, now)
        if now >= self._next_reconcile:
            self._next_reconcile = now + self.settings.reconcile_s
            await self._reconcile(now)
            await self._sweep(now)
        self.rounds += 1
        return plan

    # --- loop and inputs ---

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()  # before the round: what arrives during it wakes the next one
            try:
                await self.step()
            except Exception:  # a bad round is logged; the next one starts from fresh inputs
                log.exception("burst_round_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.tick_s)

    async def _load_state(self, stop: asyncio.Event) -> bool:
        """Ask the hub for its record of our instances until it answers (False: stopped)."""
        request = BurstStateRequest(provider=self.provider.name).model_dump_json().encode()
        delay = 0.2
        while not stop.is_set():
            try:
                msg = await self.bus.nc.request(
                    BURST_STATE, request, timeout=self.settings.state_timeout_s
                )
                reply = BurstStateReply.model_validate_json(msg.data)
            except (TimeoutError, nats.errors.Error, ValidationError) as exc:
                log.info("burst_state_waiting", error=type(exc).__name__)
                await pause(stop, delay)
                delay = min(delay * 2, 2.0)
                continue
            self._adopt(reply)
            return True
        return False

    def _adopt(self, reply: BurstStateReply) -> None:
        """Rebuild the fleet and the planner's memory from the hub's latest events."""
        now = self.clock()
        launched: dict[str, float] = {}
        released: dict[str, float] = {}
        for event in reply.instances:
            if event.provider != self.provider.name:
                continue
            # The launch time is refined by describe() in the reconcile that follows.
            self.fleet[event.burst_id] = InstanceRecord(
                event, launched_at=event.at, watched_since=now
            )
            if event.state.active:
                launched[event.team] = max(launched.get(event.team, 0.0), event.at)
            elif event.state is InstanceState.TERMINATED:
                released[event.team] = max(released.get(event.team, 0.0), event.at)
        self.planner_state = replace(
            self.planner_state, last_launch_at=launched, last_terminate_at=released
        )
        log.info(
            "burst_state_loaded",
            instances=len(self.fleet),
            active=sum(1 for r in self.fleet.values() if r.state.active),
        )

    async def _on_demand(self, msg: Msg) -> None:
        try:
            report = DemandReport.model_validate_json(msg.data)
        except ValidationError as exc:
            log.warning("burst_demand_malformed", error=str(exc)[:200])
            return
        if self.demand is not None and report.term < self.demand.term:
            log.warning("burst_demand_old_term", term=report.term, seen=self.demand.term)
            return  # a deposed hub: only the leader of the newest term decides demand
        self.demand = report
        listed = {w for item in report.items if not item.spot_ok for w in item.workload_ids}
        self._non_preemptible |= listed
        if report.items:
            self._wake.set()

    async def _on_capacity(self, msg: Msg) -> None:
        spoke_id = subjects.spoke_from_subject(msg.subject)
        record = self.fleet.get(spoke_id or "")
        if record is None or not record.state.active:
            return
        try:
            report = CapacityReport.model_validate_json(msg.data)
        except ValidationError:
            return
        if record.observe(report, self.clock()):
            self._wake.set()  # its spoke joined: mark it running now

    # --- what the planner sees ---

    def _cloud_fleet(self, now: float) -> list[CloudInstance]:
        fleet = cloud_fleet(self.fleet, now, self.settings.spoke_silent_s, self._non_preemptible)
        self._non_preemptible = still_listed(self._non_preemptible, self.demand, self.fleet)
        return fleet

    # --- applying a plan ---

    async def _publish_joins(self, now: float) -> None:
        for record in list(self.fleet.values()):
            if record.state is InstanceState.REQUESTED and record.joined_at is not None:
                boot_s = round(record.joined_at - record.launched_at, 2)
                await self._set_state(record, InstanceState.RUNNING, "spoke joined", now)
                log.info("burst_instance_joined", burst_id=record.event.burst_id, boot_s=boot_s)

    async def _launch(self, launch: Launch, now: float) -> bool:
        """Record `requested`, then ask the provider; True when the provider accepted it."""
        burst_id = launch.request_id
        known = self.fleet.get(burst_id)
        if known is not None:
            # Live: this report planned again (work the hub did not list by id). Ended: a hub
            # restart started its seq over; the next report gives new ids.
            if not known.state.active:
                log.warning("burst_id_reused", burst_id=burst_id, state=known.state.value)
            return False
        event = InstanceEvent(
            burst_id=burst_id,
            provider=self.provider.name,
            instance_type=launch.instance_type,
            region=launch.region,
            market=launch.market,
            gpu_model=launch.gpu_model,
            gpu_count=launch.gpu_count,
            price_per_hour=launch.price_per_hour,
            team=launch.team,
            state=InstanceState.REQUESTED,
            spoke_id=burst_id,
            reason="launch requested",
            at=now,
            workload_ids=launch.workload_ids,
        )
        record = InstanceRecord(event, launched_at=now, watched_since=now)
        self.fleet[burst_id] = record
        await self._publish(event, f"{burst_id}-{event.state.value}")
        # The credential is this instance's alone; it is never logged or published.
        request = LaunchRequest.from_launch(launch, self.credentials.mint(burst_id, now))
        try:
            info = await self.provider.launch(request)
        except Exception as exc:
            await self._launch_failed(record, launch, exc, now)
            return False
        if not info.state.active:
            reason = f"provider reports the instance {info.state.value}"
            await self._set_state(record, InstanceState.FAILED, reason, self.clock())
            return False
        await self._accepted(record, info)
        log.info(
            "burst_instance_requested",
            burst_id=burst_id,
            instance_type=launch.instance_type,
            region=launch.region,
            market=launch.market.value,
            team=launch.team,
            price_per_hour=launch.price_per_hour,
            workloads=len(launch.workload_ids),
        )
        return True

    async def _launch_failed(
        self, record: InstanceRecord, launch: Launch, exc: Exception, now: float
    ) -> None:
        # Any failure blocks the offer for capacity_backoff_s, so the next round tries the next
        # offer instead of repeating a call that just failed (capacity, quota, bad config).
        self.planner_state = record_capacity_error(
            self.planner_state, launch.offer, now, self.policy.capacity_backoff_s
        )
        if isinstance(exc, BurstError):
            kind = "no_capacity" if isinstance(exc, InsufficientCapacityError) else "provider"
            log.warning(
                "burst_launch_failed",
                burst_id=launch.request_id,
                instance_type=launch.instance_type,
                region=launch.region,
                market=launch.market.value,
                kind=kind,
                retryable=exc.retryable,
                provider_code=exc.provider_code,
                error=exc.message,
            )
            reason = f"{kind}: {exc.message}"
        else:
            log.exception("burst_launch_crashed", burst_id=launch.request_id)
            reason = f"launch failed: {type(exc).__name__}"
        await self._set_state(record, InstanceState.FAILED, reason, self.clock())

    async def _accepted(self, record: InstanceRecord, info: InstanceInfo) -> None:
        """Tell the hub the provider's details (instance id, zone) of a requested instance."""
        if info.launched_at is not None:
            record.launched_at = info.launched_at
        event = record.event.model_copy(
            update={
                "zone": info.zone,
                "provider_instance_id": info.provider_instance_id,
                "reason": "accepted by the provider",
                "at": self.clock(),
            }
        )
        record.event = event
        await self._publish(event, f"{event.burst_id}-accepted")

    async def _terminate(self, termination: Terminate, now: float) -> bool:
        record = self.fleet.get(termination.instance_id)
        if record is None:
            return False
        reason = f"{termination.reason.value}: {termination.message}"
        await self._set_state(record, InstanceState.TERMINATING, reason, now)
        log.info(
            "burst_instance_terminating",
            burst_id=termination.instance_id,
            team=termination.team,
            reason=termination.reason.value,
            detail=termination.message,
        )
        await self._provider_terminate(record, reason)
        return True

    async def _provider_terminate(self, record: InstanceRecord, reason: str) -> None:
        """Ask the provider to terminate; on failure the record stays `terminating` (retried)."""
        burst_id = record.event.burst_id
        try:
            await self.provider.terminate([burst_id])
        except BurstError as exc:
            log.warning("burst_terminate_failed", burst_id=burst_id, error=exc.message)
            return
        await self._set_state(record, InstanceState.TERMINATED, reason, self.clock())
        log.info("burst_instance_terminated", burst_id=burst_id)

    # --- reconciling with the provider ---

    async def _reconcile(self, now: float) -> None:
        """Compare live records with what the provider has; fix the records, retry terminates."""
        active = {key: r for key, r in self.fleet.items() if r.state.active}
        if not active:
            return
        try:
            infos = {i.burst_id: i for i in await self.provider.describe(sorted(active))}
        except BurstError as exc:
            log.warning("burst_describe_failed", error=exc.message)
            return
        for burst_id, record in sorted(active.items()):
            info = infos.get(burst_id)
            if info is not None and info.launched_at is not None:
                record.launched_at = info.launched_at
            await self._reconcile_one(record, info, now)

    async def _reconcile_one(
        self, record: InstanceRecord, info: InstanceInfo | None, now: float
    ) -> None:
        burst_id = record.event.burst_id
        was = record.state.value
        if info is None:
            if record.state is InstanceState.REQUESTED:
                if now - record.launched_at < self.settings.launch_grace_s:
                    return  # a launch in flight at a crash, or a cloud that lists it late
                reason = "the provider has no such instance (launch never reached it)"
                await self._set_state(record, InstanceState.FAILED, reason, now)
            else:
                await self._set_state(record, InstanceState.TERMINATED, "gone at the provider", now)
            log.warning("burst_instance_missing", burst_id=burst_id, was=was)
            return
        if not info.state.active:
            reason = (
                "terminated"
                if record.state is InstanceState.TERMINATING
                else f"{info.state.value} at the provider (crashed or reclaimed)"
            )
            log.warning("burst_instance_gone", burst_id=burst_id, was=was)
            await self._set_state(record, InstanceState.TERMINATED, reason, now)
        elif record.state is InstanceState.TERMINATING:
            await self._provider_terminate(record, record.event.reason or "terminating")
        elif info.state is InstanceState.TERMINATING:
            reason = "terminating at the provider (interrupted)"
            await self._set_state(record, InstanceState.TERMINATING, reason, now)

    async def _sweep(self, now: float) -> None:
        known = [key for key, record in self.fleet.items() if record.state.active]
        try:
            swept = await self.provider.sweep_orphans(known, now, self.settings.orphan_grace_s)
        except BurstError as exc:
            log.warning("burst_sweep_failed", error=exc.message)
            return
        for info in swept:
            log.warning("burst_orphan_swept", burst_id=info.burst_id, team=info.team)
        await self.credentials.ended([info.burst_id for info in swept], now)

    # --- publishing ---

    async def _set_state(
        self, record: InstanceRecord, state: InstanceState, reason: str, now: float
    ) -> None:
        if record.state is state:
            return
        event = record.event.model_copy(
            update={"state": state, "reason": reason[:_REASON_MAX], "at": now}
        )
        record.event = event
        await self._publish(event, f"{event.burst_id}-{state.value}")
        if not state.active:  # released, failed or gone: its credential ends with it
            await self.credentials.ended([event.burst_id], now)

    async def _publish(self, event: InstanceEvent, msg_id: str) -> None:
        await self.bus.publish_durable(
            BURST_INSTANCES, event.model_dump_json().encode(), msg_id=msg_id
        )
