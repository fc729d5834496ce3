"""REST API of the hub (JSON over HTTP).

Every `/v1` route but `/v1/health` needs a bearer token (`hub.auth`); what the caller may do
is decided per team by `hub.core.access`, and every mutating call is audited (`hub.audit`).
Request and response bodies are typed (`hub.apimodels`), so /openapi.json carries them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Annotated, Any

import structlog
from fastapi import FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hub.apideps import ApiSecurity, Caller, Instant
from hub.apimodels import (
    AuditOut,
    ErrorOut,
    HealthOut,
    SpokeOut,
    WhoAmI,
    WorkloadOut,
    error_responses,
)
from hub.authstore import AuditEntry
from hub.cloudwait import starting_for
from hub.console import mount_console
from hub.cordonapi import add_cordon_routes
from hub.core.access import Action, Principal, allowed, permitted_teams
from hub.errors import (
    Conflict,
    Forbidden,
    HubError,
    InvalidPolicy,
    InvalidRequest,
    InvalidWorkload,
    KeyReused,
    NotFound,
    NotLeader,
    RateLimited,
    StoreUnavailable,
    TooMany,
    Unauthenticated,
    Unavailable,
)
from hub.gateway import PREFIX as GATEWAY_PREFIX
from hub.gateway import add_gateway_routes
from hub.gatewayws import add_gateway_websockets
from hub.idle import flagged_idle_s
from hub.limits import BodyLimits
from hub.observeapi import add_observability_routes
from hub.policyfile import PolicyDocument, describe_errors, policy_to_dict
from hub.records import WorkloadRecord
from hub.service import HubService
from hub.serviceapi import add_service_routes
from hub.tokenapi import add_token_routes
from schemas import MAX_BATCH, Phase, SubmitBatchReply, WorkloadSpec
from schemas.burst import InstanceEvent
from schemas.errors import describe_problems, in_model
from schemas.services import service_problems
from schemas.workloads import spec_problems

log = structlog.get_logger(__name__)

_STATUS = {
    InvalidWorkload: 422,
    InvalidRequest: 422,
    KeyReused: 422,
    InvalidPolicy: 422,
    NotFound: 404,
    Conflict: 409,
    Forbidden: 403,
    Unavailable: 503,
    StoreUnavailable: 503,  # the same request may work in a moment
    TooMany: 429,
    RateLimited: 429,
    NotLeader: 503,  # a standby: the same request to the leader works
}

#: Most workloads one list call returns (`gpufed replay --from-hub` reads a whole history),
#: and most audit entries.
MAX_LIMIT = 1_000_000
MAX_AUDIT_LIMIT = 10_000
#: Path parameters are ids we mint: bounded, so a 1 MiB path is a 422, not a store query.
_Id = Annotated[str, Path(max_length=64)]


def create_app(hub: HubService, sec: ApiSecurity) -> FastAPI:
    """The FastAPI app serving `hub`, wrapped in the body limits (413 / 422 before parsing)."""
    app = FastAPI(
        title="gpufed hub",
        version="1",
        responses=error_responses(401, 422),
    )
    app.state.security = sec

    def _out(record: WorkloadRecord) -> WorkloadOut:
        queued, now = record.phase == Phase.QUEUED, hub.clock()
        return WorkloadOut.of(
            record,
            now,
            priority=hub.policy.priority(record.spec.priority_class),
            position=hub.positions.get(record.id) if queued else None,
            idle_s=flagged_idle_s(hub.state, record, now),
            cloud_instance=starting_for(hub.instances, record.id, now) if queued else None,
            cloud_refused=hub.state.verdicts.refused_for(record.id, now) if queued else None,
        )

    @app.exception_handler(Unauthenticated)
    async def _unauthenticated(_request: Request, exc: Unauthenticated) -> JSONResponse:
        response = _error(401, exc.code, exc.message)
        response.headers["WWW-Authenticate"] = 'Bearer realm="gpufed"'
        return response

    @app.exception_handler(HubError)
    async def _hub_error(_request: Request, exc: HubError) -> JSONResponse:
        status = _STATUS.get(type(exc), 400)
        response = _error(status, exc.code, exc.message, exc.field, exc.retryable)
        if isinstance(exc, RateLimited):  # whole seconds, at least one (RFC 9110)
            response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        elif isinstance(exc, StoreUnavailable):
            response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {"loc": ()}
        if first.get("type") == "json_invalid":
            why = (first.get("ctx") or {}).get("error", first.get("msg", ""))
            return _error(400, "invalid_json", f"body is not JSON: {why}")
        field, text = describe_problems(exc.errors())
        code = _invalid_code(request.url.path, first)
        if code == "invalid_policy":  # every problem, named as `gpufed hub --policy` does
            errors = [{**e, "loc": in_model(e["loc"])} for e in exc.errors()]
            text = describe_errors(errors, exc.body)
        elif request.url.path == "/v1/workloads":  # with its typos, if any
            field, text = spec_problems(exc.errors(), exc.body)
        elif code == "invalid_workload" and request.url.path.startswith("/v1/services"):
            field, text = service_problems(exc.errors(), exc.body)  # a service's, typos first
        return _error(422, code, text[:2000], field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, "http_error", str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("api_failed", error=type(exc).__name__)
        return _error(500, "internal", "the hub failed; see its log")

    @app.post(
        "/v1/workloads",
        status_code=201,
        response_model=WorkloadOut,
        responses={
            200: {"model": WorkloadOut, "description": "Taken before under this Idempotency-Key"},
            **error_responses(403, 429),
        },
    )
    async def submit(
        spec: WorkloadSpec,
        who: Caller,
        response: Response,
        key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    ) -> WorkloadOut:
        """201 with the new workload; under an `Idempotency-Key` the caller sent before with
        this spec, 200 with the workload it made then (`Idempotent-Replayed: true`)."""
        what = _what(spec)
        if not allowed(who, Action.SUBMIT, spec.team):
            await sec.auditor.record(who, "submit", team=spec.team, result="denied", detail=what)
            raise Forbidden(_refusal(who, "submit work for", spec.team), field="team")
        try:
            if key is None:
                record, again = await hub.submit(spec, who.user), False
            else:
                record, again = await hub.keyed.submit(spec, who.user, key)
        except HubError as exc:
            await sec.auditor.record(
                who, "submit", team=spec.team, result=exc.code, detail=exc.message
            )
            raise
        if again:  # nothing new was taken: said so, and in the audit log
            response.status_code = 200
            response.headers["Idempotent-Replayed"] = "true"
            what += " (sent again under its Idempotency-Key)"
        await sec.auditor.record(who, "submit", team=spec.team, target=record.id, detail=what)
        return _out(record)

    @app.post(
        "/v1/workloads:batch",
        responses={200: {"model": SubmitBatchReply}, **error_responses(403, 413)},
        # The body is read raw (each spec is validated on its own), so say what it holds.
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/WorkloadSpec"},
                            "maxItems": MAX_BATCH,
                        }
                    }
                },
            }
        },
    )
    async def submit_batch(
        request: Request,
        who: Caller,
        key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    ) -> Any:
        """Up to MAX_BATCH specs (a JSON list, or {"workloads": [...]}), stored together.

        200 with one result per spec, in order (each stands or falls alone); 400 or 413 when
        the batch as a whole is refused; 403 naming the first team the caller may not submit
        for (nothing is stored then). Under an `Idempotency-Key` each spec is taken at most
        once: sent again, the batch answers with the workloads it made.
        """
        body = await request.body()
        for team in _batch_teams(body):
            if not allowed(who, Action.SUBMIT, team):
                await sec.auditor.record(who, "submit", team=team, result="denied", detail="batch")
                raise Forbidden(_refusal(who, "submit work for", team), field="team")

        def entry(spec: WorkloadSpec, target: str, result: str = "ok") -> AuditEntry:
            detail = f"{_what(spec)} (batch)"
            return sec.auditor.entry(
                who, "submit", team=spec.team, target=target, result=result, detail=detail
            )

        async def refused(specs: Sequence[tuple[WorkloadSpec, str]]) -> None:
            await sec.auditor.append_all([entry(spec, "", code) for spec, code in specs])

        # Each workload's entry is saved with it, under its team (a team-admin reads it).
        reply = await hub.handlers.submit_batch(
            body, who.user, audit=entry, on_refused=refused, key=key
        )
        if reply.error is not None:
            status = 413 if reply.error.code == "batch_too_large" else 400
            return _error(status, reply.error.code, reply.error.message, reply.error.field)
        return reply.model_dump(mode="json", exclude={"schema_version", "error"})

    @app.get("/v1/workloads", response_model=list[WorkloadOut], responses=error_responses(403))
    async def list_workloads(
        who: Caller,
        team: Annotated[str | None, Query(max_length=63)] = None,
        phase: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 500,
        since: Annotated[
            float | None, Query(ge=0, description="submitted at or after (epoch seconds)")
        ] = None,
    ) -> list[WorkloadOut]:
        phases = _phases(phase)
        visible = permitted_teams(who, Action.READ)
        if team and visible is not None and team not in visible:
            raise Forbidden(_refusal(who, "see the work of", team), field="team")
        teams = [team] if team else (None if visible is None else sorted(visible))
        if teams == []:
            return []
        records = await hub.find_workloads(teams=teams, phases=phases, limit=limit, since=since)
        return [_out(r) for r in records]

    @app.get(
        "/v1/workloads/{workload_id}",
        response_model=WorkloadOut,
        responses=error_responses(403, 404),
    )
    async def get_workload(workload_id: _Id, who: Caller) -> WorkloadOut:
        record = await _workload(hub, workload_id)
        if not allowed(who, Action.READ, record.spec.team):
            raise Forbidden(_refusal(who, "see the work of", record.spec.team), field="team")
        return _out(record)

    @app.delete(
        "/v1/workloads/{workload_id}",
        status_code=202,
        response_model=WorkloadOut,
        responses=error_responses(403, 404, 409),
    )
    async def cancel(workload_id: _Id, who: Caller) -> WorkloadOut:
        record = await _workload(hub, workload_id)
        team = record.spec.team
        if not allowed(who, Action.CANCEL, team):
            await sec.auditor.record(who, "cancel", team=team, target=workload_id, result="denied")
            raise Forbidden(_refusal(who, "cancel the work of", team), field="team")
        try:
            cancelled = await hub.cancel(workload_id)
        except HubError as exc:
            await sec.auditor.record(
                who, "cancel", team=team, target=workload_id, result=exc.code, detail=exc.message
            )
            raise
        await sec.auditor.record(
            who, "cancel", team=team, target=workload_id, detail=cancelled.phase.value
        )
        return _out(cancelled)

    @app.get("/v1/spokes", response_model=list[SpokeOut])
    async def spokes(who: Caller) -> list[SpokeOut]:
        now = hub.clock()
        return [hub.spoke_view(sid, now) for sid in sorted(hub.fleet)]

    @app.get("/v1/burst/instances", response_model=list[InstanceEvent])
    async def burst_instances(who: Caller) -> list[InstanceEvent]:
        teams = permitted_teams(who, Action.READ)
        return [e for e in hub.instances.values() if teams is None or e.team in teams]

    @app.get("/v1/policy", response_model=PolicyDocument)
    async def get_policy(who: Caller) -> Any:
        return policy_to_dict(hub.policy)

    @app.put("/v1/policy", response_model=PolicyDocument, responses=error_responses(403))
    async def put_policy(document: PolicyDocument, who: Caller) -> Any:
        if not who.admin:
            await sec.auditor.record(who, "policy.set", result="denied")
            raise Forbidden(f"{who.user} may not change the policy (it needs admin)")
        try:
            policy = await hub.set_policy(document.model_dump(exclude_unset=True))
        except HubError as exc:
            await sec.auditor.record(who, "policy.set", result=exc.code, detail=exc.message)
            raise
        await sec.auditor.record(who, "policy.set", detail=f"{len(policy.teams)} teams")
        return policy_to_dict(policy)

    @app.get("/v1/audit", response_model=list[AuditOut], responses=error_responses(403))
    async def audit(
        who: Caller,
        team: Annotated[str | None, Query(max_length=63)] = None,
        action: Annotated[str | None, Query(max_length=64)] = None,
        via: Annotated[str | None, Query(max_length=300)] = None,
        since: Instant = 0.0,
        limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_LIMIT)] = 100,
    ) -> list[AuditOut]:
        teams = permitted_teams(who, Action.AUDIT)
        if team and teams is not None and team not in teams:
            raise Forbidden(_refusal(who, "read the audit log of", team), field="team")
        if teams is not None and not teams:
            raise Forbidden(f"{who.user} reads no team's audit log (it needs team-admin)")
        scope = [team] if team else (None if teams is None else sorted(teams))
        return await hub.db(
            sec.store.audit, teams=scope, action=action, via=via, since=since, limit=limit
        )

    @app.get("/v1/whoami", response_model=WhoAmI)
    async def whoami(who: Caller) -> WhoAmI:
        return WhoAmI.of(who)

    add_token_routes(app)
    add_cordon_routes(app, hub)
    add_observability_routes(app, hub, sec)
    add_service_routes(app, hub)
    add_gateway_routes(app, hub)
    add_gateway_websockets(app, hub)
    mount_console(app)

    @app.get("/v1/health", response_model=HealthOut)
    async def health() -> HealthOut:
        return HealthOut.model_validate(hub.health())

    app.add_middleware(BodyLimits, exempt=(GATEWAY_PREFIX,))
    return app


def _what(spec: WorkloadSpec) -> str:
    """A submission in the audit log's words: name, class and GPUs."""
    return f"{spec.name} {spec.priority_class} {spec.total_gpus:g} GPU(s)"


