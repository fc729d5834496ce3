"""The spoke's event outbox: events go to JetStream in order, each until it is stored."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from bus.client import Bus
from spoke.journal import Journal

log = structlog.get_logger(__name__)

#: Most events published together (pipelined: all sent, then all acks awaited).
OUTBOX_BATCH = 256

#: (event id, JSON) of each event owed to the hub, in the order they happened.
Outbox = asyncio.Queue[tuple[str, bytes]]


async def publish_outbox(bus: Bus, journal: Journal, outbox: Outbox, subject: str) -> None:
    """Publish `outbox`'s events to `subject` for ever; never ends on an error.

    One publisher keeps events in order. What has queued up goes out together: every publish
    of a batch is written before any ack is awaited (pipelined), each is retried under its own
    Nats-Msg-Id until JetStream has it, and the journal notes them delivered once all are acked.
    A loop that died would leave the hub deaf to this spoke while everything looked healthy: a
    batch the server refuses is retried slowly (the same ids: nothing is stored twice).
    """
    while True:
        batch = [await outbox.get()]
        while len(batch) < OUTBOX_BATCH and not outbox.empty():
            batch.append(outbox.get_nowait())
        journal.flush()  # what the hub hears of is on disk first
        while True:
            try:
                await asyncio.gather(
                    *(bus.publish_durable(subject, payload, eid) for eid, payload in batch)
                )
                break
            except Exception as exc:  # a refusal: retried slowly, the order kept
                log.error("event_publish_refused", events=len(batch), error=str(exc))
                await asyncio.sleep(5.0)
        for event_id, _ in batch:
            journal.delivered(event_id)
            outbox.task_done()


async def drain(outbox: Outbox, within_s: float) -> None:
    """Wait up to `within_s` for every queued event to be delivered."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(outbox.join(), within_s)
