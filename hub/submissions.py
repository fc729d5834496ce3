"""Taking on new workloads: checked against policy, saved in group commits, then queued."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Sequence

import structlog

from bus.loglines import LineThrottle
from hub.audit import log_written
from hub.authstore import AuditEntry
from hub.core import gpumodels
from hub.errors import HubError, InvalidWorkload, TooMany, Unavailable
from hub.ids import new_workload_id
from hub.records import WorkloadRecord
from hub.state import HubState
from schemas import Phase, WorkloadSpec
from schemas.common import unknown_text
from schemas.workloads import unknown_fields

log = structlog.get_logger(__name__)


_Waiting = tuple[list[WorkloadRecord], list[AuditEntry], "asyncio.Future[None]"]


class Submissions:
    """New workload records and their group-committed saves (NATS and REST share these)."""

    def __init__(self, state: HubState) -> None:
        self.state = state
        self._waiting: list[_Waiting] = []  # for the committer
        self._for_cycle: list[_Waiting] = []  # for the next cycle's transaction (`take`)
        self._committer: asyncio.Task[None] | None = None
        self._audit_lines = LineThrottle()  # the info lines of saved submissions' audit entries

    def queued_counts(self) -> QueuedCounts:
        """Queued workloads per team, those still being saved included (for `max_queued`)."""
        return QueuedCounts(self)

    def _in_flight(self) -> int:
        waiting = (*self._waiting, *self._for_cycle)
        return len(self.state.workloads) + sum(len(records) for records, _, _ in waiting)

    def _count_queued(self) -> Counter[str]:
        counts: Counter[str] = Counter(
            w.spec.team for w in self.state.workloads.values() if w.phase == Phase.QUEUED
        )
        waiting = (*self._waiting, *self._for_cycle)
        counts.update(r.spec.team for records, _, _ in waiting for r in records)
        return counts

    def new_record(
        self, spec: WorkloadSpec, queued: QueuedCounts, user: str = "", workload_id: str = ""
    ) -> WorkloadRecord:
        """A new record for `spec`, counted in `queued`, under `workload_id` (or a new id:
        `hub.keyed` names one); raises what policy refuses."""
        unknown = unknown_fields(spec)
        if unknown:  # what was asked is not what would run: refused before any other check
            raise InvalidWorkload(unknown_text(unknown), field=unknown[0][0])
        cap = self.state.policy.max_queued(spec.team)
        if cap is not None and queued.reached(spec.team, cap):
            self.state.counters["submit_throttled"] += 1
            raise TooMany(
                f"team {spec.team} has {cap} workloads queued, its cap (max_queued)",
                field="team",
            )
        if spec.priority_class not in self.state.policy.priorities:
            known = ", ".join(sorted(self.state.policy.priorities))
            raise InvalidWorkload(
                f"priority class {spec.priority_class!r} is not defined (known: {known})",
                field="priority_class",
            )
        spec = gpumodels.respelt(spec, self.state.gpu_models)  # `h100` is the fleet's `H100`
        now = self.state.clock()
        while not workload_id or workload_id in self.state.workloads:  # one id, one workload
            workload_id = new_workload_id()
        record = WorkloadRecord(id=workload_id, spec=spec, submitted_at=now, user=user)
        record.note(now, "submitted")
        queued.add(spec.team)  # the next of its batch is checked with it counted
        return record

    def accept(
        self,
        specs: Sequence[WorkloadSpec],
        user: str,
        audit: Callable[[WorkloadSpec, str], AuditEntry] | None,
        ids: Sequence[str] = (),
    ) -> tuple[list[WorkloadRecord | HubError], list[WorkloadRecord], list[AuditEntry]]:
        """New records for what policy allows of `specs` (under `ids`, else new ones): per
        spec, in order, the record or why it was refused; the records; their audit entries
        (`audit`: from spec and id)."""
        results: list[WorkloadRecord | HubError] = []
        queued = self.queued_counts()
        for at, spec in enumerate(specs):
            try:
                results.append(self.new_record(spec, queued, user, ids[at] if ids else ""))
            except HubError as exc:
                results.append(exc)
        records = [r for r in results if isinstance(r, WorkloadRecord)]
        audits = [] if audit is None else [audit(r.spec, r.id) for r in records]
        return results, records, audits

    async def commit(
        self, records: list[WorkloadRecord], audits: Sequence[AuditEntry] = (), alone: bool = False
    ) -> None:
        """Save new workloads (and the audit entries of their submission), then take them on
        (group commit).

        Submissions that arrive while a save is under way wait and are saved together in the
        next transaction: under load one commit serves many submissions. A lone one (`alone`)
        goes, while the cycle loop runs, with the next cycle (`register`). Returns once
        `records` are durable; raises what the store raised.
        """
        if not records:
            return
        if alone and self.state.paced:
            await self.register(records, audits)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((records, list(audits), done))
        self.start()
        await done

    def register(
        self, records: list[WorkloadRecord], audits: Sequence[AuditEntry] = ()
    ) -> asyncio.Future[None]:
        """Hand new workloads to the next scheduling cycle, which takes them on, plans them and
        saves them in its own transaction (`take`); the future is done once they are saved.
        Only while the cycle loop runs (`HubState.paced`)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._for_cycle.append((records, list(audits), done))
        self.state.trigger()
        return done

    def take(self) -> Taken | None:
        """What waits for this cycle (the cycle loop calls this just before it plans)."""
        batch, self._for_cycle = self._for_cycle, []
        return Taken(self.state, batch, self._audit_lines) if batch else None

    def release(self) -> None:
        """Save what waits for a cycle that will not come (the cycle loop stopped)."""
        self._waiting.extend(self._for_cycle)
        self._for_cycle = []
        self.start()

    def start(self) -> None:
        """Save what waits, in a task of its own unless one runs: a submitter that goes away
        must not cancel the others' save."""
        if self._waiting and (self._committer is None or self._committer.done()):
            self._committer = asyncio.create_task(self._commit_queued(), name="hub-commit")

    async def _commit_queued(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            with contextlib.suppress(Exception):  # each waiter gets it from its future
                await self._commit_batch(batch)

    async def _commit_batch(self, batch: list[_Waiting]) -> None:
        taken = Taken(self.state, batch, self._audit_lines)
        try:
            # Saved without the lock: nothing else holds these new records yet, and a save
            # waiting beside the cycle's or the events' is committed in their transaction.
            await self.state.save(taken.records, (), taken.audits)
            async with self.state.lock:
                for record in taken.records:
                    self.state.workloads[record.id] = record
        except BaseException as exc:
            taken.failed(exc)
            raise
        taken.saved()
        self.state.trigger()


class Taken:
    """New workloads saved together, and their submitters waiting for that save."""

    def __init__(self, state: HubState, batch: list[_Waiting], lines: LineThrottle) -> None:
        self.state = state
        self.batch = batch
        self._lines = lines
        self.records = [r for rs, _, _ in batch for r in rs]
        self.audits = [e for _, es, _ in batch for e in es]
        self.is_saved = False

    def saved(self) -> None:
        """They are stored: answer their submitters, count them, log them."""
        self.is_saved = True
        for _, _, done in self.batch:
            if not done.done():  # its submitter may have gone away
                done.set_result(None)
        self.state.counters["submitted"] += len(self.records)
        if self.audits:  # an info line at most every second (hub.loglines); the store has all
            held = self._lines.allow(self.state.clock(), len(self.audits))
            if held is not None:
                log_written(self.audits, unlisted=held)
        if not log.is_enabled_for(logging.DEBUG):
            return  # (not even the arguments of a line per workload that nobody reads)
        for record in self.records:
            log.debug(  # each submission's info line is its audit entry's
                "workload_submitted",
                workload=record.id,
                team=record.spec.team,
                gpus=record.spec.total_gpus,
            )

    def failed(self, exc: BaseException) -> None:
        """They are not stored: tell their submitters why."""
        error = exc if isinstance(exc, Exception) else Unavailable("the hub is stopping; try again")
        for _, _, done in self.batch:
            if not done.done():
                done.set_exception(error)


class QueuedCounts:
    """Queued workloads per team for `max_queued`, counted only when it could matter.

    Counting walks every workload in flight, so it is skipped while fewer workloads are in
    flight (with those a batch took so far) than the cap (no team can have reached it), and a
    batch counts at most once. A batch's own items count as they are taken: a team under its
    cap by 3 gets 3 of a batch of 10, and `too_many_queued` for the other 7.
    """

    def __init__(self, submissions: Submissions) -> None:
        self._submissions = submissions
        self._counts: Counter[str] | None = None
        self._added: Counter[str] = Counter()  # taken by this batch before the counting

    def reached(self, team: str, cap: int) -> bool:
        """Whether `team` has `cap` workloads queued or being saved (or taken by this batch)."""
        counts = self._counts
        if counts is None:
            if self._submissions._in_flight() + self._added.total() < cap:
                return False
            counts = self._counts = self._submissions._count_queued() + self._added
        return counts[team] >= cap

    def add(self, team: str) -> None:
        """One more of `team`'s workloads taken (queued) by this batch."""
        if self._counts is None:
            self._added[team] += 1
        else:
            self._counts[team] += 1
