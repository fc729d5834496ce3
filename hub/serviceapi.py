"""REST routes of inference services: `/v1/services` (create, list, show, update, delete).

Access as for workloads (`hub.core.access`): creating, updating and deleting a service needs
the rights to submit and cancel the team's work; reading it, to read the team's work. Every
change is audited (`service.create`, `service.update`, `service.delete`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Path, Query
from pydantic import BaseModel, Field

from hub.apideps import ApiSecurity, Caller, Security
from hub.apimodels import error_responses
from hub.core.access import Action, Principal, allowed, permitted_teams
from hub.errors import Forbidden, HubError, InvalidWorkload
from hub.records import HistoryEntry
from hub.service import HubService
from hub.servicerecords import ServiceRecord
from schemas.common import DNS_LABEL_PATTERN, unknown_text
from schemas.services import ServiceSpec, unknown_fields

_Label = Annotated[str, Path(max_length=63, pattern=DNS_LABEL_PATTERN)]


class ReplicaOut(BaseModel):
    workload_id: str
    generation: int
    phase: str
    spoke_id: str | None = None
    endpoint: str | None = None
    ready: bool
    stopping: bool
    requests: int = Field(description="requests it served through the gateway (since start)")


class ServiceOut(BaseModel):
    """A service: its spec (secret values masked), replicas, load and cost."""

    team: str
    name: str
    url: str = Field(description="the gateway path that routes to its ready replicas")
    spec: ServiceSpec
    created_at: float
    updated_at: float
    created_by: str
    generation: int
    desired: int = Field(description="replicas the autoscaler asks for now")
    reason: str = Field(description="why that many: load, min_replicas, until_idle, idle, ...")
    message: str = Field(description="why a replica could not be started, if one could not")
    ready: int
    rps: float = Field(description="requests per second over the autoscaling window")
    in_flight: int
    waiting: int = Field(description="requests held at the gateway for a replica")
    requests: int
    gpu_seconds: float
    cost_dollars: float
    cost_per_1k_requests: float | None
    replicas: list[ReplicaOut]
    history: list[HistoryEntry]


def add_service_routes(app: FastAPI, hub: HubService) -> None:
    """The `/v1/services` routes on `app`."""
    services = hub.services

    def _out(record: ServiceRecord) -> ServiceOut:
        spec = record.spec
        return ServiceOut.model_validate(
            {
                "team": spec.team,
                "name": spec.name,
                "url": f"/svc/{spec.team}/{spec.name}/",
                "spec": spec.redacted(),
                **record.model_dump(
                    include={
                        "created_at",
                        "updated_at",
                        "created_by",
                        "reason",
                        "message",
                        "history",
                    }
                ),
                **services.status(record),
            }
        )

    @app.post(
        "/v1/services",
        status_code=201,
        response_model=ServiceOut,
        responses=error_responses(403, 409),
    )
    async def create_service(spec: ServiceSpec, who: Caller, sec: Security) -> ServiceOut:
        await _may(who, sec, "service.create", spec.team, spec.name)
        try:
            _refuse_unknown(spec)
            record = await services.create(spec, who.user)
        except HubError as exc:
            await _audit(sec, who, "service.create", spec, exc)
            raise
        await _audit(sec, who, "service.create", spec)
        return _out(record)

    @app.get("/v1/services", response_model=list[ServiceOut], responses=error_responses(403))
    async def list_services(
        who: Caller, team: Annotated[str | None, Query(max_length=63)] = None
    ) -> list[ServiceOut]:
        visible = permitted_teams(who, Action.READ)
        if team and visible is not None and team not in visible:
            raise Forbidden(f"{who.user} may not see the services of team {team}", field="team")
        teams = [team] if team else (None if visible is None else sorted(visible))
        return [_out(r) for r in services.find(teams)]

    @app.get(
        "/v1/services/{team}/{name}",
        response_model=ServiceOut,
        responses=error_responses(403, 404),
    )
    async def show_service(team: _Label, name: _Label, who: Caller) -> ServiceOut:
        if not allowed(who, Action.READ, team):
            raise Forbidden(f"{who.user} may not see the services of team {team}", field="team")
        return _out(services.get(team, name))

    @app.put(
        "/v1/services/{team}/{name}",
        response_model=ServiceOut,
        responses=error_responses(403, 404, 422),
    )
    async def update_service(
        team: _Label, name: _Label, spec: ServiceSpec, who: Caller, sec: Security
    ) -> ServiceOut:
        """A new spec for the service: a changed replica template rolls replicas over."""
        await _may(who, sec, "service.update", team, name)
        if (spec.team, spec.name) != (team, name):
            raise InvalidWorkload(
                f"the spec names {spec.team}/{spec.name}, not {team}/{name}", field="name"
            )
        try:
            _refuse_unknown(spec)
            record = await services.update(spec, who.user)
        except HubError as exc:
            await _audit(sec, who, "service.update", spec, exc)
            raise
        await _audit(sec, who, "service.update", spec, detail=f"generation {record.generation}")
        return _out(record)

    @app.delete(
        "/v1/services/{team}/{name}",
        status_code=202,
        response_model=ServiceOut,
        responses=error_responses(403, 404),
    )
    async def delete_service(team: _Label, name: _Label, who: Caller, sec: Security) -> ServiceOut:
        await _may(who, sec, "service.delete", team, name)
        record = services.get(team, name)
        out = _out(record)
        await services.delete(team, name)
        await sec.auditor.record(
            who, "service.delete", team=team, target=f"{team}/{name}", detail="deleted"
        )
        return out


def _refuse_unknown(spec: ServiceSpec) -> None:
    """A field the spec does not have is refused, naming the nearest one it has: a typo
    (`max_replica: 4`, `replica: {gpu: 8}`) never runs something other than what was asked."""
    unknown = unknown_fields(spec)
    if unknown:
        raise InvalidWorkload(unknown_text(unknown), field=unknown[0][0])


async def _may(who: Principal, sec: ApiSecurity, action: str, team: str, name: str) -> None:
    """Creating, changing or deleting a service needs to submit and cancel the team's work."""
    if allowed(who, Action.SUBMIT, team) and allowed(who, Action.CANCEL, team):
        return
    await sec.auditor.record(who, action, team=team, target=f"{team}/{name}", result="denied")
    raise Forbidden(f"{who.user} may not run services for team {team}", field="team")


async def _audit(
    sec: ApiSecurity,
    who: Principal,
    action: str,
    spec: ServiceSpec,
    exc: HubError | None = None,
    *,
    detail: str = "",
) -> None:
    target = f"{spec.team}/{spec.name}"
    if exc is not None:
        await sec.auditor.record(
            who, action, team=spec.team, target=target, result=exc.code, detail=exc.message
        )
        return
    shape = f"{spec.min_replicas}..{spec.max_replicas} replicas {spec.priority_class}"
    await sec.auditor.record(who, action, team=spec.team, target=target, detail=detail or shape)
