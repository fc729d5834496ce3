"""The hub's side of every NATS subject: parse, check, hand to the service, answer.

A malformed message is counted and logged, never raised: one bad spoke must not stop the hub
hearing the others. JetStream messages are acked once their effect is saved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from nats.aio.msg import Msg
from pydantic import ValidationError

from bus.loglines import LineThrottle
from hub import transitions
from hub.core import gpumodels, lifecycle
from hub.core.fencing import SUSPICIOUS, EventRefusal, refuse_event
from hub.core.lifecycle import EndReason, Event, live_attempt
from hub.core.origin import forged_burst_labels
from hub.errors import HubError
from hub.idle import note_activity
from hub.intake import AcceptForCycle, Intake, KeyedBatch, KeyedSubmit, Replier
from hub.intake import validation_error as validation_error
from hub.leases import Leases
from hub.records import SpokeRecord, WorkloadRecord
from hub.spokerecords import SpokeRecords
from hub.state import HubState
from hub.usage import accrue_bill
from schemas import (
    CapacityReport,
    EventPhase,
    LeaseAck,
    Phase,
    SyncReply,
    SyncRequest,
    WorkloadEvent,
    parse_events,
    subjects,
)
from schemas.burst import BurstStateReply, BurstVerdicts, InstanceEvent

log = structlog.get_logger(__name__)


class Handlers(Intake):
    """NATS callbacks over the hub's state; `submit`, `submit_many` and `reconcile` are the
    service's; `bus` answers and acks a batch in one write."""

    def __init__(
        self,
        state: HubState,
        leases: Leases,
        submit: Callable[..., Awaitable[WorkloadRecord]],
        reconcile: Callable[[SyncRequest], Awaitable[SyncReply]],
        submit_many: Callable[..., Awaitable[list[WorkloadRecord | HubError]]] | None = None,
        bus: Replier | None = None,
        accept_for_cycle: AcceptForCycle | None = None,
        keyed: KeyedSubmit | None = None,
        keyed_batch: KeyedBatch | None = None,
    ) -> None:
        super().__init__(state, submit, submit_many, bus, accept_for_cycle, keyed, keyed_batch)
        self.leases = leases
        self._reconcile = reconcile
        self.spoke_records = SpokeRecords(state)
        self._finished_lines = LineThrottle()  # `workloads_finished` at most every second
        self._respelling: set[asyncio.Task[None]] = set()

    async def on_capacity(self, msg: Msg) -> None:
        """`spoke.<id>.capacity`: renew the spoke's lease, keep its report."""
        try:
            report = CapacityReport.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            return
        if subjects.spoke_from_subject(msg.subject) != report.spoke_id:
            self._malformed(msg, ValueError("spoke_id does not match the subject"), "forged")
            return
        state = self.state
        forged = forged_burst_labels(report, state.instances.get(report.spoke_id))
        if forged:
            self._malformed(msg, ValueError(f"labels only burst may set: {', '.join(forged)}"))
            return
        previous = state.reports.get(report.spoke_id)
        if (
            previous is not None
            and previous.incarnation == report.incarnation
            and previous.seq > report.seq
        ):
            return  # an older heartbeat overtaken by a newer one
        now = state.clock()
        self.leases.heard(now)
        state.reports[report.spoke_id] = report
        if gpumodels.learn(state.gpu_models, {node.gpu_model for node in report.nodes}):
            state.put_policy(state.policy)  # a quota typed `h100` is the new `H100`'s
            respell = asyncio.create_task(self._respell_queued(), name="hub-respell-models")
            self._respelling.add(respell)  # the loop keeps only a weak reference
            respell.add_done_callback(self._respelling.discard)
        spoke = state.spokes.get(report.spoke_id)
        is_new = spoke is None
        # A spoke that got no work until now (suspect, or last heard before this hub started
        # or took over) gets it from the next cycle, not the next tick.
        was_ready = self.leases.accepts_work(spoke, now)
        if spoke is None:
            spoke = SpokeRecord(
                id=report.spoke_id,
                region=report.region,
                kind=report.kind.value,
                first_seen=now,
                last_seen=now,
            )
            state.spokes[report.spoke_id] = spoke
            log.info("spoke_joined", spoke=report.spoke_id, region=report.region)
        spoke.last_seen = now
        spoke.report = report
        note_activity(state, report, now)
        if spoke.lost_at is not None:
            log.info("spoke_returned", spoke=spoke.id, lost_for_s=round(now - spoke.lost_at, 1))
            spoke.lost_at = None
        if msg.reply:
            # The spoke's lease: it keeps its movable work only while these keep coming.
            ack = LeaseAck(
                spoke_id=report.spoke_id,
                incarnation=report.incarnation,
                seq=report.seq,
                lost_after_s=self.leases.lost_after_s,
                term=state.term,
            )
            with contextlib.suppress(Exception):  # the next report gets the next ack
                await msg.respond(ack.model_dump_json().encode())
        # Never awaited here: the next report, of any spoke, waits for this one.
        self.spoke_records.heard(spoke, now, joined=is_new)
        if previous is None or not was_ready or _free_changed(previous, report):
            state.trigger()

    async def on_instance(self, msg: Msg) -> None:
        """`burst.instances` (JetStream): keep the latest event of each burst instance."""
        try:
            event = InstanceEvent.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            await msg.ack()
            return
        state = self.state
        previous = state.instances.get(event.burst_id)
        bill = accrue_bill(state.bills.get(event.burst_id), event)
        await state.db(state.store.save_instance, event)
        if bill != state.bills.get(event.burst_id):
            await state.db(state.store.save_bill, bill)
        state.instances[event.burst_id] = event
        state.bills[event.burst_id] = bill
        for listener in state.instance_listeners:
            await listener(previous, event)
        await msg.ack()
        log.info(
            "burst_instance",
            burst_id=event.burst_id,
            state=event.state.value,
            instance_type=event.instance_type,
            team=event.team,
        )

    async def on_burst_verdicts(self, msg: Msg) -> None:
        """`burst.verdicts`: why a burst controller's latest round rents nothing for waiting
        work; replaces that controller's previous word (`hub.cloudwait.Verdicts`)."""
        try:
            verdicts = BurstVerdicts.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            return
        self.state.verdicts.update(verdicts)

    async def on_burst_state(self, msg: Msg) -> None:
        """`burst.state`: the latest event of every burst instance, oldest first."""
        instances = sorted(self.state.instances.values(), key=lambda e: (e.at, e.burst_id))
        reply = BurstStateReply(instances=tuple(instances))
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def on_sync(self, msg: Msg) -> None:
        """`spoke.<id>.sync`: a spoke's full state in, what to stop and what moved out."""
        try:
            request = SyncRequest.model_validate_json(msg.data)
            if subjects.spoke_from_subject(msg.subject) != request.spoke_id:
                raise _Forged("spoke_id does not match the subject")
        except (ValidationError, ValueError) as exc:
            self._malformed(msg, exc, "forged" if isinstance(exc, _Forged) else "malformed")
            if msg.reply:
                await msg.respond(SyncReply().model_dump_json().encode())
            return
        reply = await self._reconcile(request)
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def on_event(self, msg: Msg) -> None:
        """`spoke.<id>.events` (JetStream): a workload's phase change under one epoch."""
        await self.on_events([msg])

    async def on_events(self, msgs: list[Msg]) -> None:
        """Events as fetched, in stream order: applied together, saved in one transaction.

        While the cycle loop runs, that is the next cycle's own: a cycle and a batch of events
        each paid a transaction (its commit, and the store thread's turn), and at 400
        submissions a second the batches came nearly as often as the cycles. The batch waits
        for that cycle (at most about a cycle interval), which a batch with changes asks for.
        Each event is acked once its records are saved; a failed save acks none, so all come
        back.
        """
        # Each with its message's subject and the spoke that subject names.
        events: list[tuple[str, str | None, WorkloadEvent]] = []
        for msg in msgs:  # each holds one event, or several in order (schemas.parse_events)
            try:
                parsed = parse_events(msg.data)
            except ValidationError as exc:
                self._malformed(msg, exc)
                continue
            spoke = subjects.spoke_from_subject(msg.subject)
            events.extend((msg.subject, spoke, event) for event in parsed)
        state = self.state
        saved: asyncio.Future[None] | None = None
        async with state.lock:
            changed: dict[str, WorkloadRecord] = {}
            for subject, subject_spoke, event in events:
                record = state.workloads.get(event.workload_id)
                attempts = record.attempts if record is not None else ()
                live = live_attempt(attempts)
                # The event's attempt: nearly always the latest.
                attempt = attempts[-1] if attempts else None
                if attempt is not None and attempt.epoch != event.epoch:
                    attempt = next((a for a in attempts if a.epoch == event.epoch), None)
                refusal = refuse_event(
                    subject_spoke=subject_spoke,
                    event_spoke=event.spoke_id,
                    event_epoch=event.epoch,
                    known=record is not None,
                    latest_epoch=attempts[-1].epoch if attempts else 0,
                    attempt_spoke=attempt.spoke_id if attempt is not None else None,
                    attempt_live=attempt is not None and attempt.live,
                )
                if record is None or live is None or refusal is not None:
                    # Fencing and origin: only the spoke holding the live attempt is heard.
                    self._event_refused(subject, event, refusal)
                elif self._apply_event(record, event):
                    changed[record.id] = record
            # A batch whose save failed moved its records ahead of the store; its events come
            # back, find them moved and change nothing: those records go with this save.
            state.unsaved.update(changed)
            if state.unsaved and state.paced:
                saved = asyncio.get_running_loop().create_future()
                state.unsaved_waiters.append(saved)
                state.trigger()
            elif state.unsaved:
                await state.save_unsaved()
        if saved is not None:
            await saved  # raises when the cycle did not save them: nothing is acked
        if changed:
            transitions.log_finished(list(changed.values()), self._finished_lines, state.clock())
        await self._bus.ack(msgs)
        state.counters["events"] += len(events)
        if any(e.phase != EventPhase.RUNNING for _, _, e in events):
            state.trigger()  # devices freed or work requeued; a start changes no plan

    async def _respell_queued(self) -> None:
        """A model new to the fleet: queued work that asked for it in another case asks for
        it in the fleet's spelling from now on (saved with the next cycle, as events are)."""
        state = self.state
        async with state.lock:
            for record in state.workloads.values():
                if record.phase != Phase.QUEUED:
                    continue
                spec = gpumodels.respelt(record.spec, state.gpu_models)
                if spec is not record.spec:
                    record.spec = spec
                    state.unsaved[record.id] = record
            if state.unsaved and state.paced:
                state.trigger()
            elif state.unsaved:
                try:
                    await state.save_unsaved()
                except Exception:  # they stay unsaved: the next save takes them
                    log.exception("respelt_workloads_not_saved", count=len(state.unsaved))

    def _event_refused(
        self, subject: str, event: WorkloadEvent, refusal: EventRefusal | None
    ) -> None:
        counters = self.state.counters
        counters["events_stale"] += 1
        if refusal is None or refusal not in SUSPICIOUS:
            self.state.metrics.dropped.labels("stale").inc()
            log.info(
                "event_ignored",
                workload=event.workload_id,
                epoch=event.epoch,
                phase=event.phase.value,
            )
            return
        self.state.metrics.dropped.labels("forged").inc()
        counters["events_refused"] += 1
        counters[f"events_refused_{refusal.value}"] += 1
        log.warning(
            "event_refused",
            reason=refusal.value,
            subject=subject,
            spoke=event.spoke_id,
            workload=event.workload_id,
            epoch=event.epoch,
        )

    def _apply_event(self, w: WorkloadRecord, event: WorkloadEvent) -> bool:
        """Move a workload on from its spoke's event; False if the event changes nothing."""
        now = self.state.clock()
        at = reported_at(w, event.at, now)
        if event.phase == EventPhase.RUNNING:
            if not lifecycle.allows(w.phase, Event.START):
                return False  # a repeat, or the end overtook it
            transitions.start(w, at, event.endpoint)
            waited = max(0.0, at - queued_since(w))
            self.state.metrics.waited(w.spec.priority_class, waited)
            return True
        reason = lifecycle.reported_end(event.phase, event.reason)
        detail = event.message or event.reason
        if event.phase == EventPhase.REJECTED and reason == EndReason.PREEMPTED:
            self.leases.refused(event.spoke_id, now)  # no more work there until it reports
        if event.phase == EventPhase.CANCELLED and w.stop_reason:  # stopped by hub.idle
            reason, detail = EndReason(w.stop_reason), w.stop_notice
        if event.reason == "runtime_refused" and event.spoke_id not in w.rejected_by:
            w.rejected_by = [*w.rejected_by, event.spoke_id]  # never placed there again
        ended = transitions.end(w, reason, at, detail, event.exit_code)
        self.state.metrics.attempt_ended(reason.value, requeued=w.phase == Phase.QUEUED)
        # The spoke frees devices before it reports the end: its last report may list them.
        self.state.ended[w.id] = (transitions.running_of(ended, w), ended.epoch)
        claimant = lifecycle.freed_for(ended)
        if claimant is not None and claimant in self.state.workloads:
            self.state.claim(claimant)
        return True

    def _malformed(self, msg: Msg, exc: Exception, why: str = "malformed") -> None:
        self.state.counters["malformed"] += 1
        self.state.metrics.dropped.labels(why).inc()
        log.warning("malformed_message", subject=msg.subject, why=why, error=str(exc)[:500])


class _Forged(ValueError):
    """A message whose claimed identity does not match the subject it came on."""


def reported_at(w: WorkloadRecord, spoke_at: float, now: float) -> float:
    """When a spoke's event happened, as the hub records it: the spoke's own time, kept
    between the workload's last recorded step and now.

    A spoke runs on while the hub (or the WAN) is away and reports what happened once it is
    back; timed at arrival, a run that ended early would count the whole outage (its
    GPU-hours, its team's fair share, `run_s`). The bounds keep a skewed spoke clock from
    putting a step before the one it follows or in the future.
    """
    last = w.history[-1].at if w.history else w.submitted_at
    return min(now, max(spoke_at, last))


def queued_since(w: WorkloadRecord) -> float:
    """When the workload last entered the queue (submitted, or requeued after a run)."""
    for entry in reversed(w.history):
        if entry.event in ("submitted", "requeued"):
            return entry.at
    return w.submitted_at


def _free_changed(old: CapacityReport, new: CapacityReport) -> bool:
    def shape(report: CapacityReport) -> list[tuple[Any, ...]]:
        return [
            (n.name, n.free_devices, tuple(sorted(n.device_free_fraction.items())), n.schedulable)
            for n in report.nodes
        ]

    return shape(old) != shape(new)
