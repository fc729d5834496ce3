"""The hub's service loop: take submissions and events, run scheduling cycles, publish commands.

Each handler loads from memory, decides with the pure core, writes the result to the store in
one short transaction, and only then publishes. The in-memory view of non-terminal workloads is
rebuilt from the store at start, so the store stays the source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import structlog
import yaml
from nats.aio.msg import Msg
from pydantic import ValidationError

from bus.client import Bus
from hub.core.demand import unplaceable_demand
from hub.core.fleet import build_snapshot
from hub.core.model import Plan, RunningWorkload, Snapshot, Workload
from hub.core.placement import plan as plan_placement
from hub.core.policy import Policy
from hub.errors import Conflict, InvalidPolicy, InvalidWorkload, NotFound
from hub.ids import decision_id, new_workload_id
from hub.policyfile import PolicyError, policy_from_dict, policy_to_dict
from hub.records import DecisionRecord, SpokeRecord, WorkloadRecord
from hub.settings import HubSettings
from hub.store import Store
from schemas import (
    CancelCommand,
    CapacityReport,
    ErrorReply,
    EventPhase,
    Phase,
    PlaceCommand,
    PreemptCommand,
    RestartPolicy,
    RunningRef,
    SubmitReply,
    SyncReply,
    SyncRequest,
    WorkloadEvent,
    WorkloadSpec,
    burst,
    subjects,
)
from schemas.burst import BurstStateReply, DemandReport, InstanceEvent

log = structlog.get_logger(__name__)
T = TypeVar("T")

#: Store key of the policy in force.
POLICY_KEY = "policy"
#: How often a spoke's last_seen is written to the store (heartbeats come every few seconds).
SPOKE_PERSIST_EVERY_S = 10.0


class HubService:
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
        self.policy = policy or Policy()
        self.policy_file_text = policy_file_text
        self.clock = clock
        self.workloads: dict[str, WorkloadRecord] = {}  # non-terminal only
        self.reports: dict[str, CapacityReport] = {}
        self.spokes: dict[str, SpokeRecord] = {}
        self.counters: Counter[str] = Counter()
        self.ready = asyncio.Event()
        self._spoke_persisted: dict[str, float] = {}
        # Workloads seen ending whose spoke's last report may still list them (see fleet).
        self._ended: dict[str, tuple[RunningWorkload, int]] = {}
        # Since when the hub has heard spokes without a gap; None while it hears nobody (cut
        # off or just restarted). Leases only expire after lost_after of hearing again.
        self._hearing_since: float | None = None
        self._last_any_report: float | None = None
        self.instances: dict[str, InstanceEvent] = {}  # latest event per burst instance
        # Pending workloads whose preemption victims have stopped: they go first next cycle.
        self._claims: set[str] = set()
        self.demand = DemandReport(sent_at=0.0, seq=0)
        self._demand_published_at = 0.0
        self._trigger = asyncio.Event()
        self._lock = asyncio.Lock()
        self._db_limiter = anyio.CapacityLimiter(1)

    # --- lifecycle ---

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set."""
        await self.bus.connect()
        await self.bus.ensure_streams()
        await self._load()
        nc = self.bus.nc
        subs = [
            await nc.subscribe(subjects.SUBMIT, queue="hub", cb=self._on_submit_msg),
            await nc.subscribe(subjects.CAPACITY_SUBJECTS, cb=self._on_capacity_msg),
            await nc.subscribe(subjects.SYNC_SUBJECTS, cb=self._on_sync_msg),
            await nc.subscribe(burst.BURST_STATE, cb=self._on_burst_state_msg),
        ]
        tasks = [
            asyncio.create_task(self._cycle_loop(stop), name="hub-cycle"),
            asyncio.create_task(
                self.bus.consume(
                    subjects.EVENTS_STREAM,
                    subjects.HUB_EVENTS_CONSUMER,
                    subjects.EVENTS_SUBJECTS,
                    self._on_event_msg,
                    stop,
                    ack_wait_s=5.0,  # a crashed hub's unacked events come back quickly
                ),
                name="hub-events",
            ),
            asyncio.create_task(
                self.bus.consume(
                    burst.BURST_STREAM,
                    burst.HUB_BURST_CONSUMER,
                    burst.BURST_INSTANCES,
                    self._on_instance_msg,
                    stop,
                ),
                name="hub-burst",
            ),
        ]
        await self._republish_unpublished()
        self.ready.set()
        log.info("hub_ready", workloads=len(self.workloads), spokes=len(self.spokes))
        try:
            await stop.wait()
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.bus.close()
            log.info("hub_stopped")

    async def set_policy(self, data: dict[str, Any], source: str = "api") -> Policy:
        """Validate, persist and put in force a policy; a bad one is refused, the old one stays."""
        try:
            policy = policy_from_dict(data)
        except PolicyError as exc:
            raise InvalidPolicy(str(exc)) from exc
        document = json.dumps(policy_to_dict(policy), sort_keys=True)
        await self.db(self.store.put_setting, POLICY_KEY, document, self.clock())
        async with self._lock:
            self.policy = policy
        log.info("policy_changed", source=source, teams=len(policy.teams))
        self.trigger()
        return policy

    async def _load_policy(self) -> None:
        # A policy file given at start wins and is persisted; else the last one set through
        # the API; else the defaults.
        if self.policy_file_text is not None:
            await self.set_policy(self._parse_file(self.policy_file_text), source="file")
            return
        stored = await self.db(self.store.get_setting, POLICY_KEY)
        if stored is not None:
            self.policy = policy_from_dict(json.loads(stored))
            log.info("policy_restored", teams=len(self.policy.teams))

    @staticmethod
    def _parse_file(text: str) -> dict[str, Any]:
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise InvalidPolicy("the policy file must hold a mapping")
        return data

    async def _load(self) -> None:
        await self._load_policy()
        active = await self.db(self.store.active)
        self.workloads = {w.id: w for w in active}
        self.instances = {i.burst_id: i for i in await self.db(self.store.instances)}
        for spoke in await self.db(self.store.spokes):
            self.spokes[spoke.id] = spoke
            if spoke.report is not None:
                self.reports[spoke.id] = spoke.report
        self.trigger()

    async def _republish_unpublished(self) -> None:
        # A crash between persisting a decision and the bus acking it leaves it unpublished:
        # send it again under the same Nats-Msg-Id, so a copy already stored is dropped.
        decisions = await self.db(self.store.unpublished)
        if decisions:
            log.info("republishing_decisions", count=len(decisions))
            await self._publish(decisions)

    # --- submissions and cancellations (NATS and REST share these) ---

    async def submit(self, spec: WorkloadSpec) -> WorkloadRecord:
        """Accept a workload; raises InvalidWorkload for what policy refuses."""
        if spec.priority_class not in self.policy.priorities:
            known = ", ".join(sorted(self.policy.priorities))
            raise InvalidWorkload(
                f"priority class {spec.priority_class!r} is not defined (known: {known})",
                field="priority_class",
            )
        now = self.clock()
        record = WorkloadRecord(id=new_workload_id(), spec=spec, submitted_at=now)
        record.note(now, "submitted")
        async with self._lock:
            await self.db(self.store.save, [record])
            self.workloads[record.id] = record
        self.counters["submitted"] += 1
        log.info("workload_submitted", workload=record.id, team=spec.team, gpus=spec.total_gpus)
        self.trigger()
        return record

    async def cancel(self, workload_id: str) -> WorkloadRecord:
        """Cancel: a queued workload ends at once; a placed one is stopped by its spoke."""
        decision: DecisionRecord | None = None
        async with self._lock:
            record = self.workloads.get(workload_id)
            if record is None:
                stored = await self.db(self.store.get, workload_id)
                if stored is None:
                    raise NotFound(f"no workload {workload_id}")
                raise Conflict(f"workload {workload_id} already ended {stored.phase.value}")
            now = self.clock()
            if record.phase == Phase.QUEUED:
                record.phase = Phase.CANCELLED
                record.finished_at = now
                record.note(now, "cancelled", "cancelled while queued")
                del self.workloads[workload_id]
                self._claims.discard(workload_id)
            elif not record.cancel_requested:
                record.cancel_requested = True
                record.note(now, "cancel_requested")
                assert record.spoke_id is not None
                command = CancelCommand(
                    decision_id=decision_id(record.id, record.epoch, "cancel"),
                    workload_id=record.id,
                    epoch=record.epoch,
                    reason="cancelled by user",
                )
                decision = self._decision(command, record.spoke_id, now)
            await self.db(self.store.save, [record], [decision] if decision else [])
        if decision is not None:
            await self._publish([decision])
        log.info("workload_cancel", workload=workload_id, phase=record.phase.value)
        return record

    # --- the scheduling cycle ---

    def trigger(self) -> None:
        """Ask for a cycle soon (debounced)."""
        self._trigger.set()

    async def _cycle_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._trigger.wait(), timeout=self.settings.tick_s)
            if self.settings.debounce_s:
                await asyncio.sleep(self.settings.debounce_s)
            self._trigger.clear()
            try:
                await self.check_leases()
                await self.run_cycle()
            except Exception:
                log.exception("cycle_failed")
                await asyncio.sleep(0.5)

    async def check_leases(self) -> list[str]:
        """Declare lost the spokes silent past lost_after; returns their ids.

        Suspended while the hub itself hears nobody (it was cut off or restarting): a hub
        outage must never cost the spokes their running work.
        """
        now = self.clock()
        quiet = (
            self._last_any_report is None
            or now - self._last_any_report > self.settings.suspect_after_s
        )
        if not self.bus.connected.is_set() or quiet:
            self._hearing_since = None
            return []
        if self._hearing_since is None or now - self._hearing_since < self.settings.lost_after_s:
            return []
        lost = [
            s
            for s in self.spokes.values()
            if s.lost_at is None and now - s.last_seen >= self.settings.lost_after_s
        ]
        for spoke in lost:
            await self._declare_lost(spoke, now)
        return [s.id for s in lost]

    async def _declare_lost(self, spoke: SpokeRecord, now: float) -> None:
        async with self._lock:
            spoke.lost_at = now
            changed = []
            for w in list(self.workloads.values()):
                if w.spoke_id != spoke.id or not w.phase.active:
                    continue
                detail = f"spoke {spoke.id} silent for {now - spoke.last_seen:.0f}s"
                before, epoch = _as_running(w), w.epoch
                on_failure = w.spec.restart_policy == RestartPolicy.ON_FAILURE
                self._retry_or_fail(w, now, "spoke_lost", detail, retry=on_failure, new_epoch=True)
                if before is not None:
                    self._ended[w.id] = (before, epoch)
                changed.append(w)
                if w.phase.terminal:
                    del self.workloads[w.id]
            await self.db(self.store.save, changed)
        log.warning("spoke_lost", spoke=spoke.id, workloads=len(changed))
        self.counters["spokes_lost"] += 1
        self.trigger()

    def _retry_or_fail(
        self,
        w: WorkloadRecord,
        now: float,
        event: str,
        detail: str,
        *,
        retry: bool,
        new_epoch: bool = False,
    ) -> None:
        """Requeue (counting a restart) where `retry` allows it and restarts remain, else fail."""
        if retry and w.restarts < w.spec.max_restarts:
            w.restarts += 1
            self._requeue(w, now, event, detail, new_epoch=new_epoch)
        elif retry:
            self._finish(w, Phase.FAILED, now, event, f"{detail} (restarts exhausted)")
        else:
            self._finish(w, Phase.FAILED, now, event, detail)

    async def run_cycle(self) -> Plan:
        """One scheduling cycle: snapshot → plan → persist → publish."""
        async with self._lock:
            now = self.clock()
            pending = [
                Workload(w.id, w.spec, w.submitted_at, claims_freed=w.id in self._claims)
                for w in self.workloads.values()
                if w.phase == Phase.QUEUED
            ]
            if not pending:
                await self._publish_demand(Plan(), {}, now)
                return Plan()
            running = self._running()
            result = plan_placement(self.snapshot(now, running), pending, running, self.policy, now)
            changed, decisions = self._apply(result, now)
            if changed or decisions:
                await self.db(self.store.save, changed, decisions)
            await self._publish_demand(result, {w.id: w for w in pending}, now)
        if result.placements:
            log.info("cycle_placed", placed=len(result.placements), pending=len(result.unplaced))
        await self._publish(decisions)
        return result

    async def _publish_demand(self, result: Plan, pending: dict[str, Workload], now: float) -> None:
        """Tell burst what no spoke can serve: when it changes, and at least every 2 s."""
        report = unplaceable_demand(result.unplaced, pending, self.policy, now, self.demand.seq + 1)
        if report.items == self.demand.items and now - self._demand_published_at < 2.0:
            return
        self.demand = report
        self._demand_published_at = now
        with contextlib.suppress(Exception):  # a lost report is replaced by the next one
            await self.bus.publish(burst.BURST_DEMAND, report.model_dump_json().encode())

    def snapshot(self, now: float, running: Sequence[RunningWorkload] | None = None) -> Snapshot:
        """The fleet as placement sees it, assumed allocations taken off."""
        running = self._running() if running is None else running
        active = [
            (rw, self.workloads[rw.id].epoch, self.workloads[rw.id].command_seq) for rw in running
        ]
        accepting = {sid: self.spoke_accepts_work(sid, now) for sid in self.reports}
        self._forget_reported_ends()
        return build_snapshot(self.reports, active, accepting, self._ended.values())

    def _forget_reported_ends(self) -> None:
        if not self._ended:
            return  # the common case: no report to index on every cycle
        listed = {
            sid: {(r.workload_id, r.epoch) for r in report.running}
            for sid, report in self.reports.items()
        }
        for wid, (rw, epoch) in list(self._ended.items()):
            if (wid, epoch) not in listed.get(rw.spoke_id, ()):
                del self._ended[wid]

    def spoke_accepts_work(self, spoke_id: str, now: float) -> bool:
        spoke = self.spokes.get(spoke_id)
        return spoke is not None and now - spoke.last_seen < self.settings.suspect_after_s

    def _running(self) -> list[RunningWorkload]:
        return [rw for w in self.workloads.values() if (rw := _as_running(w)) is not None]

    def _apply(self, result: Plan, now: float) -> tuple[list[WorkloadRecord], list[DecisionRecord]]:
        changed: list[WorkloadRecord] = []
        decisions: list[DecisionRecord] = []
        for placement in result.placements:
            self._claims.discard(placement.workload_id)
            w = self.workloads[placement.workload_id]
            w.epoch += 1
            w.phase = Phase.PLACED
            w.spoke_id = placement.spoke_id
            w.assignments = placement.assignments
            w.placed_at = now
            w.reason = w.message = ""
            w.note(now, "placed", _describe(placement.assignments))
            command = PlaceCommand(
                decision_id=decision_id(w.id, w.epoch, "place"),
                workload_id=w.id,
                epoch=w.epoch,
                spec=w.spec,
                assignments=placement.assignments,
            )
            decisions.append(self._decision(command, placement.spoke_id, now))
            changed.append(w)
        for preemption in result.preemptions:
            w = self.workloads[preemption.workload_id]
            if w.preempting:
                continue
            w.preempting = True
            w.preempted_for = preemption.for_workload or None
            w.note(now, "preempting", preemption.reason)
            preempt = PreemptCommand(
                decision_id=decision_id(w.id, w.epoch, "preempt"),
                workload_id=w.id,
                epoch=w.epoch,
                reason=preemption.reason,
            )
            decisions.append(self._decision(preempt, preemption.spoke_id, now))
            changed.append(w)
        for unplaced in result.unplaced:
            w = self.workloads[unplaced.workload_id]
            if (w.reason, w.message) != (unplaced.reason.value, unplaced.message):
                w.reason, w.message = unplaced.reason.value, unplaced.message
                changed.append(w)
        return changed, decisions

    def _decision(
        self, command: PlaceCommand | CancelCommand | PreemptCommand, spoke_id: str, now: float
    ) -> DecisionRecord:
        return DecisionRecord(
            decision_id=command.decision_id,
            workload_id=command.workload_id,
            spoke_id=spoke_id,
            subject=subjects.commands(spoke_id),
            payload=command.model_dump_json().encode(),
            created_at=now,
        )

    async def _publish(self, decisions: Sequence[DecisionRecord]) -> None:
        if not decisions:
            return
        acks = await asyncio.gather(
            *(self.bus.publish_durable(d.subject, d.payload, d.decision_id) for d in decisions)
        )
        for decision, ack in zip(decisions, acks, strict=True):
            w = self.workloads.get(decision.workload_id)
            if w is not None and decision.decision_id == decision_id(w.id, w.epoch, "place"):
                w.command_seq = ack.seq
        await self.db(self.store.mark_published, [d.decision_id for d in decisions])
        self.counters["commands_published"] += len(decisions)

    # --- message handlers ---

    async def _on_submit_msg(self, msg: Msg) -> None:
        try:
            spec = WorkloadSpec.model_validate_json(msg.data)
            record = await self.submit(spec)
            reply = SubmitReply(ok=True, workload_id=record.id)
        except ValidationError as exc:
            self.counters["submit_invalid"] += 1
            reply = SubmitReply(ok=False, error=validation_error(exc))
        except InvalidWorkload as exc:
            self.counters["submit_invalid"] += 1
            reply = SubmitReply(
                ok=False, error=ErrorReply(code=exc.code, message=exc.message, field=exc.field)
            )
        except Exception:
            log.exception("submit_failed")
            reply = SubmitReply(
                ok=False, error=ErrorReply(code="internal", message="the hub failed; try again")
            )
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def _on_capacity_msg(self, msg: Msg) -> None:
        try:
            report = CapacityReport.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            return
        if subjects.spoke_from_subject(msg.subject) != report.spoke_id:
            self._malformed(msg, ValueError("spoke_id does not match the subject"))
            return
        previous = self.reports.get(report.spoke_id)
        if (
            previous is not None
            and previous.incarnation == report.incarnation
            and previous.seq > report.seq
        ):
            return  # an older heartbeat overtaken by a newer one
        now = self.clock()
        if (
            self._last_any_report is None
            or now - self._last_any_report > self.settings.suspect_after_s
        ):
            self._hearing_since = now
        self._last_any_report = now
        self.reports[report.spoke_id] = report
        spoke = self.spokes.get(report.spoke_id)
        is_new = spoke is None
        if spoke is None:
            spoke = SpokeRecord(
                id=report.spoke_id,
                region=report.region,
                kind=report.kind.value,
                first_seen=now,
                last_seen=now,
            )
            self.spokes[report.spoke_id] = spoke
            log.info("spoke_joined", spoke=report.spoke_id, region=report.region)
        spoke.last_seen = now
        spoke.report = report
        if spoke.lost_at is not None:
            log.info("spoke_returned", spoke=spoke.id, lost_for_s=round(now - spoke.lost_at, 1))
            spoke.lost_at = None
        if is_new or now - self._spoke_persisted.get(report.spoke_id, 0) > SPOKE_PERSIST_EVERY_S:
            self._spoke_persisted[report.spoke_id] = now
            await self.db(self.store.save_spoke, spoke.model_copy())
        if previous is None or _free_changed(previous, report):
            self.trigger()

    async def _on_instance_msg(self, msg: Msg) -> None:
        try:
            event = InstanceEvent.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            await msg.ack()
            return
        await self.db(self.store.save_instance, event)
        self.instances[event.burst_id] = event
        await msg.ack()
        log.info(
            "burst_instance",
            burst_id=event.burst_id,
            state=event.state.value,
            instance_type=event.instance_type,
            team=event.team,
        )

    async def _on_burst_state_msg(self, msg: Msg) -> None:
        reply = BurstStateReply(
            instances=tuple(sorted(self.instances.values(), key=lambda e: (e.at, e.burst_id)))
        )
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def _on_sync_msg(self, msg: Msg) -> None:
        try:
            request = SyncRequest.model_validate_json(msg.data)
            if subjects.spoke_from_subject(msg.subject) != request.spoke_id:
                raise ValueError("spoke_id does not match the subject")
        except (ValidationError, ValueError) as exc:
            self._malformed(msg, exc)
            if msg.reply:
                await msg.respond(SyncReply().model_dump_json().encode())
            return
        reply = await self.reconcile(request)
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def reconcile(self, request: SyncRequest) -> SyncReply:
        """Compare a spoke's full state with ours; stop what was superseded, requeue what it lost.

        Idempotent: answering the same request again stops the same things and requeues nothing
        more (what was requeued is no longer assigned to that spoke).
        """
        spoke_id = request.spoke_id
        running = {r.workload_id: r.epoch for r in request.running}
        finished = {r.workload_id: r.epoch for r in request.finished}
        stop = []
        requeued: list[WorkloadRecord] = []
        async with self._lock:
            now = self.clock()
            for wid, epoch in sorted(running.items()):
                w = self.workloads.get(wid)
                if w is None or not w.phase.active or w.spoke_id != spoke_id or w.epoch != epoch:
                    stop.append(RunningRef(workload_id=wid, epoch=epoch))
            for w in list(self.workloads.values()):
                lost = (
                    w.spoke_id == spoke_id
                    and w.phase.active
                    and w.id not in running
                    and finished.get(w.id) != w.epoch
                    and w.command_seq is not None
                    and w.command_seq <= request.applied_seq
                    and now - (w.placed_at or now) > self.settings.missing_grace_s
                )
                if lost:
                    before, epoch = _as_running(w), w.epoch
                    self._requeue(
                        w, now, "lost_on_spoke", f"{spoke_id} no longer has it", new_epoch=True
                    )
                    if before is not None:
                        self._ended[w.id] = (before, epoch)
                    requeued.append(w)
            if requeued:
                await self.db(self.store.save, requeued)
        self.counters["syncs"] += 1
        if stop or requeued:
            log.warning(
                "sync_corrections",
                spoke=spoke_id,
                stop=[r.workload_id for r in stop],
                requeued=[w.id for w in requeued],
            )
            self.trigger()
        return SyncReply(stop=tuple(stop), requeued=tuple(w.id for w in requeued))

    async def _on_event_msg(self, msg: Msg) -> None:
        try:
            event = WorkloadEvent.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            await msg.ack()
            return
        async with self._lock:
            record = self.workloads.get(event.workload_id)
            if record is None or event.epoch != record.epoch:
                # Fencing: an event from a superseded assignment changes nothing.
                self.counters["events_stale"] += 1
                log.info(
                    "event_ignored",
                    workload=event.workload_id,
                    epoch=event.epoch,
                    phase=event.phase.value,
                )
            else:
                before, epoch = _as_running(record), record.epoch
                if self._apply_event(record, event):
                    await self.db(self.store.save, [record])
                    if before is not None and not record.phase.active:
                        self._ended[record.id] = (before, epoch)
                    if record.phase.terminal:
                        del self.workloads[record.id]
                        self._claims.discard(record.id)
        await msg.ack()
        self.counters["events"] += 1
        self.trigger()

    def _apply_event(self, w: WorkloadRecord, event: WorkloadEvent) -> bool:
        """Move a workload on from a spoke's event; False if the event changes nothing."""
        now = self.clock()
        detail = event.message or event.reason
        if event.phase == EventPhase.RUNNING:
            if w.phase != Phase.PLACED:
                return False
            w.phase = Phase.RUNNING
            w.started_at = now
            w.note(now, "running")
            return True
        if w.phase.terminal:
            return False
        w.exit_code = event.exit_code
        if event.phase == EventPhase.SUCCEEDED:
            self._finish(w, Phase.SUCCEEDED, now, "succeeded", detail)
        elif event.phase == EventPhase.CANCELLED:
            self._finish(w, Phase.CANCELLED, now, "cancelled", detail)
        elif event.phase == EventPhase.PREEMPTED:
            if w.preempted_for and w.preempted_for in self.workloads:
                self._claims.add(w.preempted_for)
            self._requeue(w, now, "preempted", detail)
        elif event.phase == EventPhase.REJECTED:
            self._retry_or_fail(w, now, "rejected", detail, retry=True)
        else:
            on_failure = w.spec.restart_policy == RestartPolicy.ON_FAILURE
            retry = on_failure and not w.cancel_requested
            self._retry_or_fail(w, now, "failed", detail, retry=retry)
        return True

    def _finish(self, w: WorkloadRecord, phase: Phase, now: float, event: str, detail: str) -> None:
        w.phase = phase
        w.finished_at = now
        w.reason = event if phase != Phase.SUCCEEDED else ""
        w.message = detail
        w.note(now, event, detail)
        log.info("workload_finished", workload=w.id, phase=phase.value, exit_code=w.exit_code)

    def _requeue(
        self, w: WorkloadRecord, now: float, event: str, detail: str, *, new_epoch: bool = False
    ) -> None:
        w.note(now, event, detail)
        if new_epoch:
            # Fence the old assignment at once: its late events and commands are ignored.
            w.epoch += 1
        w.command_seq = None
        w.phase = Phase.QUEUED
        w.spoke_id = None
        w.assignments = ()
        w.preempting = False
        w.preempted_for = None
        w.placed_at = w.started_at = None
        w.note(now, "requeued")

    def _malformed(self, msg: Msg, exc: Exception) -> None:
        self.counters["malformed"] += 1
        log.warning("malformed_message", subject=msg.subject, error=str(exc)[:500])

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking store call off the event loop, one at a time."""
        # One thread at a time: SQLite wants a single writer, and the event loop stays free.
        return await anyio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=self._db_limiter
        )


def _as_running(w: WorkloadRecord) -> RunningWorkload | None:
    """The core's view of a workload that holds GPUs; None if it holds none."""
    if not w.phase.active or w.spoke_id is None:
        return None
    return RunningWorkload(
        id=w.id,
        spec=w.spec,
        spoke_id=w.spoke_id,
        assignments=w.assignments,
        started_at=w.started_at or w.placed_at or w.submitted_at,
        preempting=w.preempting,
        preempted_for=w.preempted_for,
    )


def validation_error(exc: ValidationError) -> ErrorReply:
    """Our error shape from pydantic's: the first problem, naming its field."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    message = first["msg"].removeprefix("Value error, ")
    text = f"{field}: {message}" if field else message
    more = len(exc.errors()) - 1
    if more:
        text += f" (and {more} more problem{'s' if more > 1 else ''})"
    return ErrorReply(code="invalid_workload", message=text, field=field)


def _free_changed(old: CapacityReport, new: CapacityReport) -> bool:
    def shape(report: CapacityReport) -> list[tuple[Any, ...]]:
        return [
            (n.name, n.free_devices, tuple(sorted(n.device_free_fraction.items())), n.schedulable)
            for n in report.nodes
        ]

    return shape(old) != shape(new)


def _describe(assignments: Sequence[Any]) -> str:
    return "; ".join(
        f"{a.node}:{','.join(map(str, a.devices))}" + (f"@{a.fraction:g}" if a.fraction else "")
        for a in assignments
    )
