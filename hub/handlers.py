"""The hub's side of every NATS subject: parse, check, hand to the service, answer.

A malformed message is counted and logged, never raised: one bad spoke must not stop the hub
hearing the others. JetStream messages are acked once their effect is saved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from nats.aio.msg import Msg
from pydantic import ValidationError

from hub import transitions
from hub.core import lifecycle
from hub.core.lifecycle import Event
from hub.core.origin import forged_burst_labels
from hub.errors import HubError
from hub.leases import Leases
from hub.records import SpokeRecord, WorkloadRecord
from hub.state import HubState
from schemas import (
    CapacityReport,
    ErrorReply,
    EventPhase,
    LeaseAck,
    SubmitReply,
    SyncReply,
    SyncRequest,
    WorkloadEvent,
    WorkloadSpec,
    subjects,
)
from schemas.burst import BurstStateReply, InstanceEvent

log = structlog.get_logger(__name__)

#: How often a spoke's last_seen is written to the store (heartbeats come every few seconds).
SPOKE_PERSIST_EVERY_S = 10.0


class Handlers:
    """NATS callbacks over the hub's state; `submit` and `reconcile` are the service's."""

    def __init__(
        self,
        state: HubState,
        leases: Leases,
        submit: Callable[[WorkloadSpec], Awaitable[WorkloadRecord]],
        reconcile: Callable[[SyncRequest], Awaitable[SyncReply]],
    ) -> None:
        self.state = state
        self.leases = leases
        self._submit = submit
        self._reconcile = reconcile
        self._spoke_persisted: dict[str, float] = {}

    async def on_submit(self, msg: Msg) -> None:
        """`submit`: a WorkloadSpec in, a SubmitReply out."""
        try:
            spec = WorkloadSpec.model_validate_json(msg.data)
            record = await self._submit(spec)
            reply = SubmitReply(ok=True, workload_id=record.id)
        except ValidationError as exc:
            self.state.counters["submit_invalid"] += 1
            reply = SubmitReply(ok=False, error=validation_error(exc))
        except HubError as exc:
            if not exc.retryable:
                self.state.counters["submit_invalid"] += 1
            reply = SubmitReply(ok=False, error=exc.reply())
        except Exception:
            log.exception("submit_failed")
            error = ErrorReply(code="internal", message="the hub failed; try again", retryable=True)
            reply = SubmitReply(ok=False, error=error)
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def on_capacity(self, msg: Msg) -> None:
        """`spoke.<id>.capacity`: renew the spoke's lease, keep its report."""
        try:
            report = CapacityReport.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            return
        if subjects.spoke_from_subject(msg.subject) != report.spoke_id:
            self._malformed(msg, ValueError("spoke_id does not match the subject"))
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
        spoke = state.spokes.get(report.spoke_id)
        is_new = spoke is None
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
        if spoke.lost_at is not None:
            log.info("spoke_returned", spoke=spoke.id, lost_for_s=round(now - spoke.lost_at, 1))
            spoke.lost_at = None
        if is_new or now - self._spoke_persisted.get(report.spoke_id, 0) > SPOKE_PERSIST_EVERY_S:
            self._spoke_persisted[report.spoke_id] = now
            await state.db(state.store.save_spoke, spoke.model_copy())
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
        if previous is None or _free_changed(previous, report):
            state.trigger()

    async def on_instance(self, msg: Msg) -> None:
        """`burst.instances` (JetStream): keep the latest event of each burst instance."""
        try:
            event = InstanceEvent.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            await msg.ack()
            return
        await self.state.db(self.state.store.save_instance, event)
        self.state.instances[event.burst_id] = event
        await msg.ack()
        log.info(
            "burst_instance",
            burst_id=event.burst_id,
            state=event.state.value,
            instance_type=event.instance_type,
            team=event.team,
        )

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
                raise ValueError("spoke_id does not match the subject")
        except (ValidationError, ValueError) as exc:
            self._malformed(msg, exc)
            if msg.reply:
                await msg.respond(SyncReply().model_dump_json().encode())
            return
        reply = await self._reconcile(request)
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def on_event(self, msg: Msg) -> None:
        """`spoke.<id>.events` (JetStream): a workload's phase change under one epoch."""
        try:
            event = WorkloadEvent.model_validate_json(msg.data)
        except ValidationError as exc:
            self._malformed(msg, exc)
            await msg.ack()
            return
        state = self.state
        async with state.lock:
            record = state.workloads.get(event.workload_id)
            live = record.lifecycle.live if record is not None else None
            if record is None or live is None or event.epoch != live.epoch:
                # Fencing: an event of an attempt that is not the live one changes nothing.
                state.counters["events_stale"] += 1
                log.info(
                    "event_ignored",
                    workload=event.workload_id,
                    epoch=event.epoch,
                    phase=event.phase.value,
                )
            elif self._apply_event(record, event):
                await state.db(state.store.save, [record])
                if record.phase.terminal:
                    state.forget(record.id)
        await msg.ack()
        state.counters["events"] += 1
        state.trigger()

    def _apply_event(self, w: WorkloadRecord, event: WorkloadEvent) -> bool:
        """Move a workload on from its spoke's event; False if the event changes nothing."""
        now = self.state.clock()
        if event.phase == EventPhase.RUNNING:
            if not lifecycle.allows(w.phase, Event.START):
                return False  # a repeat, or the end overtook it
            transitions.start(w, now)
            return True
        reason = lifecycle.REPORTED_ENDS[event.phase]
        if event.reason == "runtime_refused" and event.spoke_id not in w.rejected_by:
            w.rejected_by.append(event.spoke_id)  # never placed there again
        ended = transitions.end(w, reason, now, event.message or event.reason, event.exit_code)
        # The spoke frees devices before it reports the end: its last report may list them.
        self.state.ended[w.id] = (transitions.running_of(ended, w), ended.epoch)
        claimant = lifecycle.freed_for(ended)
        if claimant is not None and claimant in self.state.workloads:
            self.state.claims.add(claimant)
        return True

    def _malformed(self, msg: Msg, exc: Exception) -> None:
        self.state.counters["malformed"] += 1
        log.warning("malformed_message", subject=msg.subject, error=str(exc)[:500])


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
