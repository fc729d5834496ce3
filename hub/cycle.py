"""The scheduling cycle: snapshot → plan (the pure core) → persist → publish."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from operator import itemgetter

import structlog

from bus.loglines import LineThrottle
from hub import publishing, transitions
from hub.authstore import AuditEntry
from hub.core.fleet import SnapshotBuilder
from hub.core.lifecycle import Lifecycle
from hub.core.model import Plan, RunningWorkload, Snapshot, Workload
from hub.core.ordering import served
from hub.core.planstate import PlanState
from hub.leases import Leases
from hub.publishing import Publisher
from hub.records import DecisionRecord, Records, WorkloadRecord
from hub.state import HubState
from hub.submissions import Taken
from schemas import Phase

log = structlog.get_logger(__name__)

_FIRST = itemgetter(0)

#: A running workload with its epoch and its Place's command stream sequence (hub.core.fleet).
_Active = tuple[RunningWorkload, int, int | None]
_Made = tuple[object, Phase, int, bool]


#: Every this many cycles the kept placement state is compared with one set up from scratch.
VERIFY_EVERY = 200


class Cycle:
    """Runs scheduling cycles over the hub's state."""

    def __init__(self, state: HubState, leases: Leases, publisher: Publisher) -> None:
        self.state = state
        self.leases = leases
        self.publisher = publisher
        # Placement's fleet and tally of running work, kept between cycles (hub.core.planstate);
        # new with the process, so set up from the first snapshot after a start or takeover.
        self.placement = PlanState()
        # Unchanged nodes and spokes stay the same objects, which the PlanState skips with `is`.
        self.snapshots = SnapshotBuilder()
        self._cycles = 0
        self._placed_lines = LineThrottle()  # `cycle_placed` at info at most every second
        # The core's views of the records, kept between cycles and made again only for the
        # records that moved (`hub.records.Records`): queued ones, and those holding devices
        # with their epoch and Place's sequence. So a cycle costs what changed, not a look at
        # every workload in flight.
        self._records: Records | None = None  # the records the views are of
        self._pending: dict[str, Workload] = {}
        self._running: dict[str, _Active] = {}
        # workload id -> what its view was made of (attempts, phase, refusals, claimed): every
        # VERIFY_EVERY cycles the records are checked against it, as a record that moved
        # without telling would leave a stale view
        self._made: dict[str, _Made] = {}
        self._views_read = 0
        # What started, ended or began stopping since the last plan: its running view now
        # (None: it holds no devices), for the kept placement state to look at only those.
        self._moved: dict[str, RunningWorkload | None] = {}
        # Likewise what joined, left or changed in the queue: its pending view now (or None).
        self._queued: dict[str, Workload | None] = {}
        self._applied = False  # the last plan's decisions are on the records, and saved

    async def run(self, taken: Taken | None = None) -> Plan:
        """One cycle: place what fits, preempt what must make room, publish demand.

        `taken`: new workloads, not yet saved, that this cycle takes on: planned with the rest
        and saved in its transaction, their submitters told once it commits. If the cycle
        fails before that, they are dropped and their submitters told why.
        """
        state = self.state
        new = taken.records if taken is not None else []
        async with state.lock:
            for record in new:
                state.workloads[record.id] = record
            # Batches of events whose records this cycle saves (`hub.handlers.on_events`).
            waiters, state.unsaved_waiters = state.unsaved_waiters, []
            try:
                result, decisions = await self._plan_and_save(taken)
            except BaseException as exc:
                release_waiters(waiters, exc)
                if taken is not None and not taken.is_saved:
                    self._drop(taken, exc)
                raise
            release_waiters(waiters)
        self._log_placed(len(result.placements), len(result.unplaced), state.clock())
        await self.publisher.publish(decisions)
        return result

    def _log_placed(self, placed: int, pending: int, now: float) -> None:
        """`cycle_placed` at info at most every second (`hub.loglines`), with what the cycles
        since the last one placed; each cycle's own at debug."""
        if not placed:
            return
        held = self._placed_lines.allow(now, placed)
        if held is None:
            log.debug("cycle_placed", placed=placed, pending=pending)
        else:
            log.info("cycle_placed", placed=placed + held, pending=pending)

    async def _plan_and_save(self, taken: Taken | None) -> tuple[Plan, list[DecisionRecord]]:
        state = self.state
        now = state.clock()
        pending, running, active = self._views()
        policy = state.policy_at(now)
        # An empty queue needs no plan, unless consolidation may move cloud work home.
        if not pending and taken is None and not (policy.consolidation.enabled and running):
            state.queue = ()
            if state.unsaved:
                await state.save_unsaved()
            await self.publisher.publish_demand(Plan(), (), now)
            return Plan(), []
        snapshot = self._snapshot(now, active)
        self._check(snapshot, running)
        moved, self._moved = self._moved, {}
        queued, self._queued = self._queued, {}
        # The plan lists the explanations that changed since the last plan (`Plan.explained`):
        # what it left as it was is on the records already, if that plan was applied and saved.
        applied, self._applied = self._applied, False
        result = self.placement.plan(snapshot, pending, running, policy, now, moved, queued)
        undo = _Undo(state)
        changed, decisions = self._apply(result, now, undo, applied)
        # The plan lists what it left out in the order it looked at them: the queue order.
        state.queue = result.unplaced
        audits: Sequence[AuditEntry] = ()
        if taken is not None or state.unsaved:
            listed = {w.id for w in changed}
            if taken is not None:
                changed.extend(r for r in taken.records if r.id not in listed)
                audits = taken.audits
            # What spokes' events moved since the last save goes in this transaction too.
            changed.extend(r for r in state.unsaved.values() if r.id not in listed)
        if changed or decisions:
            try:
                await state.save(changed, decisions, audits)
            except BaseException:
                # Nothing was saved, so nothing goes out: what the plan moved goes back (the
                # work it placed to the queue, not placed in memory for good, waiting for a
                # command never sent), and the kept placement state is set up afresh.
                state.counters["cycle_save_failed"] += 1
                undo.restore()
                self.placement.reset()
                raise
            if state.unsaved:
                state.unsaved_saved()
        self._applied = True
        if result.placements:  # counted once saved; the other decisions are preemptions
            state.metrics.placements.inc(len(result.placements))
        if len(decisions) > len(result.placements):
            state.metrics.preemptions.inc(len(decisions) - len(result.placements))
        if taken is not None:
            taken.saved()
        await self.publisher.publish_demand(result, pending, now)
        return result, decisions

    def _drop(self, taken: Taken, exc: BaseException) -> None:
        """New workloads of a cycle that failed before saving them: never kept, and the
        placement state that may count them set up afresh."""
        for record in taken.records:
            self.state.forget(record.id)
        self.placement.reset()
        taken.failed(exc)

    def _check(self, snapshot: Snapshot, running: list[RunningWorkload]) -> None:
        """Now and then, the kept placement state against one set up from scratch; on any
        difference, log it and start afresh (never plan on a state that drifted)."""
        self._cycles += 1
        if self._cycles % VERIFY_EVERY:
            return
        problems = self.placement.verify(snapshot, running)
        if problems:
            log.error("placement_state_diverged", problems=problems[:10], count=len(problems))
            self.placement.reset()

    def snapshot(self, now: float, running: list[RunningWorkload] | None = None) -> Snapshot:
        """The fleet as placement sees it, assumed allocations taken off."""
        active = self._views()[2] if running is None else [self._active(rw) for rw in running]
        return self._snapshot(now, active)

    def _snapshot(self, now: float, active: list[_Active]) -> Snapshot:
        state = self.state
        accepting = {  # a cordoned spoke's lease holds, but it takes no new work
            sid: self.leases.accepts_work(state.spokes.get(sid), now) and sid not in state.cordons
            for sid in state.reports
        }
        self._forget_reported_ends()
        return self.snapshots.build(state.reports, active, accepting, state.ended.values())

    def running(self) -> list[RunningWorkload]:
        """Every workload holding devices, as the core sees it."""
        return self._views()[1]

    def _views(self) -> tuple[list[Workload], list[RunningWorkload], list[_Active]]:
        """The pending and the running workloads as the core sees them, and the running ones
        with their epoch and Place's stream sequence (for the snapshot).

        Views are kept between cycles and made again only for the records that moved since
        (`Records.take_moved`); those are also what moved for the kept placement state
        (`PlanState.plan`). A new set of records (start, takeover) is all new.
        """
        records = self.state.workloads
        if records is not self._records:
            self._afresh(records)
        moved = records.take_moved()
        if moved:
            self._view_moved(records, moved)
        self._views_read += 1
        if self._views_read % VERIFY_EVERY == 0 and self._views_stale(records):
            self._afresh(records)
            self._view_moved(records, records.take_moved())
        active = list(self._running.values())
        return list(self._pending.values()), list(map(_FIRST, active)), active

    def _afresh(self, records: Records) -> None:
        """Forget every view: each record is made again, and tells these records again."""
        self._records = records
        self._pending, self._running, self._made, self._moved = {}, {}, {}, {}
        self._queued = {}
        for w in records.values():
            w.watch(records.moved)
        records.moved.update(records)
        self.placement.reset()

    def _view_moved(self, records: Records, moved: set[str]) -> None:
        claims = self.state.claims
        for wid in sorted(moved):  # in a fixed order: the same plans from the same history
            if self._pending.pop(wid, None) is not None:
                self._queued[wid] = None
            was = self._running.pop(wid, None)
            w = records.get(wid)
            if w is None:
                self._made.pop(wid, None)
                if was is not None:
                    self._moved[wid] = None
                continue
            claimed = wid in claims
            self._made[wid] = _made_of(w, claimed)
            if w.phase == Phase.QUEUED:
                self._pending[wid] = self._queued[wid] = Workload(
                    w.id,
                    w.spec,
                    w.submitted_at,
                    claims_freed=claimed,
                    avoid_spokes=frozenset(w.rejected_by),
                    attained_gpu_s=served(w.attempts, w.spec.total_gpus),
                )
                view = None
            else:
                view = transitions.as_running(w)
            if view is not None:
                self._running[wid] = (view, w.epoch, w.command_seq)
                self._moved[wid] = view
            elif was is not None:
                self._moved[wid] = None

    def _views_stale(self, records: Records) -> bool:
        """Whether a record moved without telling (its view is not what it is now): logged,
        and the views made afresh."""
        made, claims = self._made, self.state.claims
        stale = [wid for wid, w in records.items() if made.get(wid) != _made_of(w, wid in claims)]
        if stale or len(made) != len(records):
            log.error("cycle_views_stale", workloads=stale[:10], count=len(stale))
            return True
        return False

    def _active(self, rw: RunningWorkload) -> _Active:
        w = self.state.workloads[rw.id]
        return rw, w.epoch, w.command_seq

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

    def _apply(
        self, result: Plan, now: float, undo: _Undo, applied: bool
    ) -> tuple[list[WorkloadRecord], list[DecisionRecord]]:
        """The plan onto the records: what changed, and the commands to send. `applied`: the
        last plan was applied and saved, so only the explanations that changed since are read."""
        workloads = self.state.workloads
        changed: list[WorkloadRecord] = []
        decisions: list[DecisionRecord] = []
        for placement in result.placements:
            w = workloads[placement.workload_id]
            undo.keep(w)
            if placement.workload_id in self.state.claims:
                undo.claims.append(placement.workload_id)
                self.state.claims.discard(placement.workload_id)
            transitions.place(w, placement.spoke_id, placement.assignments, now)
            decisions.append(publishing.place(w, self.state.term, now))
            changed.append(w)
        for preemption in result.preemptions:
            w = workloads[preemption.workload_id]
            if w.preempting:
                continue
            undo.keep(w)
            transitions.mark_preempting(w, preemption.for_workload or None, preemption.reason, now)
            decisions.append(publishing.stop(w, "preempt", preemption.reason, self.state.term, now))
            changed.append(w)
        explained = result.unplaced
        if applied and result.explained is not None:
            explained = result.explained
        for unplaced in explained:  # kept to plain compares: it may be every pending workload
            w = workloads[unplaced.workload_id]
            # Reason is a StrEnum: equal to its value, without the enum property per item.
            if w.message != unplaced.message or w.reason != unplaced.reason:
                undo.keep(w)
                w.reason, w.message = unplaced.reason.value, unplaced.message
                changed.append(w)
        return changed, decisions


