"""The hub's observability routes: /metrics, usage and cost, teams, and workload logs.

Kept apart from `hub.api` (workloads, spokes, policy) so each stays small; `create_app` adds
them to the same app.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import FastAPI, Query
from fastapi.responses import Response

from hub.apideps import ApiSecurity, Caller, Instant
from hub.core.access import Action, Principal, allowed, permitted_teams
from hub.errors import Forbidden, InvalidRequest, NotFound
from hub.logs import fetch_log
from hub.metrics import CONTENT_TYPE
from hub.service import HubService
from hub.usage import GroupBy
from schemas.logs import MAX_LOG_BYTES


def add_observability_routes(app: FastAPI, hub: HubService, sec: ApiSecurity) -> None:
    """Add /metrics, /v1/usage, /v1/usage/series, /v1/teams and /v1/workloads/{id}/log.

    Usage needs team-admin of the teams it shows (admin: all); a log and the teams view need
    read access; /metrics needs no token (it names teams and spokes, never workloads).
    """

    def usage_scope(who: Principal) -> list[str] | None:
        teams = permitted_teams(who, Action.USAGE)
        if teams is not None and not teams:
            raise Forbidden(f"{who.user} sees no team's usage (it needs team-admin)")
        return None if teams is None else sorted(teams)

    @app.get("/v1/workloads/{workload_id}/log")
    async def workload_log(
        workload_id: str, who: Caller, offset: int | None = None, max_bytes: int = 64 * 1024
    ) -> Any:
        record = await hub.get_workload(workload_id[:64])
        if not allowed(who, Action.READ, record.spec.team):
            raise Forbidden(
                f"{who.user} may not read the logs of team {record.spec.team}", field="team"
            )
        if not 1 <= max_bytes <= MAX_LOG_BYTES:
            raise InvalidRequest(f"max_bytes must be 1..{MAX_LOG_BYTES}", field="max_bytes")
        if offset is not None and offset < 0:
            raise InvalidRequest("offset must not be negative", field="offset")
        reply = await fetch_log(hub.bus, record, offset, max_bytes)
        if not reply.ok:
            raise NotFound(reply.error or f"no log of {workload_id}")
        data = reply.model_dump(mode="json", exclude={"schema_version", "ok", "error"})
        return {**data, "phase": record.phase.value}

    @app.get("/v1/usage")
    async def usage(
        who: Caller, since: Instant = 0.0, until: Instant | None = None, by: str = "team"
    ) -> Any:
        teams = usage_scope(who)
        if until is not None and until < since:
            raise InvalidRequest(
                f"until ({_utc(until)}) is before since ({_utc(since)}): an empty window",
                field="until",
            )
        try:
            group = GroupBy(by)
        except ValueError:
            known = ", ".join(g.value for g in GroupBy)
            raise InvalidRequest(f"unknown grouping {by!r} (known: {known})", field="by") from None
        data = await hub.usage(since, until, group, teams=teams)
        if group == GroupBy.TEAM:
            spend = sec.month_spend()
            for team, row in data["rows"].items():
                row["burst_spend_month"] = round(spend.get(team, 0.0), 6)
        return data

    @app.get("/v1/usage/series")
    async def usage_over_time(
        who: Caller,
        since: Instant | None = None,
        step: Annotated[float, Query(gt=0, allow_inf_nan=False)] = 60.0,
    ) -> Any:
        teams = usage_scope(who)
        now = hub.clock()
        start = now - 3600 if since is None else since
        step = max(step, (now - start) / 500, 1.0)  # at most 500 points
        return await hub.usage_series(start, step, teams=teams)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(hub.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/teams")
    async def teams(who: Caller) -> Any:
        visible = permitted_teams(who, Action.READ)
        return [t for t in hub.teams() if visible is None or t.get("team") in visible]


def _utc(instant: float) -> str:
    return f"{datetime.fromtimestamp(instant, UTC):%Y-%m-%d %H:%M:%S} UTC"
