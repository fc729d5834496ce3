"""The hub: wires its parts together and is what the API and `gpufed` talk to.

Every handler loads from memory, decides with the pure core, writes the result to the store in
one short transaction, and only then publishes. The in-memory view of non-terminal workloads is
rebuilt from the store at start, so the store stays the source of truth. The parts:
`handlers` (NATS), `cycle` (scheduling), `publishing` (commands, demand), `reconcile` (sync,
lost spokes), `leases` (who may get work), `transitions` (the lifecycle applied to records).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import structlog
import yaml

from bus.client import Bus
from bus.tasks import supervise, unless_stopped
from hub import cordons, publishing, transitions
from hub import reconcile as reconciliation
from hub.authstore import AuditEntry
from hub.checkpoints import checkpoints
from hub.core import gpumodels
from hub.core.model import Plan, RunningWorkload, Snapshot
from hub.core.policy import Policy
from hub.core.windows import next_change
from hub.cycle import Cycle, release_waiters
from hub.errors import Conflict, HubError, InvalidPolicy, NotFound, NotLeader, StoreUnavailable
from hub.handlers import Handlers
from hub.idle import IdleReaper
from hub.intake import validation_error as validation_error
from hub.keyed import KeyedSubmits
from hub.leadership import HOLDER_KEY, LEADER_URL_KEY, TERM_KEY, Leadership
from hub.leases import Leases
from hub.policyfile import PolicyError, policy_from_dict, policy_to_dict, restored_policy
from hub.ports import Store
from hub.publishing import Publisher
from hub.queries import HubView
from hub.records import Cordon, DecisionRecord, Records, WorkloadRecord
from hub.retention import not_found, sweep_ended
from hub.services import ServiceController
from hub.settings import HubSettings
from hub.state import HubState
from hub.submissions import Submissions
from schemas import (
    SyncReply,
    SyncRequest,
    WorkloadSpec,
    burst,
    subjects,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")

#: Store key of the policy in force.
POLICY_KEY = "policy"
#: Weight of the latest cycle in the smoothed cost that paces the cycles.
CYCLE_COST_WEIGHT = 0.3
#: While the cycle loop waits for the next cycle, the hub reads nothing from NATS until this
#: long before it starts (`Bus.hold_reads`): time to handle what arrived meanwhile (the event
#: loop's timers have millisecond steps; at 1 ms some submissions missed their cycle).
READ_AHEAD_S = 0.003
#: Least time between two fetches of events while they keep coming (`Bus.consume_batches`):
#: at 400 workloads a second a fetch, a transaction and a cycle trigger served one or two
#: events each. About one cycle interval: an end waits at most this much longer to free its
#: devices, and a batch's transaction serves about a cycle's worth of events.
EVENTS_LINGER_S = 0.025


class HubService(HubView):
    """One hub: owns the scheduling cycle and the hub side of every subject."""

    def __init__(
        self,
        settings: HubSettings,
        store: Store,
        bus: Bus,
        policy: Policy | None = None,
        clock: Callable[[], float] = time.time,
        policy_file_text: str | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.bus = bus
        self.policy_file_text = policy_file_text
        self.clock = clock
        self.state = HubState(settings, store, clock, policy or Policy())
        self.leases = Leases(settings.suspect_after_s, settings.lost_after_s)
        self.publisher = Publisher(self.state, bus)
        self.cycle = Cycle(self.state, self.leases, self.publisher)
        self.reaper = IdleReaper(self.state, self.publisher)
        self.keyed = KeyedSubmits(
            lambda spec, user, wid, audit: self.submit(spec, user, audit, workload_id=wid),
            self.find_by_ids,
            lambda: self.state.gpu_models,
        )
        self.handlers = Handlers(
            self.state,
            self.leases,
            self.submit,
            self.reconcile,
            submit_many=self.submit_many,
            bus=bus,
            accept_for_cycle=self.accept_for_cycle,
            keyed=self.keyed.submit,
            keyed_batch=self.keyed.submit_batch,
        )
        self.ready = asyncio.Event()
        self._window: str | None = None  # the policy window last seen in force (for the log)
        self.submissions = Submissions(self.state)
        self.services = ServiceController(
            self.state, self.submit, self.cancel, self._refuse_on_standby
        )
        self.state.metrics.bind(self)
        self.leadership = Leadership(settings.resolved_store_url(), poll_s=settings.leader_poll_s)
        # A replica sharing a PostgreSQL store stands by until it holds the leadership; a hub on
        # SQLite is alone and takes writes from its first moment (as before standbys existed).
        self.standby = self.leadership.shared
        self.leader_url = "" if self.standby else settings.resolved_advertise_url()

    # --- lifecycle ---

    async def run(self, stop: asyncio.Event) -> None:
        """Stand by until this replica leads (see hub.leadership), then serve until `stop`.

        Raises NotLeader when the leadership is lost: the process exits and comes back as a
        standby.
        """
        if not await unless_stopped(self.bus.connect(), stop):
            self.leadership.close()  # told to stop before NATS answered once
            log.info("hub_stopped", connected=False)
            return
        reads = asyncio.create_task(self._serve_reads_while_standing_by(stop))
        term = await self.leadership.acquire(stop, self._next_term)
        reads.cancel()
        await asyncio.gather(reads, return_exceptions=True)
        if stop.is_set():
            self.leadership.close()
            await self.bus.close()
            return
        self.state.term, self.standby = term, False
        await self.bus.ensure_streams(self.settings.event_domains)
        await self._load()
        await self.services.load()
        nc, h = self.bus.nc, self.handlers
        subs = [
            await nc.subscribe(subjects.SUBMIT, queue="hub", cb=h.on_submit),
            await nc.subscribe(subjects.SUBMIT_BATCH, queue="hub", cb=h.on_submit_batch),
            await nc.subscribe(subjects.CAPACITY_SUBJECTS, cb=h.on_capacity),
            await nc.subscribe(subjects.SYNC_SUBJECTS, cb=h.on_sync),
            await nc.subscribe(burst.BURST_STATE, cb=h.on_burst_state),
            await nc.subscribe(burst.BURST_VERDICTS, cb=h.on_burst_verdicts),
        ]
        events = self.bus.consume_batches(
            subjects.EVENTS_STREAM,
            subjects.HUB_EVENTS_CONSUMER,
            subjects.EVENTS_SUBJECTS,
            h.on_events,
            stop,
            ack_wait_s=5.0,  # a crashed hub's unacked events come back quickly
            linger_s=EVENTS_LINGER_S,
        )
        instances = self.bus.consume(
            burst.BURST_STREAM, burst.HUB_BURST_CONSUMER, burst.BURST_INSTANCES, h.on_instance, stop
        )
        tasks = [
            supervise(self._cycle_loop(stop), "hub-cycle"),
            supervise(events, "hub-events"),
            supervise(instances, "hub-burst"),
            supervise(self.leadership.watch(stop), "hub-leadership"),
            supervise(self.services.run(stop), "hub-services"),
            supervise(sweep_ended(self.state, stop), "hub-retention"),
            supervise(checkpoints(self.state, stop), "hub-checkpoints"),
        ]
        await self.publisher.republish_unpublished()
        await self.publisher.resend_places()
        self.ready.set()
        log.info("hub_ready", workloads=len(self.workloads), spokes=len(self.spokes), term=term)
        try:
            lost = asyncio.create_task(self.leadership.lost.wait())
            await asyncio.wait(
                [lost, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            if self.leadership.lost.is_set():
                raise NotLeader(f"this hub lost the leadership of term {term}")
        finally:
            self.leadership.close()
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            for task in tasks:
                task.cancel()
            self.handlers.spoke_records.close()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.publisher.flush_marks()
            await self.bus.close()
            log.info("hub_stopped")

    async def _next_term(self) -> int:
        """Store and return the next leadership term (only ever called by the lock holder)."""
        stored = await self.db(self.store.get_setting, TERM_KEY)
        term = int(stored or 0) + 1
        await self.db(self.store.put_setting, TERM_KEY, str(term), self.clock())
        await self.db(self.store.put_setting, HOLDER_KEY, self.leadership.holder, self.clock())
        url = self.settings.resolved_advertise_url()
        await self.db(self.store.put_setting, LEADER_URL_KEY, url, self.clock())
        self.leader_url = url
        return term

    async def _serve_reads_while_standing_by(self, stop: asyncio.Event) -> None:
        # A standby answers reads from the store: refresh what the API shows from memory.
        while not stop.is_set():
            with contextlib.suppress(Exception):
                url = await self.db(self.store.get_setting, LEADER_URL_KEY)
                self.leader_url = url or ""
                await self._load_spokes()
                await cordons.load(self.state)  # `/v1/spokes` shows them here too
            await asyncio.sleep(2.0)

    async def _refuse_on_standby(self) -> None:
        if self.standby:
            url = await self.db(self.store.get_setting, LEADER_URL_KEY)
            holder = await self.db(self.store.get_setting, HOLDER_KEY)
            leader = f"at {url} ({holder})" if url else f"({holder or 'not known yet'})"
            raise NotLeader(
                f"this hub is a standby and takes no writes; send it to the leader {leader}"
            )

    async def _load_spokes(self) -> None:
        """The spokes the store knows, with their last reports."""
        for spoke in await self.db(self.store.spokes):
            self.state.spokes[spoke.id] = spoke
            if spoke.report is not None:
                self.state.reports[spoke.id] = spoke.report

    async def _load(self) -> None:
        state = self.state
        await self._load_spokes()
        await self._load_policy()  # the spokes' last reports spell their models
        state.workloads = Records(await self.db(self.store.active))
        state.instances = {i.burst_id: i for i in await self.db(self.store.instances)}
        state.bills = {b.burst_id: b for b in await self.db(self.store.bills)}
        await cordons.load(state)
        self.trigger()

    async def set_cordon(self, spoke_id: str, cordon: Cordon | None) -> None:
        """Take `spoke_id` out of placement (None: put it back); see `hub.cordons`."""
        await self._refuse_on_standby()
        if spoke_id not in self.spokes:
            raise NotFound(f"no spoke {spoke_id} (gpufed spokes lists them)")
        await cordons.put(self.state, spoke_id, cordon)

    async def drain(self, spoke_id: str, cordon: Cordon) -> cordons.Drained:
        """Cordon `spoke_id` and move the work it runs that may move; see `hub.cordons`."""
        await self._refuse_on_standby()
        if spoke_id not in self.spokes:
            raise NotFound(f"no spoke {spoke_id} (gpufed spokes lists them)")
        drained = await cordons.drain(self.state, spoke_id, cordon)
        await self.publisher.publish(drained.decisions)
        log.info("spoke_drained", spoke=spoke_id, requeued=len(drained.requeued))
        return drained

    # --- policy ---

    async def set_policy(self, data: dict[str, Any], source: str = "api") -> Policy:
        """Validate, persist and put in force a policy; a bad one is refused, the old one stays."""
        if source == "api":
            await self._refuse_on_standby()
        try:
            policy = policy_from_dict(data)
        except PolicyError as exc:
            raise InvalidPolicy(str(exc)) from exc
        document = json.dumps(policy_to_dict(policy), sort_keys=True)
        await self.db(self.store.put_setting, POLICY_KEY, document, self.clock())
        async with self.state.lock:
            self.state.put_policy(policy)
        log.info("policy_changed", source=source, teams=len(policy.teams))
        self.trigger()
        return self.state.policy  # as in force: its quotas' models in the fleet's spelling

    async def _load_policy(self) -> None:
        # A policy file given at start wins and is persisted; else the last one set through
        # the API; else the defaults.
        if self.policy_file_text is not None:
            data = yaml.safe_load(self.policy_file_text) or {}
            if not isinstance(data, dict):
                raise InvalidPolicy("the policy file must hold a mapping")
            await self.set_policy(data, source="file")
            return
        stored = await self.db(self.store.get_setting, POLICY_KEY)
        if stored is not None:
            known: dict[str, str] = {}
            reports = self.state.reports.values()
            gpumodels.learn(known, (node.gpu_model for r in reports for node in r.nodes))
            policy, dropped = restored_policy(json.loads(stored), known)
            for note in dropped:  # stored by an older hub: `gpufed policy set` stores one quota
                log.warning("policy_quota_dropped", note=note)
            self.state.put_policy(policy)
            log.info("policy_restored", teams=len(self.policy.teams))

    # --- submissions and cancellations (NATS and REST share these) ---

    async def submit(
        self,
        spec: WorkloadSpec,
        user: str = "",
        audit: Callable[[WorkloadRecord], AuditEntry] | None = None,
        workload_id: str = "",
    ) -> WorkloadRecord:
        """Accept a workload of `user` (who submitted it, where known) under `workload_id` (or a
        new id); raises InvalidWorkload for what policy refuses and TooMany when its team
        already has its policy's `max_queued` workloads queued. `audit`: the entry that
        records it, saved with it. (`keyed.submit`: under an Idempotency-Key.)"""
        await self._refuse_on_standby()
        queued = self.submissions.queued_counts()
        record = self.submissions.new_record(spec, queued, user, workload_id)
        audits = [audit(record)] if audit is not None else []
        await self.submissions.commit([record], audits, alone=True)
        return record

    async def submit_many(
        self,
        specs: Sequence[WorkloadSpec],
        user: str = "",
        audit: Callable[[WorkloadSpec, str], AuditEntry] | None = None,
        ids: Sequence[str] = (),
    ) -> list[WorkloadRecord | HubError]:
        """Accept what policy allows of `specs` (under `ids` when given), saved in one
        transaction; per spec, in order, the new record or why it was refused. `audit`: the
        entry of each accepted one (from its spec and workload id), saved with it."""
        await self._refuse_on_standby()
        results, records, audits = self.submissions.accept(specs, user, audit, ids)
        await self.submissions.commit(records, audits)
        return results

    def accept_for_cycle(
        self,
        specs: Sequence[WorkloadSpec],
        audit: Callable[[WorkloadSpec, str], AuditEntry] | None = None,
    ) -> tuple[list[WorkloadRecord | HubError], asyncio.Future[None] | None]:
        """`submit_many` for the cycle loop, which plans and saves them next: per spec the new
        record or why it was refused, and what is done once the accepted ones are saved."""
        results, records, audits = self.submissions.accept(specs, "", audit)
        return results, self.submissions.register(records, audits) if records else None

    async def cancel(self, workload_id: str) -> WorkloadRecord:
        """Cancel: a queued workload ends at once; a placed one is stopped by its spoke."""
        await self._refuse_on_standby()
        decisions: list[DecisionRecord] = []
        async with self.state.lock:
            record = self.workloads.get(workload_id)
            if record is None:
                stored = await self.db(self.store.get, workload_id)
                if stored is None:
                    raise NotFound(not_found(workload_id, self.settings.keep_ended_s))
                raise Conflict(f"workload {workload_id} has already ended ({stored.phase.value})")
            now = self.clock()
            live = record.live
            if live is None:
                transitions.cancel_queued(record, now)
                self.state.forget(workload_id)
            elif not record.cancel_requested:
                record.cancel_requested = True
                record.note(now, "cancel_requested")
                decisions.append(
                    publishing.stop(record, "cancel", "cancelled by user", self.state.term, now)
                )
            await self.state.save([record], decisions)
        await self.publisher.publish(decisions)
        log.info("workload_cancel", workload=workload_id, phase=record.phase.value)
        return record

    # --- the scheduling cycle and leases ---

    def trigger(self) -> None:
        """Ask for a cycle soon (debounced)."""
        self.state.trigger()

    async def _cycle_loop(self, stop: asyncio.Event) -> None:
        self.state.paced = True
        try:
            await self._cycles(stop)
        finally:
            self.state.paced = False
            self.handlers.kick_submits()
            self.submissions.release()
            # No cycle will save what batches of events wait on: they are not acked, and come
            # back (to this hub's next cycle loop, or to the hub that takes over).
            waiters, self.state.unsaved_waiters = self.state.unsaved_waiters, []
            release_waiters(waiters, RuntimeError("the cycle loop stopped"))

    async def _cycles(self, stop: asyncio.Event) -> None:
        wakeup = self.state.wakeup
        loop = asyncio.get_running_loop()
        earliest = 0.0
        cost = 0.0  # what a cycle costs the event loop's thread: CPU seconds, smoothed
        while not stop.is_set():
            # asyncio.timeout, not wait_for: no task of its own for every wait.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._until_next_cycle()):
                    await wakeup.wait()
            # Debounced, and no sooner after the last cycle's start than cycle_interval_s or
            # twice what cycles cost: under load a cycle takes all that arrived meanwhile, its
            # fixed cost is shared among them, and planning holds at most half the hub.
            wait = max(self.settings.debounce_s, earliest - loop.time())
            if wait > 0:
                # What comes meanwhile is read in one go just before the cycle, which could not
                # take it sooner: one wake-up a cycle rather than one a message.
                if wait > READ_AHEAD_S:
                    self.bus.hold_reads(loop.time() + wait - READ_AHEAD_S)
                await asyncio.sleep(wait)
            wakeup.clear()
            started, cpu = loop.time(), time.thread_time()
            try:
                # The submissions since the last cycle: planned, then saved with its decisions.
                self.handlers.take_for_cycle()
                taken = self.submissions.take()
                try:
                    await self.check_leases()
                    await self.reaper.reap()
                except BaseException as exc:  # none of them kept: each submitter told why
                    if taken is not None:
                        taken.failed(exc)
                    raise
                await self.cycle.run(taken)
                self.metrics.cycle_duration.observe(loop.time() - started)
            except StoreUnavailable:  # said once a second by `store_unavailable` (hub.state)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("cycle_failed")
                await asyncio.sleep(0.5)
            # The loop thread's CPU time, not the wall clock: waiting for the store thread, a
            # machine that gives the hub no core, a collector's pause are no planning cost, and
            # pacing by them spaced the cycles after one slow cycle by twice its length, when
            # the queue had grown: the tail of submit -> running. Smoothed, so one slow cycle
            # does not set the pace alone, while a queue whose plans stay slow still does.
            cost = cost + CYCLE_COST_WEIGHT * (time.thread_time() - cpu - cost)
            earliest = started + max(self.settings.cycle_interval_s, 2 * cost)

    def _until_next_cycle(self) -> float:
        """Seconds to wait for a trigger: a tick, or less when a policy window starts or ends
        before then, so the hub re-plans (and reclaims) under the new policy right away."""
        now = self.clock()
        window = self.state.policy_at(now).window
        if window != self._window:
            log.info("policy_window", window=window or "none", previous=self._window or "none")
            self._window = window
        change = next_change(self.state.policy, now)
        if change is None:
            return self.settings.tick_s
        return min(self.settings.tick_s, max(0.0, change - now) + 0.001)

    async def check_leases(self) -> list[str]:
        """Declare lost the spokes silent past lost_after; returns their ids.

        Suspended while the hub itself hears nobody (it was cut off or restarting): a hub
        outage must never cost the spokes their running work.
        """
        now = self.clock()
        connected = self.bus.connected.is_set()
        lost = self.leases.expired(self.spokes.values(), now, connected=connected)
        for spoke in lost:
            await reconciliation.declare_lost(self.state, spoke, now)
        return [s.id for s in lost]

    async def run_cycle(self) -> Plan:
        """One scheduling cycle: snapshot → plan → persist → publish."""
        return await self.cycle.run()

    def snapshot(self, now: float, running: list[RunningWorkload] | None = None) -> Snapshot:
        """The fleet as placement sees it, assumed allocations taken off."""
        return self.cycle.snapshot(now, running)

    def spoke_accepts_work(self, spoke_id: str, now: float) -> bool:
        """Whether new placements may go to `spoke_id` now."""
        return self.leases.accepts_work(self.spokes.get(spoke_id), now)

    async def reconcile(self, request: SyncRequest) -> SyncReply:
        """Answer a spoke's sync (see `hub.reconcile.reconcile`)."""
        return await reconciliation.reconcile(self.state, request)

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking store call off the event loop, one at a time."""
        return await self.state.db(fn, *args, **kwargs)
