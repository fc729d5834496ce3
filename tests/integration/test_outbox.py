"""The spoke's event outbox against a real nats-server: what it owes reaches the stream once
each, in order, and what the server refuses is published again until it is stored."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bus.client import Bus, BusSettings
from bus.natsserver import EmbeddedNats
from schemas import EventPhase, WorkloadEvent, parse_events, subjects
from spoke.journal import Journal
from spoke.outbox import Outbox, drain, publish_outbox
from tests.support.wait import wait_until


def _event(n: int) -> WorkloadEvent:
    return WorkloadEvent(
        event_id=f"eu-1-w{n}-e1-running",
        spoke_id="eu-1",
        workload_id=f"w{n}",
        epoch=1,
        phase=EventPhase.RUNNING,
        at=1_700_000_000.0 + n,
    )


def _owe(journal: Journal, outbox: Outbox, count: int) -> list[WorkloadEvent]:
    events = [_event(n) for n in range(count)]
    for event in events:
        payload = journal.queue_event(event)
        assert payload is not None
        outbox.put_nowait((event.event_id, payload))
    return events


async def _stored(bus: Bus, count: int) -> list[str]:
    """The ids of the events the stream holds, in order; each message holds one or several."""
    info = await bus.js.stream_info(subjects.EVENTS_STREAM)
    first = info.state.first_seq
    stored = [
        event.event_id
        for seq in range(first, first + info.state.messages)
        for event in parse_events((await bus.js.get_msg(subjects.EVENTS_STREAM, seq)).data or b"")
    ]
    assert len(stored) == count  # each once, whatever was published again
    return stored


async def test_events_reach_the_stream_once_each_in_order_and_are_noted_delivered(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    bus = Bus(BusSettings(url=nats_server.url, name="spoke"))
    await bus.connect()
    await bus.ensure_streams()
    journal = Journal(tmp_path / "journal.jsonl")
    outbox: Outbox = asyncio.Queue()
    events = _owe(journal, outbox, 600)  # more than two batches
    task = asyncio.create_task(publish_outbox(bus, journal, outbox, subjects.events("eu-1")))
    try:
        await drain(outbox, within_s=30)
        assert not journal.state.outbox
        assert await _stored(bus, 600) == [e.event_id for e in events]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        journal.close()
        await bus.close()


async def test_events_owed_before_the_stream_exists_are_stored_once_it_does(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    bus = Bus(BusSettings(url=nats_server.url, name="spoke", publish_timeout_s=0.5))
    await bus.connect()
    journal = Journal(tmp_path / "journal.jsonl")
    outbox: Outbox = asyncio.Queue()
    events = _owe(journal, outbox, 300)
    task = asyncio.create_task(publish_outbox(bus, journal, outbox, subjects.events("eu-1")))
    try:
        await asyncio.sleep(0.5)  # no stream yet: every publish meets "no responders"
        assert len(journal.state.outbox) == 300  # nothing counted as delivered
        await bus.ensure_streams()
        await drain(outbox, within_s=30)
        await wait_until(lambda: not journal.state.outbox, what="every event delivered")
        # (The stream may come into being while a batch is on its way, so a retried event
        # can land after later ones of its batch: its order is not checked here.)
        assert sorted(await _stored(bus, 300)) == sorted(e.event_id for e in events)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        journal.close()
        await bus.close()
