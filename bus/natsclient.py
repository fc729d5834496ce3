"""nats-py's client with a `flush()` that waits for what was sent before it.

nats-py 2.16's `Client.flush()` writes its PING straight to the socket, while the SUB, UNSUB and
PUB commands sent before it still wait in the client's pending buffer for its flusher task. The
server reads the PING first whenever the two writes arrive apart (a loaded machine), answers it,
and `flush()` returns before the server has seen a subscription made just before: a request from
another connection then finds no responder, a message no subscriber. Here the PING is queued
behind those commands (nats-py's Tornado client fixed the same bug that way), so a returned
`flush()` means the server has processed everything this client sent before it.

It can also hold its reads for a moment (`hold_reads`): the hub, under load, reads what arrived
once a scheduling cycle, just before the cycle, rather than whenever a message comes.

Every gpufed connection goes through `connect()` below.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from nats import errors
from nats.aio.client import PING_PROTO
from nats.aio.client import Client as _NatsClient
from nats.aio.msg import Msg
from nats.protocol.parser import Parser

#: What a subject may not hold: the protocol's separators (nats-py checks as much on publish).
_UNSAFE = re.compile(r"[ \t\r\n]")


class Client(_NatsClient):
    """A nats-py client whose PINGs (`flush()`, `rtt()`, keep-alives) follow pending commands,
    and whose reads can be held (`hold_reads`)."""

    _read_hold = 0.0  # loop time before which no read follows the one under way

    def __init__(self) -> None:
        super().__init__()
        self._ps = _HoldingParser(self)

    def hold_reads(self, until: float) -> None:
        """Read nothing from the server before loop time `until`, once the read under way (or
        the next one, if none is) is handled.

        What arrives meanwhile waits in the socket: the process is not woken for it, and the
        next read takes it all at once. Each wake-up of a busy process costs far more than
        the few messages it handles (cold caches), so a hub that reads a cycle's submissions,
        events and acks in one go spends less per message. Anything that waits on a reply
        (a flush, a request, a publish's ack) may wait until then too.
        """
        self._read_hold = until

    async def _hold(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sleep until the hold ends, the socket not read meanwhile (so nothing wakes us)."""
        writer = getattr(self._transport, "_io_writer", None)  # TCP or TLS, not WebSocket
        transport = writer.transport if writer is not None else None
        if transport is not None and transport.is_reading():
            transport.pause_reading()
        else:
            transport = None  # paused already (the stream reader's buffer is full): left to it
        try:
            await asyncio.sleep(self._read_hold - loop.time())
        finally:
            if transport is not None and not transport.is_closing():
                transport.resume_reading()

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        if not self.is_connected:
            # nats-py's own: a PING queued now would be replayed after a reconnect, its PONG
            # taken for a later flush's (nats-py drops the futures of a lost connection).
            await super()._send_ping(future)
            return
        if future is None:
            future = asyncio.get_running_loop().create_future()
        self._pongs.append(future)
        await self._send_command(PING_PROTO)  # behind the SUB/PUB still pending, in order
        await self._flush_pending()

    async def publish_batch(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Publish (subject, payload) pairs, queued as one command: a fetched batch's acks or a
        batch of replies cost one buffer append, not a `publish()` each.

        Like `publish()` it raises when the client is closed, and buffers (or raises when the
        buffer is full) while it reconnects; a subject with whitespace in it is refused before
        anything is queued.
        """
        if not messages:
            return
        if self.is_closed:
            raise errors.ConnectionClosedError
        if self.is_draining_pubs:
            raise errors.ConnectionDrainingError
        parts: list[bytes] = []
        size = 0
        for subject, payload in messages:
            if not subject or _UNSAFE.search(subject):
                raise errors.BadSubjectError
            if len(payload) > self._max_payload:
                raise errors.MaxPayloadError
            parts.append(b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
            size += len(payload)
        command = b"".join(parts)
        if not self.is_connected and (
            self._max_pending_size <= 0
            or len(command) + self._pending_data_size > self._max_pending_size
        ):
            raise errors.OutboundBufferLimitError
        self.stats["out_msgs"] += len(messages)
        self.stats["out_bytes"] += size
        await self._send_command(command)
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()


class _HoldingParser(Parser):
    """nats-py's parser, which nats-py's read loop awaits after each read: once the read is
    handled, it holds the loop while its client's reads are held (`Client.hold_reads`)."""

    async def parse(self, data: bytes = b"") -> None:
        await super().parse(data)
        loop = asyncio.get_running_loop()
        if self.nc._read_hold > loop.time():
            await self.nc._hold(loop)


async def connect(servers: str | list[str], **options: Any) -> Client:
    """`nats.connect()` with our `Client`: same options, same errors."""
    client = Client()
    await client.connect(servers, **options)
    return client


#: The status header value of the server's "no responders" reply.
NO_RESPONDERS_STATUS = "503"


def no_responders(msg: Msg) -> bool:
    """Whether `msg` is the server's "no responders" status (503) for a request with nobody
    subscribed, rather than a reply; a plain publish with a reply subject gets one too."""
    headers = msg.headers
    return headers is not None and headers.get("Status") == NO_RESPONDERS_STATUS
