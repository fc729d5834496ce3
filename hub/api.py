"""REST API of the hub (JSON over HTTP)."""

from __future__ import annotations

import json
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from hub.errors import (
    Conflict,
    Forbidden,
    HubError,
    InvalidPolicy,
    InvalidWorkload,
    NotFound,
    NotLeader,
    Unavailable,
)
from hub.handlers import validation_error
from hub.policyfile import policy_to_dict
from hub.records import WorkloadRecord
from hub.service import HubService
from schemas import ErrorReply, Phase, WorkloadSpec

log = structlog.get_logger(__name__)

_STATUS = {
    InvalidWorkload: 422,
    InvalidPolicy: 422,
    NotFound: 404,
    Conflict: 409,
    Forbidden: 403,
    Unavailable: 503,
    NotLeader: 503,  # a standby: the same request to the leader works
}


def create_app(hub: HubService) -> FastAPI:
    """The FastAPI app serving `hub`."""
    app = FastAPI(title="gpufed hub", version="1")

    @app.exception_handler(HubError)
    async def _hub_error(_request: Request, exc: HubError) -> JSONResponse:
        return _error(_STATUS.get(type(exc), 400), exc.reply())

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("api_failed", error=str(exc))
        return _error(500, ErrorReply(code="internal", message="the hub failed; see its log"))

    @app.post("/v1/workloads", status_code=201)
    async def submit(request: Request) -> Any:
        body = await request.body()
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, ErrorReply(code="invalid_json", message=f"body is not JSON: {exc}"))
        try:
            spec = WorkloadSpec.model_validate(data)
        except ValidationError as exc:
            return _error(422, validation_error(exc))
        record = await hub.submit(spec)
        return JSONResponse(status_code=201, content=_workload_json(record))

    @app.get("/v1/workloads")
    async def list_workloads(
        team: str | None = None, phase: str | None = None, limit: int = 500
    ) -> Any:
        phases: list[Phase] = []
        for name in (phase or "").split(","):
            if not name:
                continue
            try:
                phases.append(Phase(name))
            except ValueError:
                known = ", ".join(p.value for p in Phase)
                raise InvalidWorkload(
                    f"unknown phase {name!r} (known: {known})", field="phase"
                ) from None
        records = await hub.find_workloads(team=team, phases=phases, limit=limit)
        return [_workload_json(r) for r in records]

    @app.get("/v1/workloads/{workload_id}")
    async def get_workload(workload_id: str) -> Any:
        return _workload_json(await hub.get_workload(workload_id))

    @app.delete("/v1/workloads/{workload_id}", status_code=202)
    async def cancel(workload_id: str) -> Any:
        return _workload_json(await hub.cancel(workload_id))

    @app.get("/v1/spokes")
    async def spokes() -> Any:
        now = hub.clock()
        return [_spoke_json(hub, sid, now) for sid in sorted(hub.spokes)]

    @app.get("/v1/usage")
    async def usage(since: float = 0.0) -> Any:
        return await hub.usage(since)

    @app.get("/v1/burst/instances")
    async def burst_instances() -> Any:
        return [e.model_dump(mode="json") for e in hub.instances.values()]

    @app.get("/v1/policy")
    async def get_policy() -> Any:
        return policy_to_dict(hub.policy)

    @app.put("/v1/policy")
    async def put_policy(request: Request) -> Any:
        token = hub.settings.admin_token
        if token and request.headers.get("authorization") != f"Bearer {token}":
            raise Forbidden("changing the policy needs the admin token (Authorization: Bearer)")
        try:
            data = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, ErrorReply(code="invalid_json", message=f"body is not JSON: {exc}"))
        if not isinstance(data, dict):
            raise InvalidPolicy("the policy must be a JSON object")
        return policy_to_dict(await hub.set_policy(data))

    @app.get("/v1/health")
    async def health() -> Any:
        return hub.health()

    return app


def _error(status: int, error: ErrorReply) -> JSONResponse:
    body = error.model_dump(mode="json", exclude={"schema_version"})
    return JSONResponse(status_code=status, content=body)


def _workload_json(record: WorkloadRecord) -> dict[str, Any]:
    data = record.model_dump(mode="json")
    data["wait_s"] = (
        None if record.started_at is None else round(record.started_at - record.submitted_at, 3)
    )
    data["run_s"] = (
        None
        if record.started_at is None or record.finished_at is None
        else round(record.finished_at - record.started_at, 3)
    )
    return data


def _spoke_json(hub: HubService, spoke_id: str, now: float) -> dict[str, Any]:
    spoke = hub.spokes[spoke_id]
    report = spoke.report
    age = now - spoke.last_seen
    gpus: dict[str, dict[str, float]] = {}
    for node in report.nodes if report else ():
        entry = gpus.setdefault(node.gpu_model, {"total": 0, "free": 0})
        entry["total"] += node.gpu_count
        if node.schedulable:  # a cordoned node's idle GPUs are not on offer
            entry["free"] += len(node.free_devices) + sum(node.device_free_fraction.values())
    return {
        "id": spoke.id,
        "region": spoke.region,
        "kind": spoke.kind,
        "status": hub.spoke_status(spoke, now).value,
        "last_seen_s_ago": round(age, 1),
        "nodes": len(report.nodes) if report else 0,
        "gpus": gpus,
        "running": len(report.running) if report else 0,
        "labels": dict(report.labels) if report else {},
    }
