"""The request gateway: `/svc/<team>/<service>/<path>` on the hub's port, proxied to a ready
replica of the service, round robin.

A request waits here while the service has no ready replica (scaled to zero, or starting),
up to the service's `autoscaling.wake_timeout_s`; the controller sees it waiting and starts
one. Every request a replica answers is counted (`ServiceController.release`): the counts are
the load signal autoscaling follows and what cost per 1,000 requests divides by. The caller's
bearer token is checked here (unless the service is `public`) and never forwarded to the
replica; nor are hop-by-hop headers.
"""

from __future__ import annotations

import httpx
import structlog
from fastapi import FastAPI, Request, Response

from hub.apideps import security
from hub.core.access import Action, allowed
from hub.errors import Forbidden, Unavailable
from hub.service import HubService

log = structlog.get_logger(__name__)

#: Headers that belong to one hop (RFC 9110 7.6.1) or that we set ourselves.
_HOP = frozenset(
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
        "content-encoding",
    }
)
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
#: How long one proxied request may take (inference can be slow).
_TIMEOUT = httpx.Timeout(300.0, connect=5.0)


def add_gateway_routes(app: FastAPI, hub: HubService) -> None:
    """The `/svc/...` proxy routes on `app` (add before any catch-all mount)."""
    services = hub.services

    async def proxy(request: Request, team: str, name: str, path: str) -> Response:
        record = services.get(team, name)  # 404 for an unknown service
        if not record.spec.public:
            sec = security(request)
            who = await sec.authenticator.authenticate(request.headers.get("authorization"))
            if not allowed(who, Action.READ, team):
                raise Forbidden(f"{who.user} may not call the services of team {team}")
        body = await request.body()
        workload_id, endpoint = await services.acquire(
            team, name, record.spec.autoscaling.wake_timeout_s
        )
        served = broken = False
        try:
            answer = await services.http.request(
                request.method,
                f"{endpoint.rstrip('/')}/{path}",
                params=request.query_params,
                content=body,
                headers=[(k, v) for k, v in request.headers.items() if k.lower() not in _HOP],
                timeout=_TIMEOUT,
            )
            served = True
        except httpx.HTTPError as exc:
            broken = True
            log.warning("gateway_replica_failed", service=f"{team}/{name}", replica=workload_id)
            raise Unavailable(
                f"replica {workload_id} of {team}/{name} did not answer ({type(exc).__name__})"
            ) from None
        finally:
            services.release(team, name, workload_id, served, broken)
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        headers["x-gpufed-replica"] = workload_id
        return Response(answer.content, status_code=answer.status_code, headers=headers)

    @app.api_route("/svc/{team}/{name}/{path:path}", methods=_METHODS, include_in_schema=False)
    async def gateway(request: Request, team: str, name: str, path: str) -> Response:
        return await proxy(request, team, name, path)

    @app.api_route("/svc/{team}/{name}", methods=_METHODS, include_in_schema=False)
    async def gateway_root(request: Request, team: str, name: str) -> Response:
        return await proxy(request, team, name, "")
