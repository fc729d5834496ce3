"""The request gateway: `/svc/<team>/<service>/<path>` on the hub's port, proxied to a ready
replica of the service, round robin.

A request waits here while the service has no ready replica (scaled to zero, or starting),
up to the service's `autoscaling.wake_timeout_s`; the controller sees it waiting and starts
one. Every request a replica answers is counted (`ServiceController.release`): the counts are
the load signal autoscaling follows and what cost per 1,000 requests divides by. The caller's
bearer token is checked here (unless the service is `public`) and never forwarded to the
replica; nor are hop-by-hop headers.

The caller's body goes to the replica as it comes, and the replica's answer back as it comes
(a language model's tokens reach the caller one by one, not after the last): the hub holds
neither whole, so an upload's size costs it no memory. The request counts as in flight, and
the replica's slot as taken, until the answer's last byte has gone out or either side has gone
away.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterable

import httpx
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect, HTTPConnection
from starlette.types import Receive, Scope, Send

from hub.apideps import security
from hub.core.access import Action, allowed
from hub.errors import Forbidden, Unavailable
from hub.service import HubService

log = structlog.get_logger(__name__)

#: Headers that belong to one hop (RFC 9110 7.6.1) or that we set ourselves.
HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "cookie",
        "content-length",
    }
)
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
#: What a replica's answer is, in a browser: its own origin, not the hub's. The gateway serves
#: it on the hub's origin, where the console keeps the caller's API token (localStorage); a
#: replica's page with a script could otherwise read that token and act as whoever opened
#: it, an admin included. Scripts, forms and popups still work; same-origin access does not.
SANDBOX = "sandbox allow-scripts allow-forms allow-popups allow-downloads"
#: Where the gateway's routes are: their bodies are the services' own (`hub.limits` leaves them).
PREFIX = "/svc/"
#: How long one proxied request may wait for the replica's next bytes (inference can be slow).
_TIMEOUT = httpx.Timeout(300.0, connect=5.0)


class _Relay(StreamingResponse):
    """A replica's answer streamed to the caller, its bytes as they come (still encoded as the
    replica sent them, with its `content-encoding`); `release(served, broken)` once it is over:
    served when the last byte went out, broken when the replica failed mid-answer, neither when
    the caller went away."""

    def __init__(
        self,
        answer: httpx.Response,
        headers: dict[str, str],
        release: Callable[[bool, bool], None],
    ) -> None:
        super().__init__(self._chunks(), status_code=answer.status_code, headers=headers)
        self.answer = answer
        self.release = release
        self.served = self.broken = False

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.answer.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            self.broken = True
            raise
        self.served = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # however it ended: the connection goes back, the replica's slot with it
            try:
                await self.answer.aclose()
            finally:
                self.release(self.served, self.broken)


def _body(request: Request) -> AsyncIterator[bytes] | None:
    """The caller's body as it arrives; None for a request that has none."""
    if "content-length" in request.headers or "transfer-encoding" in request.headers:
        return request.stream()
    return None


def answer_headers(raw: Iterable[tuple[str, str]], workload_id: str) -> dict[str, str]:
    """The replica's answer headers the caller gets: not one hop's; the replica named; the
    answer sandboxed (SANDBOX), beside any policy of the replica's own (both apply)."""
    headers = {k.lower(): v for k, v in raw if k.lower() not in HOP}
    own = headers.get("content-security-policy")
    headers["content-security-policy"] = f"{own}, {SANDBOX}" if own else SANDBOX
    headers["x-gpufed-replica"] = workload_id
    return headers


def _forwarded(request: Request) -> list[tuple[str, str]]:
    """The caller's headers the replica gets: not one hop's, not its credentials; its body's
    length where it gave one (the body then goes as is, not re-framed in chunks)."""
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
    length = request.headers.get("content-length")
    if length is not None:
        headers.append(("content-length", length))
    return headers


async def route(caller: HTTPConnection, hub: HubService, team: str, name: str) -> tuple[str, str]:
    """A ready replica for the caller's request or WebSocket: (workload id, endpoint), to
    `release` once done. Raises NotFound for an unknown service; for a service not `public`,
    Unauthenticated or Forbidden unless the caller's bearer token may read the team's work;
    Unavailable when no replica became ready in the service's `wake_timeout_s`."""
    record = hub.services.get(team, name)
    if not record.spec.public:
        authorization = caller.headers.get("authorization")
        who = await security(caller).authenticator.authenticate(authorization)
        if not allowed(who, Action.READ, team):
            raise Forbidden(f"{who.user} may not call the services of team {team}")
    return await hub.services.acquire(team, name, record.spec.autoscaling.wake_timeout_s)


def finish(
    hub: HubService, team: str, name: str, workload_id: str, served: bool, broken: bool
) -> None:
    """The request or WebSocket `route` gave `workload_id` is over: its slot goes back
    (`ServiceController.release`), and a replica that broke off mid-way is logged."""
    hub.services.release(team, name, workload_id, served, broken)
    if broken:
        log.warning("gateway_replica_broke", service=f"{team}/{name}", replica=workload_id)


def add_gateway_routes(app: FastAPI, hub: HubService) -> None:
    """The `/svc/...` proxy routes on `app` (add before any catch-all mount)."""
    services = hub.services

    async def proxy(request: Request, team: str, name: str, path: str) -> Response:
        workload_id, endpoint = await route(request, hub, team, name)
        outgoing = services.http.build_request(
            request.method,
            f"{endpoint.rstrip('/')}/{path}",
            params=request.query_params,
            content=_body(request),
            headers=_forwarded(request),
            timeout=_TIMEOUT,
        )
        try:
            answer = await services.http.send(outgoing, stream=True)
        except ClientDisconnect:  # the caller went away mid-upload: nobody to answer
            services.release(team, name, workload_id, served=False)
            return Response(status_code=499)
        except httpx.HTTPError as exc:
            services.release(team, name, workload_id, served=False, broken=True)
            log.warning("gateway_replica_failed", service=f"{team}/{name}", replica=workload_id)
            raise Unavailable(
                f"replica {workload_id} of {team}/{name} did not answer ({type(exc).__name__})"
            ) from None
        except BaseException:  # the caller went away while the replica had not answered yet
            services.release(team, name, workload_id, served=False)
            raise
        headers = answer_headers(answer.headers.items(), workload_id)
        return _Relay(answer, headers, functools.partial(finish, hub, team, name, workload_id))

    @app.api_route(PREFIX + "{team}/{name}/{path:path}", methods=_METHODS, include_in_schema=False)
    async def gateway(request: Request, team: str, name: str, path: str) -> Response:
        return await proxy(request, team, name, path)

    @app.api_route(PREFIX + "{team}/{name}", methods=_METHODS, include_in_schema=False)
    async def gateway_root(request: Request, team: str, name: str) -> Response:
        return await proxy(request, team, name, "")
