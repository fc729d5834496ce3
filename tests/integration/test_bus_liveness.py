"""A durable consumer outlives a server too slow to create it (as under heavy load)."""

from __future__ import annotations

import asyncio
import os
import signal

import structlog
from nats.aio.msg import Msg

from bus.client import Bus, BusSettings
from bus.natsserver import EmbeddedNats
from bus.tasks import supervise
from schemas import subjects
from tests.support.wait import wait_until


async def test_consumer_whose_creation_times_out_keeps_trying_and_delivers(
    nats_server: EmbeddedNats,
) -> None:
    # Under load nats-server can answer the consumer lookup later than the request timeout.
    # consume() once let that TimeoutError end its task before the first pull; the hub's event
    # consumer died so at start and the hub never heard a spoke's events (its work stuck in
    # `placed` while the spoke ran it). A stopped server makes the slow answer certain.
    bus = Bus(BusSettings(url=nats_server.url, name="test", publish_timeout_s=0.5))
    await bus.connect()
    await bus.ensure_streams()
    got: list[bytes] = []

    async def handle(msg: Msg) -> None:
        got.append(msg.data)
        await msg.ack()

    stop = asyncio.Event()
    subject = subjects.events("eu-1")
    assert nats_server.pid is not None
    os.kill(nats_server.pid, signal.SIGSTOP)
    try:
        with structlog.testing.capture_logs() as logs:
            task = supervise(
                bus.consume(subjects.EVENTS_STREAM, "test-consumer", subject, handle, stop),
                "test-consumer",
            )
            await wait_until(
                lambda: any(e["event"] == "consumer_subscribe_retry" for e in logs),
                what="a consumer creation to time out",
            )
    finally:
        os.kill(nats_server.pid, signal.SIGCONT)
    try:
        await bus.publish_durable(subject, b"after", "m1")
        await wait_until(lambda: got == [b"after"], timeout=15, what="the event to be handled")
        assert not task.done()
    finally:
        stop.set()
        await task
        await bus.close()
