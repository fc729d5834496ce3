"""The token routes of the REST API (admin only): mint, list and revoke API tokens."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Path

from hub.apideps import Caller, Security
from hub.apimodels import TokenCreate, TokenCreated, TokenOut, error_responses
from hub.core.access import Principal
from hub.errors import Forbidden, HubError, NotFound
from hub.tokens import mint_token


def add_token_routes(app: FastAPI) -> None:
    """POST /v1/tokens, GET /v1/tokens, DELETE /v1/tokens/{id}; each audited."""

    @app.post(
        "/v1/tokens",
        status_code=201,
        response_model=TokenCreated,
        responses=error_responses(403),
    )
    async def create_token(body: TokenCreate, who: Caller, sec: Security) -> TokenCreated:
        target = f"{body.user} {body.role.value}" + (f" on {body.team}" if body.team else "")
        if not who.admin:
            await sec.auditor.record(
                who, "token.create", team=body.team, target=target, result="denied"
            )
        _admin_only(who, "create tokens")
        clock = sec.clock
        try:
            secret, record = await sec.db(
                lambda: mint_token(
                    sec.store,
                    user=body.user,
                    role=body.role,
                    team=body.team,
                    created_by=who.user,
                    now=clock(),
                    ttl_s=body.ttl_s,
                )
            )
        except HubError as exc:
            await sec.auditor.record(
                who, "token.create", team=body.team, target=target, result=exc.code
            )
            raise
        await sec.auditor.record(
            who, "token.create", team=body.team, target=record.id, detail=target
        )
        return TokenCreated(**TokenOut.of(record).model_dump(), token=secret)

    @app.get("/v1/tokens", response_model=list[TokenOut], responses=error_responses(403))
    async def list_tokens(who: Caller, sec: Security) -> list[TokenOut]:
        _admin_only(who, "list tokens")
        return [TokenOut.of(t) for t in await sec.db(sec.store.tokens)]

    @app.delete(
        "/v1/tokens/{token_id}",
        response_model=TokenOut,
        responses=error_responses(403, 404),
    )
    async def revoke_token(
        token_id: Annotated[str, Path(max_length=64)], who: Caller, sec: Security
    ) -> TokenOut:
        if not who.admin:
            await sec.auditor.record(who, "token.revoke", target=token_id, result="denied")
        _admin_only(who, "revoke tokens")
        found = await sec.db(sec.store.revoke_token, token_id, sec.clock())
        sec.authenticator.forget(token_id)
        if not found:
            await sec.auditor.record(who, "token.revoke", target=token_id, result="not_found")
            raise NotFound(f"no token {token_id}")
        record = await sec.db(sec.store.token, token_id)
        assert record is not None
        await sec.auditor.record(who, "token.revoke", team=record.team, target=token_id)
        return TokenOut.of(record)


def _admin_only(who: Principal, what: str) -> None:
    if not who.admin:
        raise Forbidden(f"{who.user} may not {what} (it needs admin)")
