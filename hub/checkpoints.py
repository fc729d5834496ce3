"""The hub's task that checkpoints its SQLite store's log beside the writer (`hub.engine`):
the cycle's commits then never wait for a checkpoint's disk syncs."""

from __future__ import annotations

import asyncio

import structlog

from bus.durable import describe
from bus.tasks import pause
from hub.engine import CHECKPOINT_EVERY_S
from hub.state import HubState

log = structlog.get_logger(__name__)


async def checkpoints(state: HubState, stop: asyncio.Event) -> None:
    """Until `stop`: checkpoint, then wait `CHECKPOINT_EVERY_S`; ends at once on a database
    that needs none. A failure is logged once until a checkpoint succeeds again: meanwhile a
    commit past `hub.engine.AUTO_CHECKPOINT_PAGES` checkpoints as SQLite always did."""
    failing = False
    while not stop.is_set():
        try:
            done = await asyncio.to_thread(state.store.checkpoint)
        except Exception as exc:
            if not failing:
                log.warning("store_checkpoint_failed", error=describe(exc))
            failing = True
        else:
            if done is None:
                return
            if failing:
                log.info("store_checkpoint_recovered", pages=done[0], copied=done[1])
            failing = False
        await pause(stop, CHECKPOINT_EVERY_S)