def _refusal(who: Principal, what: str, team: str) -> str:
    return f"{who.user} may not {what} team {team}"


def _phases(phase: str | None) -> list[Phase]:
    phases: list[Phase] = []
    for name in (phase or "").split(","):
        if not name:
            continue
        try:
            phases.append(Phase(name))
        except ValueError:
            known = ", ".join(p.value for p in Phase)
            raise InvalidRequest(
                f"unknown phase {name[:64]!r} (known: {known})", field="phase"
            ) from None
    return phases


def _batch_teams(body: bytes) -> list[str]:
    """The teams a batch body names, in first-seen order (what it may be refused for)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return []  # submit_batch answers for the body itself
    items = data.get("workloads") if isinstance(data, dict) else data
    teams: dict[str, None] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and isinstance(item.get("team"), str):
            teams[item["team"]] = None
    return list(teams)


async def _workload(hub: HubService, workload_id: str) -> WorkloadRecord:
    return await hub.get_workload(workload_id)


def _invalid_code(path: str, error: dict[str, Any]) -> str:
    """The stable code of a request that does not validate: what the caller got wrong."""
    where = error.get("loc", ())[:1]
    if where != ("body",):  # a query or path parameter (?limit=abc): the request, not a body
        return "invalid_request"
    if path == "/v1/policy":
        return "invalid_policy"
    if path.startswith(("/v1/workloads", "/v1/services")):
        return "invalid_workload"  # a workload's spec, or a service's (its replicas' spec)
    return "invalid_request"


def _error(
    status: int, code: str, message: str, field: str | None = None, retryable: bool = False
) -> JSONResponse:
    body = ErrorOut(code=code, message=message, field=field, retryable=retryable)
    return JSONResponse(status_code=status, content=body.model_dump())
