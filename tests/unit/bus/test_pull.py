"""A durable consumer's open pull request: what it delivers is handed over in order, and a
request the server has filled is followed by the next at once (a filled request gets no
status: only the count of what came closes it)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

from nats.aio.msg import Msg

from bus.natsclient import Client
from bus.pull import ConsumerGone, Puller


class FakeClient:
    """Records the pull requests; the test plays the server through `deliver`."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any], str]] = []
        self.cb: Callable[[Msg], Awaitable[None]] | None = None

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]]) -> object:
        assert subject == "_INBOX.test.*"
        self.cb = cb
        return object()

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.requests.append((subject, json.loads(payload), reply))

    async def deliver(self, data: bytes, subject: str = "gpufed.v1.spoke.eu-1.events") -> None:
        assert self.cb is not None
        await self.cb(Msg(cast(Any, self), subject=subject, data=data))

    async def status(self, code: str, reply: str) -> None:
        assert self.cb is not None
        await self.cb(Msg(cast(Any, self), subject=reply, headers={"Status": code}))


async def started(batch: int = 3) -> tuple[FakeClient, Puller]:
    nc = FakeClient()
    puller = Puller(cast(Client, nc), "GPUFED_EVENTS", "hub", batch=batch, expires_s=1.0)
    await puller.start()
    return nc, puller


async def test_a_filled_request_is_followed_by_the_next_at_once() -> None:
    nc, puller = await started(batch=3)
    assert await puller.take(3, timeout_s=0.0) == []
    [(subject, body, _)] = nc.requests
    assert subject == "$JS.API.CONSUMER.MSG.NEXT.GPUFED_EVENTS.hub"
    assert body["batch"] == 3
    for data in (b"1", b"2", b"3"):
        await nc.deliver(data)  # on the stream's subject, not the request's inbox
    assert [m.data for m in await puller.take(3, timeout_s=0.0)] == [b"1", b"2", b"3"]

    assert await puller.take(3, timeout_s=0.0) == []
    assert len(nc.requests) == 2


async def test_what_arrives_is_handed_over_in_order_up_to_the_limit() -> None:
    nc, puller = await started(batch=10)
    await puller.take(10, timeout_s=0.0)
    for i in range(5):
        await nc.deliver(str(i).encode())
    assert [m.data for m in await puller.take(2, timeout_s=0.0)] == [b"0", b"1"]
    assert [m.data for m in await puller.take(10, timeout_s=0.0)] == [b"2", b"3", b"4"]
    assert len(nc.requests) == 1  # still open: 5 of its 10 came


async def test_an_expired_request_is_replaced_and_a_stale_status_ignored() -> None:
    nc, puller = await started()
    await puller.take(3, timeout_s=0.0)
    first = nc.requests[0][2]
    await nc.status("408", first)  # it expired with nothing to deliver
    await puller.take(3, timeout_s=0.0)
    second = nc.requests[1][2]
    assert second != first
    await nc.status("408", first)  # a repeat about the old one changes nothing
    await nc.deliver(b"x")
    assert [m.data for m in await puller.take(3, timeout_s=0.0)] == [b"x"]
    assert len(nc.requests) == 2


async def test_a_request_no_consumer_answers_raises() -> None:
    nc, puller = await started()
    await puller.take(3, timeout_s=0.0)
    await nc.status("503", nc.requests[0][2])
    try:
        await puller.take(3, timeout_s=0.0)
    except ConsumerGone:
        return
    raise AssertionError("no ConsumerGone")
