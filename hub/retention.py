"""Ended workloads leave the hub's store once they have been kept `keep_ended_s`.

A workload with its attempts and their indexes takes about 2 KB of the store: a hub that kept
every one placing 400 a second would grow its database by some 3 GB an hour until its disk was
full. The leader removes, every `sweep_ended_every_s`, the workloads that
ended more than `keep_ended_s` ago (default 90 days) with their attempts, the longest ended
first, `REMOVE_BATCH` to a transaction so the saves queued behind it on the store thread wait
for one short transaction at most. What it removes is gone from `GET /v1/workloads` and from
usage reports: they reach back as far as workloads are kept. Live workloads are never touched.
"""

from __future__ import annotations

import asyncio

import structlog

from bus.durable import describe
from bus.tasks import pause
from hub.state import HubState

log = structlog.get_logger(__name__)

#: Workloads removed in one transaction, and the pause after each full batch: a store with
#: millions past their keep (the first start after an upgrade, a shorter `--keep-ended`) is
#: emptied in the background at up to 4,000 a second, ten times what a hub placing 400 a
#: second ends, and a save queued behind a batch on the store thread waits for one short
#: transaction (`bench/store_retention.py`: 4 ms on SQLite, 22 ms on PostgreSQL).
REMOVE_BATCH = 200
PAUSE_S = 0.05
#: A long removal says how far it got this often (s).
PROGRESS_EVERY_S = 60.0


def not_found(workload_id: str, keep_ended_s: float) -> str:
    """What a request for a workload the store does not hold is told: it may have ended
    longer ago than workloads are kept."""
    days = keep_ended_s / 86400
    kept = f"{days:g} days" if days >= 1 else f"{keep_ended_s:g} s"
    return f"no workload {workload_id} (an ended workload is kept {kept})"


def removable_before(now: float, keep_ended_s: float) -> float:
    """Workloads that ended before this time are past their keep."""
    return now - keep_ended_s


async def remove_ended(state: HubState, batch: int = REMOVE_BATCH, pause_s: float = PAUSE_S) -> int:
    """Remove every workload past its keep now (`keep_ended_s`), `batch` to a transaction on
    the store thread with `pause_s` after each full one; return how many went (counted in
    `gpufed_workloads_removed_total` as they go)."""
    told = state.clock()  # when progress was last logged
    before = removable_before(told, state.settings.keep_ended_s)
    removed = 0
    while True:
        count = await state.db(state.store.remove_finished, before, batch)
        removed += count
        state.metrics.removed.inc(count)
        if count < batch:
            return removed
        now = state.clock()
        if now - told >= PROGRESS_EVERY_S:
            log.info("ended_workloads_removing", removed=removed, ended_before=before)
            told = now
        await asyncio.sleep(pause_s)


async def sweep_ended(state: HubState, stop: asyncio.Event) -> None:
    """Until `stop`: remove what is past its keep, then wait `sweep_ended_every_s` (a task
    of the leader). A sweep that fails (the database unreachable, say) is logged, and the
    next one tries again."""
    while not stop.is_set():
        try:
            removed = await remove_ended(state)
        except Exception as exc:  # the next sweep tries again; the hub goes on
            log.warning("ended_workloads_sweep_failed", error=describe(exc))
        else:
            if removed:
                log.info("ended_workloads_removed", count=removed)
        await pause(stop, state.settings.sweep_ended_every_s)