def _made_of(w: WorkloadRecord, claimed: bool) -> _Made:
    """What a record's view is made of: the view is stale when this is not what it was."""
    return (w.attempts, w.phase, len(w.rejected_by), claimed)


def release_waiters(waiters: list[asyncio.Future[None]], exc: BaseException | None = None) -> None:
    """Tell batches of events waiting for a save that it holds them (`exc` None) or not."""
    for waiter in waiters:
        if waiter.done():
            continue
        if exc is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(EventsNotSaved(f"their save failed: {exc!r}"))


class EventsNotSaved(RuntimeError):
    """The cycle that was to save a batch of events' records did not: none is acked."""


class _Undo:
    """What a cycle changed on its records, as it was before: put back when its save fails."""

    __slots__ = ("before", "claims", "state")

    def __init__(self, state: HubState) -> None:
        self.state = state
        # workload id -> (lifecycle, reason, message, history entries) before this cycle
        self.before: dict[str, tuple[Lifecycle, str, str, int]] = {}
        self.claims: list[str] = []  # claims the cycle's placements used up

    def keep(self, w: WorkloadRecord) -> None:
        if w.id not in self.before:
            self.before[w.id] = (w.lifecycle, w.reason, w.message, len(w.history))

    def restore(self) -> None:
        workloads = self.state.workloads
        for wid, (lc, reason, message, noted) in self.before.items():
            w = workloads.get(wid)
            if w is None:
                continue
            w.lifecycle = lc
            w.reason, w.message = reason, message
            del w.history[noted:]
        for claimant in self.claims:
            if claimant in workloads:
                self.state.claim(claimant)
