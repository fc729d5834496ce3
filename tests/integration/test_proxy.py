"""The tests' cuttable link (tests/integration/proxy.py) cuts every connection, even one it is
still making: a partition that lets a connection through tests nothing."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from tests.integration.proxy import CuttableProxy
from tests.support.wait import wait_until


def _first_bytes(target: socket.socket) -> bytes:
    """What the first connection the target accepts sends in its first seconds (b"": none, or
    no connection came)."""
    target.settimeout(5)
    try:
        conn, _ = target.accept()
    except TimeoutError:
        return b""
    with conn:
        conn.settimeout(3)
        try:
            return conn.recv(100)
        except (TimeoutError, ConnectionError):
            return b""


async def test_a_connection_still_being_made_when_the_link_is_cut_is_dropped() -> None:
    # A target whose accept queue is full: the kernel drops the proxy's SYN and the proxy's
    # connect waits for its retransmit (about a second), so the cut comes while it connects.
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(0)
    filler = socket.create_connection(target.getsockname())
    proxy = CuttableProxy(*target.getsockname())
    await proxy.start()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        await wait_until(lambda: proxy.connections == 1, 5, "the proxy to take the connection")
        await proxy.cut()
        writer.write(b"sent across the cut")
        await writer.drain()
        queued, _ = target.accept()  # the filler: room for the proxy's connect again
        queued.close()
        assert await asyncio.to_thread(_first_bytes, target) == b""
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(100), 5) == b""  # dropped, not held
        await proxy.close()
        assert proxy.connections == 0
    finally:
        await proxy.close()
        if writer is not None:
            writer.close()
        filler.close()
        target.close()
