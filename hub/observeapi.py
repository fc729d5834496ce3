"""The hub's observability routes: /metrics, usage and cost, teams, and workload logs.

Kept apart from `hub.api` (workloads, spokes, policy) so each stays small; `create_app` adds
them to the same app.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from hub.errors import InvalidWorkload, NotFound
from hub.logs import fetch_log
from hub.metrics import CONTENT_TYPE
from hub.service import HubService
from hub.usage import GroupBy
from schemas.logs import MAX_LOG_BYTES


def add_observability_routes(app: FastAPI, hub: HubService) -> None:
    """Add /metrics, /v1/usage, /v1/usage/series, /v1/teams and /v1/workloads/{id}/log."""

    @app.get("/v1/workloads/{workload_id}/log")
    async def workload_log(
        workload_id: str, offset: int | None = None, max_bytes: int = 64 * 1024
    ) -> Any:
        record = await hub.get_workload(workload_id)
        if not 1 <= max_bytes <= MAX_LOG_BYTES:
            raise InvalidWorkload(f"max_bytes must be 1..{MAX_LOG_BYTES}", field="max_bytes")
        if offset is not None and offset < 0:
            raise InvalidWorkload("offset must not be negative", field="offset")
        reply = await fetch_log(hub.bus, record, offset, max_bytes)
        if not reply.ok:
            raise NotFound(reply.error or f"no log of {workload_id}")
        data = reply.model_dump(mode="json", exclude={"schema_version", "ok", "error"})
        return {**data, "phase": record.phase.value}

    @app.get("/v1/usage")
    async def usage(since: float = 0.0, until: float | None = None, by: str = "team") -> Any:
        try:
            group = GroupBy(by)
        except ValueError:
            known = ", ".join(g.value for g in GroupBy)
            raise InvalidWorkload(f"unknown grouping {by!r} (known: {known})", field="by") from None
        return await hub.usage(since, until, group)

    @app.get("/v1/usage/series")
    async def usage_over_time(since: float | None = None, step: float = 60.0) -> Any:
        now = hub.clock()
        start = now - 3600 if since is None else since
        step = max(step, (now - start) / 500, 1.0)  # at most 500 points
        return await hub.usage_series(start, step)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(hub.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/teams")
    async def teams() -> Any:
        return hub.teams()
