"""Our NATS surface against a real nats-server: a durable consumer must never stop for good."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from bus.client import Bus, BusSettings
from bus.natsserver import EmbeddedNats
from schemas import subjects
from tests.support.wait import wait_until


async def test_consumer_whose_server_side_vanished_comes_back_and_delivers(
    nats_server: EmbeddedNats,
) -> None:
    # A pull that meets no consumer gets "503 no responders": a nats-server stops JetStream
    # before it closes client connections, so every shutdown opens that window. The consume
    # loop once died on it silently, and the hub then never heard another event.
    bus = Bus(BusSettings(url=nats_server.url, name="test"))
    await bus.connect()
    await bus.ensure_streams()
    got: list[bytes] = []

    async def handle(msg: Msg) -> None:
        got.append(msg.data)
        await msg.ack()

    stop = asyncio.Event()
    subject = subjects.events("eu-1")
    task = asyncio.create_task(
        bus.consume(subjects.EVENTS_STREAM, "test-consumer", subject, handle, stop)
    )
    try:
        await bus.publish_durable(subject, b"before", "m1")
        await wait_until(lambda: got == [b"before"])
        await bus.js.delete_consumer(subjects.EVENTS_STREAM, "test-consumer")
        await asyncio.sleep(1.5)  # pulls now meet no consumer
        await bus.publish_durable(subject, b"after", "m2")
        await wait_until(lambda: got[-1:] == [b"after"], timeout=15)
        assert not task.done()
    finally:
        stop.set()
        await task
        await bus.close()
