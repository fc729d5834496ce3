"""Spokes' records reach the store behind their capacity reports, never in their way.

A report renews its spoke's lease only if its ack goes out at once, and NATS hands one
subscription's messages over one at a time: a report that waited for the store (on its one
thread, behind every other write) held every spoke's ack behind it, and a store that stalled
(PostgreSQL failing over, a lock held, a slow disk) for fence_after had every spoke stop its
movable work. The record written here (joined, last seen, last report) serves only a hub that
starts or takes over, and a standby's reads: it may be a few seconds late.

A spoke's record is due when it joins and then every PERSIST_EVERY_S; the newest record of each
spoke waits here until one task writes all those due in one transaction. A failed write is
logged (one line per write), and the spoke's next due record tries again.
"""

from __future__ import annotations

import asyncio

import structlog

from hub.records import SpokeRecord
from hub.state import HubState

log = structlog.get_logger(__name__)

#: How often a spoke's record is written (its heartbeats come every few seconds).
PERSIST_EVERY_S = 10.0


class SpokeRecords:
    """Writes spokes' records in the background, the newest of each, at most every
    PERSIST_EVERY_S per spoke."""

    def __init__(self, state: HubState) -> None:
        self.state = state
        self._written_at: dict[str, float] = {}
        self._due: dict[str, SpokeRecord] = {}
        self._writer: asyncio.Task[None] | None = None

    def heard(self, spoke: SpokeRecord, now: float, *, joined: bool) -> None:
        """`spoke` was heard at `now` (`joined`: for the first time since this hub started)."""
        if not joined and now - self._written_at.get(spoke.id, float("-inf")) < PERSIST_EVERY_S:
            return
        self._written_at[spoke.id] = now
        self._due[spoke.id] = spoke.model_copy()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_due(), name="hub-spoke-records")

    async def _write_due(self) -> None:
        while self._due:
            due, self._due = list(self._due.values()), {}
            try:
                await self.state.db(self.state.store.save_spokes, due)
            except Exception as exc:
                log.warning("spoke_records_not_saved", spokes=len(due), error=str(exc)[:300])

    def close(self) -> None:
        """Stop writing (the hub stops): what is still due is left to the next hub's reports."""
        if self._writer is not None:
            self._writer.cancel()
