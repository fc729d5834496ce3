"""The cordon routes of the REST API (admin only, audited): take a spoke out of placement,
drain it (its movable work too), and put it back (`hub.cordons`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Path

from hub.apideps import Caller, Security
from hub.apimodels import CordonIn, DrainedWorkload, DrainOut, SpokeOut, error_responses
from hub.errors import Forbidden, HubError
from hub.records import Cordon
from hub.service import HubService

_SpokeId = Annotated[str, Path(max_length=64)]


def add_cordon_routes(app: FastAPI, hub: HubService) -> None:
    """PUT and DELETE /v1/spokes/{id}/cordon, answering the spoke as `/v1/spokes` shows it,
    and POST /v1/spokes/{id}/drain; audited as spoke.cordon, spoke.uncordon, spoke.drain."""

    @app.put(
        "/v1/spokes/{spoke_id}/cordon",
        response_model=SpokeOut,
        responses=error_responses(403, 404),
    )
    async def cordon(spoke_id: _SpokeId, body: CordonIn, who: Caller, sec: Security) -> SpokeOut:
        cordon = Cordon(by=who.user, at=hub.clock(), reason=body.reason)
        return await _set(spoke_id, cordon, who, sec)

    @app.delete(
        "/v1/spokes/{spoke_id}/cordon",
        response_model=SpokeOut,
        responses=error_responses(403, 404),
    )
    async def uncordon(spoke_id: _SpokeId, who: Caller, sec: Security) -> SpokeOut:
        return await _set(spoke_id, None, who, sec)

    async def _set(spoke_id: str, cordon: Cordon | None, who: Caller, sec: Security) -> SpokeOut:
        action = "spoke.cordon" if cordon is not None else "spoke.uncordon"
        detail = cordon.reason if cordon is not None else ""
        if not who.admin:
            await sec.auditor.record(who, action, target=spoke_id, result="denied")
            raise Forbidden(f"{who.user} may not cordon or uncordon spokes (it needs admin)")
        try:
            await hub.set_cordon(spoke_id, cordon)
        except HubError as exc:
            await sec.auditor.record(who, action, target=spoke_id, result=exc.code)
            raise
        await sec.auditor.record(who, action, target=spoke_id, detail=detail)
        return hub.spoke_view(spoke_id, hub.clock())

    @app.post(
        "/v1/spokes/{spoke_id}/drain",
        response_model=DrainOut,
        responses=error_responses(403, 404),
    )
    async def drain(spoke_id: _SpokeId, body: CordonIn, who: Caller, sec: Security) -> DrainOut:
        if not who.admin:
            await sec.auditor.record(who, "spoke.drain", target=spoke_id, result="denied")
            raise Forbidden(f"{who.user} may not drain spokes (it needs admin)")
        cordon = Cordon(by=who.user, at=hub.clock(), reason=body.reason)
        try:
            drained = await hub.drain(spoke_id, cordon)
        except HubError as exc:
            await sec.auditor.record(who, "spoke.drain", target=spoke_id, result=exc.code)
            raise
        detail = f"{len(drained.requeued)} requeued, {len(drained.left)} left running"
        reason = f": {body.reason}" if body.reason else ""
        await sec.auditor.record(who, "spoke.drain", target=spoke_id, detail=detail + reason)
        return DrainOut(
            spoke=hub.spoke_view(spoke_id, hub.clock()),
            requeued=[
                DrainedWorkload(workload_id=w.id, name=w.spec.name, team=w.spec.team)
                for w in drained.requeued
            ],
            left_running=[
                DrainedWorkload(workload_id=w.id, name=w.spec.name, team=w.spec.team, why=why)
                for w, why in drained.left
            ],
        )
