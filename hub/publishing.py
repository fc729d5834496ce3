"""Commands to the spokes and demand to burst: persisted first, then published.

A decision is saved (unpublished) in the same transaction as the workload change it belongs to,
published under its derived id (the bus drops a copy it already has), and then marked
published: with the next save, or on its own within `MARK_WITHIN_S`. What a crash left
unpublished is sent again at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Literal

import structlog

from bus.client import Bus
from hub.core import lifecycle
from hub.core.demand import unplaceable_demand
from hub.core.model import Plan, Workload
from hub.ids import decision_id
from hub.records import DecisionRecord, WorkloadRecord
from hub.state import HubState
from schemas import CancelCommand, PlaceCommand, PreemptCommand, burst, parse_command, subjects
from schemas.burst import DemandReport
from schemas.commands import MAX_COMMANDS_BYTES, MAX_COMMANDS_PER_MESSAGE
from schemas.common import json_array, json_runs

log = structlog.get_logger(__name__)

#: Demand is published when it changes, and at least this often.
DEMAND_EVERY_S = 2.0
#: While work waits, demand is worked out at most this often: it walks every pending workload,
#: a tenth of the hub's CPU with 10,000 queued, and burst acts on it in seconds at the least.
DEMAND_AT_MOST_EVERY_S = 0.5
#: ... and no more than this share of the hub's CPU: after a report that cost C seconds of the
#: event loop's CPU, the next waits at least C / DEMAND_CPU_SHARE (at most DEMAND_EVERY_S).
DEMAND_CPU_SHARE = 0.05
#: A published decision is marked in the store's next write; when none comes within this
#: long, in a write of its own. (Far inside the bus's duplicate window: a mark lost to a crash
#: only means the command is sent again under the same id, and the bus drops the copy.)
MARK_WITHIN_S = 0.5


def decision(
    command: PlaceCommand | CancelCommand | PreemptCommand, spoke_id: str, now: float
) -> DecisionRecord:
    """The record of a command to `spoke_id`, to save before it is published."""
    return DecisionRecord(
        decision_id=command.decision_id,
        workload_id=command.workload_id,
        spoke_id=spoke_id,
        subject=subjects.commands(spoke_id),
        payload=command.model_dump_json().encode(),
        created_at=now,
    )


def place(w: WorkloadRecord, term: int, now: float, *, again: bool = False) -> DecisionRecord:
    """The Place of `w`'s live attempt, as placed (its spoke, devices and epoch). `again`: a
    new leader's copy of an earlier leader's Place, under an id of its own (`again_id`)."""
    live = w.live
    assert live is not None, f"{w.id} holds no attempt to place"
    first = decision_id(w.id, live.epoch, "place")
    command = PlaceCommand(
        decision_id=again_id(first, term) if again else first,
        workload_id=w.id,
        epoch=live.epoch,
        spec=w.spec,
        assignments=live.assignments,
        term=term,
    )
    return decision(command, live.spoke_id, now)


def stop(
    w: WorkloadRecord, kind: Literal["preempt", "cancel"], reason: str, term: int, now: float
) -> DecisionRecord:
    """A Preempt (the work is queued again once stopped) or a Cancel of `w`'s live attempt."""
    live = w.live
    assert live is not None, f"{w.id} holds no attempt to stop"
    command_type = PreemptCommand if kind == "preempt" else CancelCommand
    command = command_type(
        decision_id=decision_id(w.id, live.epoch, kind),
        workload_id=w.id,
        epoch=live.epoch,
        reason=reason,
        term=term,
    )
    return decision(command, live.spoke_id, now)


def again_id(place_id: str, term: int) -> str:
    """The id of a Place sent again by the leader of `term` (`Publisher.resend_places`)."""
    return f"{place_id}-t{term}"


def command_messages(
    decisions: Sequence[DecisionRecord],
) -> list[tuple[tuple[str, bytes, str], list[DecisionRecord]]]:
    """Decisions as messages (subject, payload, Nats-Msg-Id), each with the decisions it holds:
    per spoke in their order, up to MAX_COMMANDS_PER_MESSAGE commands and about
    MAX_COMMANDS_BYTES each (`schemas.parse_commands` reads them). A lone command goes under
    its decision id, as before; several under the first one's, their count and a digest of
    every id, so that one id always means the same commands (and a spoke drops a decision it
    has seen, whatever message brings it again)."""
    by_subject: dict[str, list[DecisionRecord]] = {}
    for d in decisions:
        by_subject.setdefault(d.subject, []).append(d)
    return [
        _message(subject, records[run])
        for subject, records in by_subject.items()
        for run in json_runs(
            [r.payload for r in records], MAX_COMMANDS_PER_MESSAGE, MAX_COMMANDS_BYTES
        )
    ]


def _message(
    subject: str, records: list[DecisionRecord]
) -> tuple[tuple[str, bytes, str], list[DecisionRecord]]:
    if len(records) == 1:
        msg_id = records[0].decision_id
    else:
        digest = hashlib.sha256("\n".join(r.decision_id for r in records).encode()).hexdigest()
        msg_id = f"{records[0].decision_id}+{len(records) - 1}-{digest[:16]}"
    return (subject, json_array([r.payload for r in records]), msg_id), records


