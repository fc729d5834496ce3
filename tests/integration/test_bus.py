"""Our NATS surface against a real nats-server: a durable consumer must never stop for good."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import structlog
import uvloop
from nats.aio.msg import Msg

from bus import natsclient
from bus.client import Bus, BusSettings
from bus.natsserver import EmbeddedNats
from bus.tls import client_context, ensure_local_ca
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


async def test_flush_returns_once_the_server_has_read_what_was_sent_before_it(
    tmp_path: Path,
) -> None:
    """A subscription made before flush() is in place when flush() returns. nats-py's own
    flush() wrote its PING ahead of the SUB still buffered, so on a loaded machine the server
    answered it first and another connection's request found no responder."""
    server = EmbeddedNats(tmp_path / "nats", trace=True).start()
    try:
        bus = Bus(BusSettings(url=server.url, name="responder"))
        await bus.connect()

        async def answer(msg: Msg) -> None:
            await msg.respond(b"here")

        await bus.nc.subscribe("flush.order", cb=answer)
        await bus.nc.flush()
        read_before_pong = re.findall(r"<<- \[(SUB|PING)", server.log_file.read_text())
        asker = await natsclient.connect(server.url)
        reply = await asker.request("flush.order", b"?", timeout=5)
        await asker.close()
        await bus.close()
    finally:
        server.stop()

    # The server read the SUB, then the flush's PING (after the connect's own PING).
    assert read_before_pong == ["PING", "SUB", "PING"]
    assert reply.data == b"here"


async def test_many_durable_publishes_are_stored_once_each_in_order_and_acked_in_one_write(
    nats_server: EmbeddedNats,
) -> None:
    """A cycle's commands go out together: each stored once, in order, a repeat of an id
    dropped; a fetched batch acked with one write is not delivered again."""
    bus = Bus(BusSettings(url=nats_server.url, name="test"))
    await bus.connect()
    await bus.ensure_streams()
    subject = subjects.commands("eu-1")
    try:
        first = await bus.publish_durable_many(
            [(subject, f"c{i}".encode(), f"id-{i}") for i in range(5)]
        )
        again = await bus.publish_durable_many([(subject, b"c2 again", "id-2")])
        assert not any(a.duplicate for a in first)
        assert [a.seq for a in first] == sorted(a.seq for a in first)
        assert again[0].duplicate and again[0].seq == first[2].seq

        got: list[bytes] = []

        async def handle(msgs: list[Msg]) -> None:
            got.extend(m.data for m in msgs)
            await bus.ack(msgs)

        stop = asyncio.Event()
        task = asyncio.create_task(
            bus.consume_batches(
                subjects.COMMANDS_STREAM, "batch-acks", subject, handle, stop, ack_wait_s=1.0
            )
        )
        await wait_until(lambda: len(got) == 5)
        await wait_until(
            lambda: _acked(bus, "batch-acks"), what="the consumer to have no ack pending"
        )
        stop.set()
        await task
        assert got == [f"c{i}".encode() for i in range(5)]
    finally:
        await bus.close()


async def _acked(bus: Bus, durable: str) -> bool:
    info = await bus.js.consumer_info(subjects.COMMANDS_STREAM, durable)
    return info.num_ack_pending == 0 and info.num_redelivered == 0


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_held_reads_deliver_nothing_until_the_hold_ends_then_everything_in_order(
    tmp_path: Path, tls: bool, loop: str
) -> None:
    """The hub holds its reads while it waits for its next cycle: what comes meanwhile is
    delivered once the hold ends, all of it, in order, and nothing is lost. On both loops
    (the hub runs on uvloop), over plain TCP and TLS."""
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_held_reads(tmp_path, tls))


async def _held_reads(tmp_path: Path, tls: bool) -> None:
    files = ensure_local_ca(tmp_path / "tls") if tls else None
    server = EmbeddedNats(tmp_path / "nats", tls=files).start()
    options = {"tls": client_context(files.ca_file)} if files is not None else {}
    try:
        receiver = await natsclient.connect(server.url, **options)
        sender = await natsclient.connect(server.url, **options)
        loop = asyncio.get_running_loop()
        got: list[tuple[float, bytes]] = []

        async def on_msg(msg: Msg) -> None:
            got.append((loop.time(), msg.data))

        await receiver.subscribe("held", cb=on_msg)
        await receiver.flush()
        until = loop.time() + 1.0
        receiver.hold_reads(until)
        await sender.publish("held", b"first")  # read: the hold follows the read under way
        await sender.flush()
        await wait_until(lambda: len(got) == 1)
        for i in range(200):
            await sender.publish("held", b"%d" % i)
        await sender.flush()  # the server has them, and sends them on at once
        await asyncio.sleep(0.5)
        assert [data for _, data in got] == [b"first"]  # none read during the hold

        await wait_until(lambda: len(got) == 201, timeout=10)
        assert [data for _, data in got[1:]] == [b"%d" % i for i in range(200)]
        assert min(at for at, _ in got[1:]) >= until - 0.002  # the loop's timers step by 1 ms
        await receiver.close()
        await sender.close()
    finally:
        server.stop()


async def test_a_refused_client_says_so_once_per_error_not_twice_a_second(
    secure_nats: EmbeddedNats,
) -> None:
    """A spoke or hub given a wrong credential retries for ever (nats-py, every 0.5 s); its
    log says each error once, then every 30 s with how many it held back, not 172,800 lines a
    day."""
    bus = Bus(BusSettings(url=secure_nats.url, name="refused", token="wrong"))
    with structlog.testing.capture_logs() as logs:
        connecting = asyncio.create_task(bus.connect())
        try:
            await wait_until(lambda: bus.error_lines.held >= 4, 30, "four refusals held back")
        finally:
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
            await bus.close()
    said = [e["error"] for e in logs if e["event"] == "nats_error"]
    assert "nats: 'Authorization Violation'" in said
    assert len(said) == len(set(said)), said  # each text once
    assert not bus.connected.is_set()
