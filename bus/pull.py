"""A durable pull consumer's messages as they arrive, through one callback subscription.

nats-py's `PullSubscription.fetch` sends a request per fetch, and waits for each message of it
with a task and a timer of its own (`next_msg`); a consumer that keeps up with a steady stream
paid that per message, and a request and its "no messages" status per fetch. Here one pull
request stays open (up to `batch` messages, for `expires_s`) and the server pushes what
arrives onto our inbox, where a callback collects it: `take()` returns what has arrived, in
stream order, and opens the next request whenever the last one is done (filled, expired, or
given up for lost a second after it should have expired: a reconnect drops it).

Every message the server delivers reaches the buffer, whichever request it answers (one given
up for lost included), so none is left unhandled; one that is not acked comes back after the
consumer's ack wait, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from bus.natsclient import Client

#: How long one pull request stays open at the server for messages to come.
PULL_EXPIRES_S = 1.0
#: Status of a message that only says something about a pull request (nats-server).
_HEARTBEAT = "100"
_NO_RESPONDERS = "503"


class ConsumerGone(nats.errors.Error):
    """The consumer does not answer pull requests (deleted, or JetStream is away)."""


class Puller:
    """Pull requests to `stream`'s durable consumer `durable`, one open at a time."""

    def __init__(
        self, nc: Client, stream: str, durable: str, *, batch: int, expires_s: float
    ) -> None:
        self._nc = nc
        self._next = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._batch = batch
        self._expires_s = expires_s
        self._inbox = nc.new_inbox()
        self._ids = itertools.count(1)
        self._open = ""  # reply subject of the open request; "" when none is open
        self._left = 0  # messages the open request may still bring
        self._deadline = 0.0  # when the open request is given up for lost (loop time)
        self._arrived: list[Msg] = []
        self._wake = asyncio.Event()
        self._gone = False
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    async def take(self, limit: int, timeout_s: float) -> list[Msg]:
        """What has arrived (the first `limit`), waiting up to `timeout_s` for the first; []
        if nothing came.

        Raises ConsumerGone when a request found no consumer to answer it.
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        while not self._arrived:
            if self._gone:
                self._gone = False
                raise ConsumerGone("no responders for the pull request")
            now = loop.time()
            if self._open and now > self._deadline:
                self._open = ""  # lost (a reconnect drops a waiting request): ask again
            if not self._open:
                await self._request(now)
            if now >= until:
                return []
            self._wake.clear()
            if self._arrived or self._gone:
                continue
            with contextlib.suppress(TimeoutError):  # (asyncio.timeout: no task per wait)
                async with asyncio.timeout(min(until, self._deadline) - now):
                    await self._wake.wait()
        msgs, self._arrived = self._arrived[:limit], self._arrived[limit:]
        return msgs

    async def _request(self, now: float) -> None:
        reply = f"{self._inbox}.{next(self._ids)}"
        expires_ns = int(self._expires_s * 1e9)
        body = json.dumps({"batch": self._batch, "expires": expires_ns}).encode()
        self._open, self._left = reply, self._batch
        self._deadline = now + self._expires_s + 1.0  # its 408 is a second late at most
        await self._nc.publish(self._next, body, reply=reply)

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get("Status") if headers and not msg.data else None
        if status is None:
            # A message keeps its stream subject: which request it answers does not show. Each
            # counts against the open one (one of a request given up only makes the next come
            # sooner); a filled request gets no status, so the count is what closes it.
            self._arrived.append(msg)
            self._left -= 1
            if self._left <= 0:
                self._open = ""
            self._wake.set()
            return
        if status == _HEARTBEAT or msg.subject != self._open:
            return  # about a request given up already
        self._open = ""  # 404/408: nothing more comes on it; 409: the consumer changed
        if status == _NO_RESPONDERS:
            self._gone = True
        self._wake.set()


async def open_puller(
    js: JetStreamContext,
    nc: Client,
    stream: str,
    filter_subject: str,
    config: ConsumerConfig,
    batch: int,
    expires_s: float,
) -> Puller:
    """A `Puller` of the durable consumer `config.durable_name`, created first if it does not
    exist (nats-py's `pull_subscribe` looks it up, and creates it with `config` where it is
    missing: the same requests as before, which a spoke's permissions allow)."""
    durable = config.durable_name or ""
    sub = await js.pull_subscribe(filter_subject, durable=durable, stream=stream, config=config)
    with contextlib.suppress(Exception):
        await sub.unsubscribe()  # its inbox: the puller has its own
    puller = Puller(nc, stream, durable, batch=batch, expires_s=expires_s)
    await puller.start()
    return puller
