"""A TCP relay in front of a session's or service's port that notes when it last carried bytes.

The local runtime gives a workload a private port on 127.0.0.1 ($GPUFED_PORT) and exposes it
through one of these on the spoke's expose host: clients connect to the relay's port (the URL
reported to the hub), every chunk either way moves `last_activity`, and idle culling reads it.
It costs one asyncio server per workload and a copy per chunk; nothing is parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

#: Bytes read per chunk.
CHUNK = 64 * 1024
#: What the URLs' host name (`--expose-url-host`) may hold in braces: the workload's id.
ID_PLACEHOLDER = "{id}"
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_SAMPLE_ID = "w19aed7f3b10" + "0123456789ab"  # as long as the hub's ids (hub.ids)


def checked_url_host(url_host: str) -> str:
    """`url_host` if it is a fixed host (name or address), or a host name that holds
    `{id}` and nothing else in braces; else ValueError, in words."""
    if "{" not in url_host and "}" not in url_host:
        return url_host
    sample = url_host.replace(ID_PLACEHOLDER, _SAMPLE_ID)
    if "{" in sample or "}" in sample or not _HOST_NAME.fullmatch(sample.lower()):
        raise ValueError(
            f"{url_host!r}: with {ID_PLACEHOLDER} (each session's and service's workload id) "
            "it must be a host name (letters, digits, '-' and '.') with nothing else in "
            "braces, e.g. {id}.sessions.gpu.example.com"
        )
    return url_host


def url_of(url_host: str, workload_id: str, port: int) -> str:
    """The URL of a relay on `port`: `url_host` with `{id}` as `workload_id`, an IPv6 address
    in brackets. With `{id}` each session and service has a host name of its own, and a
    browser keeps its cookies to it: it sends a host's cookies to every port of that host."""
    host = url_host.replace(ID_PLACEHOLDER, workload_id)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class PortRelay:
    """Listens on (listen_host, listen_port) and pipes each connection to the target port."""

    def __init__(
        self,
        listen_host: str,
        target_port: int,
        clock: Callable[[], float] = time.time,
        target_host: str = "127.0.0.1",
    ) -> None:
        self.listen_host = listen_host
        self.target_host = target_host
        self.target_port = target_port
        self.clock = clock
        #: When bytes last went through (either way); the start counts as activity.
        self.last_activity = clock()
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> int:
        """Listen (on `port`, 0: any free one); returns the port. Raises OSError if taken."""
        self._server = await asyncio.start_server(self._serve, self.listen_host, port)
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    def quiet_s(self) -> float:
        """Seconds since bytes last went through or a connection opened or closed.

        An open connection that carries nothing (a browser tab left open) is not activity.
        """
        return max(0.0, self.clock() - self.last_activity)

    async def close(self) -> None:
        """Stop listening and drop open connections."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.last_activity = self.clock()
        try:
            try:
                up_r, up_w = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                return  # the workload is not listening (yet): the client sees a closed socket
            pipes = [
                asyncio.create_task(self._pipe(reader, up_w)),
                asyncio.create_task(self._pipe(up_r, writer)),
            ]
            self._pipes.update(pipes)
            try:
                await asyncio.gather(*pipes, return_exceptions=True)
            finally:
                self._pipes.difference_update(pipes)
                _close(up_w)
        finally:
            self.connections -= 1
            self.last_activity = self.clock()
            _close(writer)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(CHUNK):
                self.last_activity = self.clock()
                dst.write(data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, OSError):
            pass


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
