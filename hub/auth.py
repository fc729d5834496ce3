"""Who is calling: bearer tokens of the REST API turned into a `Principal`.

Three kinds of bearer token are accepted, tried in this order:

1. a gpufed API token (`gpufed_<id>_<secret>`, `hub.tokens`), looked up by id and checked by
   the hash of its secret in constant time;
2. an OIDC JWT, when the hub has an OIDC configuration (`hub.oidc`);
3. the static admin token of `--admin-token-file` / `$GPUFED_ADMIN_TOKEN`, when set (compared in
   constant time).

Anything else, or no `Authorization` header, is `InvalidToken` (401).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.to_thread

from hub.authstore import AuthStore, TokenRecord
from hub.core.access import Principal
from hub.oidc import OidcVerifier, looks_like_jwt
from hub.tokens import InvalidToken, token_id_of, verify_token

T = TypeVar("T")
Db = Callable[..., Awaitable[Any]]

#: How long a looked-up token row is trusted before it is read again (a revocation through
#: this hub's API takes effect at once; one made straight in the store within this time).
TOKEN_CACHE_S = 5.0
_MAX_CACHED = 10_000


class Authenticator:
    """Maps an `Authorization` header to a principal; raises InvalidToken (401) otherwise."""

    def __init__(
        self,
        store: AuthStore,
        db: Db,
        clock: Callable[[], float],
        *,
        admin_token: str | None = None,
        oidc: OidcVerifier | None = None,
    ) -> None:
        self.store = store
        self._db = db
        self._clock = clock
        self._admin_hash = _sha256(admin_token) if admin_token else None
        self._oidc = oidc
        self._cache: dict[str, tuple[TokenRecord | None, float]] = {}

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an `Authorization: Bearer ...` header value."""
        if not authorization:
            raise InvalidToken("this needs a bearer token (Authorization: Bearer <token>)")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise InvalidToken("the Authorization header must be `Bearer <token>`")
        now = self._clock()
        token_id = token_id_of(token)
        if token_id is not None:
            return verify_token(await self._record(token_id, now), token, now)
        if self._oidc is not None and looks_like_jwt(token):
            return await anyio.to_thread.run_sync(self._oidc.verify, token)
        if self._admin_hash is not None and hmac.compare_digest(self._admin_hash, _sha256(token)):
            return Principal(user="admin", admin=True, via="admin-token")
        raise InvalidToken("unknown or malformed token")

    def forget(self, token_id: str) -> None:
        """Drop a cached token row (after it was revoked)."""
        self._cache.pop(token_id, None)

    async def _record(self, token_id: str, now: float) -> TokenRecord | None:
        cached = self._cache.get(token_id)
        if cached is not None and now - cached[1] < TOKEN_CACHE_S:
            return cached[0]
        record = await self._db(self.store.token, token_id)
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()  # guessed ids must not grow memory without bound
        self._cache[token_id] = (record, now)
        return record  # type: ignore[no-any-return]


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()
