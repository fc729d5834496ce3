"""The spoke's side of a fenced Job's lease (lease.py): each new Job's first deadline, and a
task that moves the running ones' deadlines on as the spoke hears the hub."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable

import structlog

from spoke.errors import SpokeError
from spoke.fencing import Guard
from spoke.ports import Launch
from spoke.runtime.kubernetes.jobs import SpokeJobs
from spoke.runtime.kubernetes.lease import (
    MIN_FENCE_AFTER_S,
    JobLease,
    active_deadline,
    renewed,
)
from spoke.runtime.kubernetes.tracking import Tracked

log = structlog.get_logger(__name__)

#: How often the fenced Jobs' deadlines are looked at.
CHECK_S = 1.0
#: PATCHes in flight at once (after a hub outage every fenced Job is due together).
CONCURRENT_PATCHES = 8


class DeadlineKeeper:
    """Keeps each fenced Job's `activeDeadlineSeconds` at the spoke's lease."""

    def __init__(self, guard: Guard, jobs: SpokeJobs, tracked: Callable[[], Iterable[Tracked]]):
        self._guard = guard
        self._jobs = jobs
        self._tracked = tracked
        self._too_short_logged = False

    def job_lease(self, launch: Launch, now: float) -> JobLease | None:
        """A new Job's lease terms (None: its workload is not fenced); its first deadline is
        None while the hub was never heard, or its lease is too short for a Job to carry."""
        if not launch.spec.fenced:
            return None
        fence = self._guard.read()
        deadline, after = fence.deadline(), fence.fence_after_s
        seconds = None
        if deadline is not None and after is not None and after >= MIN_FENCE_AFTER_S:
            seconds = active_deadline(deadline, now, launch.spec.max_runtime_s)
        return JobLease(seconds, math.ceil(self._guard.stop_grace_s))

    async def run(self) -> None:
        """Every CHECK_S, until cancelled."""
        limit = asyncio.Semaphore(CONCURRENT_PATCHES)
        while True:
            await asyncio.sleep(CHECK_S)
            due = self._due(time.time())
            await asyncio.gather(*(self._set(tracked, seconds, limit) for tracked, seconds in due))

    def _due(self, now: float) -> list[tuple[Tracked, int | None]]:
        """The fenced Jobs whose deadline must change, and to what (None: none), soonest
        ending first."""
        fenced = [t for t in self._tracked() if t.fenced and not t.done and not t.stopping]
        if not fenced:
            return []
        fence = self._guard.read()
        deadline, after = fence.deadline(), fence.fence_after_s
        if deadline is None or after is None:
            return []  # the hub was never heard: nothing to fence yet
        due: list[tuple[float, Tracked, int | None]] = []
        for tracked in fenced:
            if tracked.started_at is None:
                tracked.started_at = now  # it started before now: its deadline comes early
            ends = tracked.started_at + (tracked.deadline_s or math.inf)
            if after < MIN_FENCE_AFTER_S:
                # Whole seconds checked every second cannot follow so short a lease: the Job
                # would end while the hub is heard. The spoke applies it while it lives.
                self._log_too_short(after)
                if tracked.deadline_s != tracked.max_runtime_s:
                    due.append((ends, tracked, tracked.max_runtime_s))
                continue
            seconds = renewed(
                tracked.deadline_s, tracked.started_at, deadline, tracked.max_runtime_s, now,
                after / 2,
            )  # fmt: skip
            if seconds is not None:
                due.append((ends, tracked, seconds))
        due.sort(key=lambda item: item[0])
        return [(tracked, seconds) for _, tracked, seconds in due]

    async def _set(self, tracked: Tracked, seconds: int | None, limit: asyncio.Semaphore) -> None:
        async with limit:
            try:
                await self._jobs.set_deadline(tracked, seconds)
            except SpokeError as exc:  # it keeps the deadline before: it stops early
                log.warning("job_deadline_not_set", workload=tracked.workload_id, error=str(exc))
                return
            tracked.deadline_s = seconds

    def _log_too_short(self, after: float) -> None:
        if not self._too_short_logged:
            self._too_short_logged = True
            log.warning(
                "kubernetes_lease_too_short",
                fence_after_s=after,
                least_s=MIN_FENCE_AFTER_S,
                detail="fenced Jobs carry no lease: they run on if this spoke stays dead",
            )
