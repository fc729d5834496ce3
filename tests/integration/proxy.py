"""A TCP proxy on a free loopback port that a test can cut and restore (a WAN partition)."""

from __future__ import annotations

import asyncio
import contextlib

from bus.ports import free_port


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()  # one per connection, until it ends

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def is_cut(self) -> bool:
        """Whether it refuses connections now (before start(), or after cut())."""
        return self._server is None

    @property
    def connections(self) -> int:
        """How many connections it relays, or is still connecting to the target."""
        return len(self._handlers)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Drop every connection at once (nothing still buffered is sent) and refuse new ones
        until restore(); a connection still reaching the target as the cut came is dropped
        once it does."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def restore(self) -> None:
        await self.start()

    async def close(self) -> None:
        """Cut, and return once every connection's handler has ended."""
        await self.cut()
        if self._handlers:
            await asyncio.wait(list(self._handlers))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server = self._server
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        if self._server is not server or server is None:  # cut while it connected
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()  # the other side ended: what it sent before still goes
