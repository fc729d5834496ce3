"""WebSockets through the gateway: `/svc/<team>/<service>/<path>` upgraded, relayed to a ready
replica's same path, round robin, message by message in both directions.

A WebSocket is one request to the service for as long as it is open: it holds a replica's slot
and counts in flight (autoscaling's signal) until either side closes it. The caller's bearer
token is checked as for any gateway request (unless the service is `public`) and never goes
to the replica, nor do cookies or one hop's headers; the caller's subprotocols do, and the
replica's choice comes back. A caller refused, or finding no replica, gets the handshake
refused (HTTP 403) with the reason in the log.

Closed normally by either side, the session counts as served; a replica that cannot be
reached or breaks off counts against its health; a caller who vanishes is neither.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidHandshake

from hub.errors import HubError
from hub.gateway import HOP, PREFIX, finish, route
from hub.service import HubService

log = structlog.get_logger(__name__)

#: Headers never forwarded: one hop's and the caller's credentials (as for any gateway
#: request), and the handshake's own (with every `sec-websocket-*`), which the relay sets.
_NOT_FORWARDED = HOP | {"origin"}
#: Close codes that end a session as agreed (RFC 6455 7.4.1): normal, going away.
_NORMAL = frozenset({1000, 1001})
#: Longest a replica may take to answer the upgrade.
_OPEN_TIMEOUT_S = 10.0


def add_gateway_websockets(app: FastAPI, hub: HubService) -> None:
    """The `/svc/...` WebSocket routes on `app`."""

    async def relay(websocket: WebSocket, team: str, name: str, path: str) -> None:
        services = hub.services
        try:
            workload_id, endpoint = await route(websocket, hub, team, name)
        except HubError as exc:
            log.info("gateway_websocket_refused", service=f"{team}/{name}", why=str(exc))
            await websocket.close(code=1008)
            return
        try:
            upstream = await connect(
                _upstream_url(endpoint, path, websocket.url.query),
                additional_headers=_forwarded(websocket),
                subprotocols=websocket.scope.get("subprotocols") or None,
                open_timeout=_OPEN_TIMEOUT_S,
                max_size=None,
            )
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            services.release(team, name, workload_id, served=False, broken=True)
            log.warning(
                "gateway_replica_failed",
                service=f"{team}/{name}",
                replica=workload_id,
                error=type(exc).__name__,
            )
            await websocket.close(code=1011)
            return
        except BaseException:  # the caller went away while the replica had not answered yet
            services.release(team, name, workload_id, served=False)
            raise
        served = broken = False
        try:
            async with upstream:
                await websocket.accept(subprotocol=upstream.subprotocol)
                served, broken = await _pump(websocket, upstream)
        finally:
            finish(hub, team, name, workload_id, served, broken)

    @app.websocket(PREFIX + "{team}/{name}/{path:path}")
    async def gateway_ws(websocket: WebSocket, team: str, name: str, path: str) -> None:
        await relay(websocket, team, name, path)

    @app.websocket(PREFIX + "{team}/{name}")
    async def gateway_ws_root(websocket: WebSocket, team: str, name: str) -> None:
        await relay(websocket, team, name, "")


class _ReplicaBroke(Exception):
    """The replica's side of the session failed (not closed as agreed)."""


async def _pump(websocket: WebSocket, upstream: ClientConnection) -> tuple[bool, bool]:
    """Relay until either side closes; (served, broken) as the module says."""
    caller = asyncio.create_task(_from_caller(websocket, upstream))
    replica = asyncio.create_task(_from_replica(websocket, upstream))
    try:
        done, _ = await asyncio.wait({caller, replica}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (caller, replica):
            task.cancel()
        for task in (caller, replica):
            with contextlib.suppress(BaseException):
                await task
    ended = done.pop()
    error = ended.exception()
    if error is not None:
        return False, isinstance(error, _ReplicaBroke)
    return ended.result(), False


async def _from_caller(websocket: WebSocket, upstream: ClientConnection) -> bool:
    """The caller's messages to the replica; True when the caller closed as agreed."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                code = int(message.get("code", 1000))
                await upstream.close(code if code in _NORMAL else 1000)
                return code in _NORMAL
            if message.get("text") is not None:
                await upstream.send(message["text"])
            elif message.get("bytes") is not None:
                await upstream.send(message["bytes"])
    except ConnectionClosedOK:
        return True  # the replica closed as agreed while a message was on its way
    except ConnectionClosed as exc:
        raise _ReplicaBroke(str(exc)) from None


async def _from_replica(websocket: WebSocket, upstream: ClientConnection) -> bool:
    """The replica's messages to the caller; True when the replica closed as agreed."""
    try:
        async for message in upstream:
            if isinstance(message, str):
                await websocket.send_text(message)
            else:
                await websocket.send_bytes(message)
    except ConnectionClosedOK:
        await _close(websocket, upstream.close_code or 1000)
        return True
    except ConnectionClosed as exc:
        await _close(websocket, 1011)  # "the server met a condition it could not handle"
        raise _ReplicaBroke(str(exc)) from None
    await _close(websocket, upstream.close_code or 1000)
    return True


async def _close(websocket: WebSocket, code: int) -> None:
    """Close the caller's side with `code` (an agreed one passes through; anything else is
    1011); nothing if the caller has left already."""
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await websocket.close(code=code if code in _NORMAL else 1011)


def _upstream_url(endpoint: str, path: str, query: str) -> str:
    base = endpoint.rstrip("/")
    scheme, _, rest = base.partition("://")
    url = f"{'wss' if scheme == 'https' else 'ws'}://{rest}/{path}"
    return f"{url}?{query}" if query else url


def _forwarded(websocket: WebSocket) -> list[tuple[str, str]]:
    """The caller's headers the replica gets (as for any gateway request, less the handshake's
    own, which the relay's connection sets)."""
    return [
        (k, v)
        for k, v in websocket.headers.items()
        if k.lower() not in _NOT_FORWARDED and not k.lower().startswith("sec-websocket-")
    ]
