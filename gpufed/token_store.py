"""`gpufed token ... --store-url`: tokens read and written in the hub's database directly.

For a hub nobody holds a token for yet (bootstrap), and for revoking a leaked token when no
other admin token is at hand: whoever can write that database is an admin already. Each write
is audited there as actor `store`; a running hub sees a revocation within its token cache's
5 s (`hub.auth.TOKEN_CACHE_S`). A URL that holds no hub store is refused, never made into one.
Errors are ValueErrors in words, the URL's password masked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub.authstore import AuthStore, TokenRecord


def create_in_store(
    url: str, user: str, role: str, team: str | None, ttl: float | None
) -> dict[str, Any]:
    """Mint a token in the hub's store at `url`: its record, and `token`, the secret."""
    from hub.core.access import Role
    from hub.errors import HubError
    from hub.tokens import check_grant, mint_token

    try:
        check_grant(user, Role(role), team)  # before the store: a typo needs no database
    except HubError as exc:
        raise ValueError(exc.message) from None
    with _auth_store(url) as auth:
        now = time.time()
        token, record = mint_token(
            auth, user=user, role=Role(role), team=team, created_by="store", now=now, ttl_s=ttl
        )
        _audit(auth, "token.create", record, f"{user} {role} (gpufed token create --store-url)")
    return {**_out(record), "token": token}


def tokens_in_store(url: str) -> list[dict[str, Any]]:
    """Every token of the hub's store at `url`, without secrets."""
    with _auth_store(url) as auth:
        return [_out(record) for record in auth.tokens()]


def revoke_in_store(url: str, token_id: str) -> dict[str, Any]:
    """Revoke `token_id` in the hub's store at `url`; its record (ValueError: no such token)."""
    with _auth_store(url) as auth:
        if not auth.revoke_token(token_id, time.time()):
            raise ValueError(f"no token {token_id} in that store (gpufed token list --store-url)")
        record = auth.token(token_id)
        assert record is not None
        _audit(auth, "token.revoke", record, "gpufed token revoke --store-url")
    return _out(record)


def _out(record: TokenRecord) -> dict[str, Any]:
    return record.model_dump(exclude={"secret_hash"})


def _audit(auth: AuthStore, action: str, record: TokenRecord, detail: str) -> None:
    from hub.audit import MAX_DETAIL
    from hub.authstore import AuditEntry

    entry = AuditEntry(
        at=time.time(),
        actor="store",
        role="admin",
        action=action,
        team=record.team,
        target=record.id,
        result="ok",
        detail=detail[:MAX_DETAIL],
        via="store",  # the database's own credentials, no token
    )
    auth.append_audit(entry)


@contextmanager
def _auth_store(url: str) -> Iterator[AuthStore]:
    """The tokens and audit log of the hub's store at `url`, which must exist."""
    from sqlalchemy.exc import SQLAlchemyError

    from bus.urls import mask_url
    from hub.authstore import AuthStore
    from hub.store import Store

    try:
        missing = _no_store_at(url)  # never a new, empty store the hub does not read
        if missing:
            raise ValueError(
                f"cannot open the hub's store {mask_url(url)}: {missing} (a hub makes its store "
                "at its first start: give the URL it runs with)"
            )
        store = Store(url)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise ValueError(
            f"cannot open the hub's store {mask_url(url)}: {mask_url(reason)}"
        ) from None
    try:
        yield AuthStore(store.engine)
    finally:
        store.close()


def _no_store_at(url: str) -> str | None:
    """Why `url` holds no hub store, or None. Opening it as one would make it (a new SQLite
    file, tables in an empty database), and a token minted there is one no hub knows."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from hub.engine import engine_for
    from hub.migrations import current_version

    parsed = make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and not Path(parsed.database or "").is_file():
        return "no such file"
    # Looked at, not written: the store's engine would turn another database's journal to WAL.
    engine = create_engine(parsed) if sqlite else engine_for(url)
    try:
        return "it holds no gpufed tables" if current_version(engine) == 0 else None
    finally:
        engine.dispose()