class Publisher:
    """Sends saved decisions and the demand report on the bus."""

    def __init__(
        self, state: HubState, bus: Bus, cpu_clock: Callable[[], float] = time.thread_time
    ) -> None:
        self.state = state
        self.bus = bus
        self.demand = DemandReport(sent_at=0.0, seq=0)
        self._demand_published_at = 0.0
        self._demand_worked_out_at = -DEMAND_AT_MOST_EVERY_S
        self._demand_gap = DEMAND_AT_MOST_EVERY_S  # from the last report's cost
        self._cpu_clock = cpu_clock
        self._marker: asyncio.Task[None] | None = None

    async def publish(self, decisions: Sequence[DecisionRecord]) -> None:
        """Publish saved decisions (each until acked), then mark them published.

        A spoke's commands go in as few messages (`command_messages`); a Place's stream
        sequence is its message's.
        """
        if not decisions:
            return
        messages = command_messages(decisions)
        acks = await self.bus.publish_durable_many([message for message, _ in messages])
        for (_, records), ack in zip(messages, acks, strict=True):
            for record in records:
                w = self.state.workloads.get(record.workload_id)
                live = w.live if w is not None else None
                if w is None or live is None:
                    continue
                first = decision_id(w.id, live.epoch, "place")
                if record.decision_id in (first, again_id(first, self.state.term)):
                    w.lifecycle = lifecycle.note_command_seq(w.lifecycle, live.epoch, ack.seq)
        self.state.counters["commands_published"] += len(decisions)
        # Marked in the transaction of the next save (under load, milliseconds away): a write
        # of their own was a transaction and a thread hop for every cycle's publish.
        self.state.store.mark_published_later(d.decision_id for d in decisions)
        if self._marker is None or self._marker.done():
            self._marker = asyncio.create_task(self._mark_published(), name="hub-mark-published")

    async def _mark_published(self) -> None:
        store = self.state.store
        while store.pending_marks():
            await asyncio.sleep(MARK_WITHIN_S)
            if store.pending_marks():  # no save took them
                await self._write_marks()

    async def _write_marks(self) -> None:
        try:
            await self.state.db(self.state.store.mark_published)
        except Exception:
            log.warning("mark_published_failed", count=self.state.store.pending_marks())

    async def flush_marks(self) -> None:
        """Write every mark still waiting (at shutdown: publishes so far are marked)."""
        if self._marker is not None:
            self._marker.cancel()
        if self.state.store.pending_marks():
            await self._write_marks()

    async def republish_unpublished(self) -> None:
        """Send again what a crash left unpublished, under the same ids.

        A decision of an earlier term (a leader that died between saving and publishing it) is
        sent under this hub's term: this leader loaded it and owns it now, and a spoke that has
        already heard this term would drop the old one (and the workload would wait for
        reconciliation to requeue it).
        """
        decisions = [self._in_term(d) for d in await self.state.db(self.state.store.unpublished)]
        if decisions:
            log.info("republishing_decisions", count=len(decisions), term=self.state.term)
            await self.publish(decisions)

    async def resend_places(self) -> None:
        """Send again, under this hub's term and an id of its own, the Place of each workload
        an earlier leader placed that has not started. A spoke that heard this term before it
        read that leader's Place dropped it as an older term's; and where the Place's stream
        sequence was not saved (a leader keeps it in memory until the workload's next change),
        reconciliation could never tell it was lost from it being on its way: the workload
        waited placed for ever. A spoke that applied the first copy drops this one (its epoch
        is not newer); one that dropped it runs the workload."""
        now, term = self.state.clock(), self.state.term
        decisions = [
            place(w, term, now, again=True)
            for w in self.state.workloads.values()
            if (live := w.live) is not None
            and live.started_at is None
            and not (w.preempting or w.cancel_requested)
        ]
        if decisions:
            await self.state.save((), decisions)
            log.info("places_sent_again", count=len(decisions), term=term)
            await self.publish(decisions)

    def _in_term(self, record: DecisionRecord) -> DecisionRecord:
        command = parse_command(record.payload)
        if command.term >= self.state.term:
            return record
        command = command.model_copy(update={"term": self.state.term})
        return record.model_copy(update={"payload": command.model_dump_json().encode()})

    async def publish_demand(self, result: Plan, pending: Sequence[Workload], now: float) -> None:
        """Tell burst what no spoke can serve: when it changes (seen at most every 0.5 s while
        work waits, less often when working it out costs more than DEMAND_CPU_SHARE of the
        hub's CPU; at once when none waits), and at least every 2 s. `pending`: the plan's
        queue (keyed by id only when the demand is worked out, not every cycle)."""
        if result.unplaced and now - self._demand_worked_out_at < self._demand_gap:
            return
        if not result.unplaced and not self.demand.items and not self._demand_due(now):
            return  # nothing waits, and burst was told so less than DEMAND_EVERY_S ago
        self._demand_worked_out_at = now
        cpu = self._cpu_clock()
        report = unplaceable_demand(
            result.unplaced,
            {w.id: w for w in pending},
            self.state.policy_at(now),
            now,
            self.demand.seq + 1,
        ).model_copy(update={"term": self.state.term})
        cost = self._cpu_clock() - cpu
        self._demand_gap = min(DEMAND_EVERY_S, max(DEMAND_AT_MOST_EVERY_S, cost / DEMAND_CPU_SHARE))
        if self.state.burst_budget is not None:
            report = report.model_copy(update={"budget": self.state.burst_budget})
        if report.items == self.demand.items and not self._demand_due(now):
            return
        self.demand = report
        self._demand_published_at = now
        with contextlib.suppress(Exception):  # a lost report is replaced by the next one
            await self.bus.publish(burst.BURST_DEMAND, report.model_dump_json().encode())

    def _demand_due(self, now: float) -> bool:
        """Whether the demand report is due again even unchanged (burst's heartbeat)."""
        return now - self._demand_published_at >= DEMAND_EVERY_S
