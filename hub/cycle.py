"""The scheduling cycle: snapshot → plan (the pure core) → persist → publish."""

from __future__ import annotations

import structlog

from hub import transitions
from hub.core.fleet import build_snapshot
from hub.core.model import Plan, RunningWorkload, Snapshot, Workload
from hub.core.placement import plan as plan_placement
from hub.ids import decision_id
from hub.leases import Leases
from hub.publishing import Publisher, decision
from hub.records import DecisionRecord, WorkloadRecord
from hub.state import HubState
from schemas import Phase, PlaceCommand, PreemptCommand

log = structlog.get_logger(__name__)


class Cycle:
    """Runs scheduling cycles over the hub's state."""

    def __init__(self, state: HubState, leases: Leases, publisher: Publisher) -> None:
        self.state = state
        self.leases = leases
        self.publisher = publisher

    async def run(self) -> Plan:
        """One cycle: place what fits, preempt what must make room, publish demand."""
        state = self.state
        async with state.lock:
            now = state.clock()
            pending = [
                Workload(
                    w.id,
                    w.spec,
                    w.submitted_at,
                    claims_freed=w.id in state.claims,
                    avoid_spokes=frozenset(w.rejected_by),
                )
                for w in state.workloads.values()
                if w.phase == Phase.QUEUED
            ]
            if not pending:
                await self.publisher.publish_demand(Plan(), {}, now)
                return Plan()
            running = self.running()
            result = plan_placement(
                self.snapshot(now, running), pending, running, state.policy, now
            )
            changed, decisions = self._apply(result, now)
            if changed or decisions:
                await state.db(state.store.save, changed, decisions)
            await self.publisher.publish_demand(result, {w.id: w for w in pending}, now)
        if result.placements:
            log.info("cycle_placed", placed=len(result.placements), pending=len(result.unplaced))
        await self.publisher.publish(decisions)
        return result

    def snapshot(self, now: float, running: list[RunningWorkload] | None = None) -> Snapshot:
        """The fleet as placement sees it, assumed allocations taken off."""
        state = self.state
        running = self.running() if running is None else running
        active = [
            (rw, state.workloads[rw.id].epoch, state.workloads[rw.id].command_seq) for rw in running
        ]
        accepting = {
            sid: self.leases.accepts_work(state.spokes.get(sid), now) for sid in state.reports
        }
        self._forget_reported_ends()
        return build_snapshot(state.reports, active, accepting, state.ended.values())

    def running(self) -> list[RunningWorkload]:
        """Every workload holding devices, as the core sees it."""
        return [
            rw
            for w in self.state.workloads.values()
            if (rw := transitions.as_running(w)) is not None
        ]

    def _forget_reported_ends(self) -> None:
        ended, reports = self.state.ended, self.state.reports
        if not ended:
            return  # the common case: no report to index on every cycle
        listed = {
            sid: {(r.workload_id, r.epoch) for r in report.running}
            for sid, report in reports.items()
        }
        for wid, (rw, epoch) in list(ended.items()):
            if (wid, epoch) not in listed.get(rw.spoke_id, ()):
                del ended[wid]

    def _apply(self, result: Plan, now: float) -> tuple[list[WorkloadRecord], list[DecisionRecord]]:
        workloads = self.state.workloads
        changed: list[WorkloadRecord] = []
        decisions: list[DecisionRecord] = []
        for placement in result.placements:
            self.state.claims.discard(placement.workload_id)
            w = workloads[placement.workload_id]
            transitions.place(w, placement.spoke_id, placement.assignments, now)
            command = PlaceCommand(
                decision_id=decision_id(w.id, w.epoch, "place"),
                workload_id=w.id,
                epoch=w.epoch,
                spec=w.spec,
                assignments=placement.assignments,
                term=self.state.term,
            )
            decisions.append(decision(command, placement.spoke_id, now))
            changed.append(w)
        for preemption in result.preemptions:
            w = workloads[preemption.workload_id]
            if w.preempting:
                continue
            transitions.mark_preempting(w, preemption.for_workload or None, preemption.reason, now)
            preempt = PreemptCommand(
                decision_id=decision_id(w.id, w.epoch, "preempt"),
                workload_id=w.id,
                epoch=w.epoch,
                reason=preemption.reason,
                term=self.state.term,
            )
            decisions.append(decision(preempt, preemption.spoke_id, now))
            changed.append(w)
        for unplaced in result.unplaced:
            w = workloads[unplaced.workload_id]
            if (w.reason, w.message) != (unplaced.reason.value, unplaced.message):
                w.reason, w.message = unplaced.reason.value, unplaced.message
                changed.append(w)
        return changed, decisions
