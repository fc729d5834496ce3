"""What every API route depends on: the caller (`Caller`) and the hub's security objects."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated

from fastapi import Depends, Header, Query, Request
from starlette.requests import HTTPConnection

from hub.audit import Auditor
from hub.auth import Authenticator
from hub.authstore import AuditEntry, AuthStore
from hub.core.access import Principal
from hub.core.ratelimit import RateLimits
from hub.core.refusals import RefusalThrottle
from hub.errors import RateLimited
from hub.oidc import OidcSettings, OidcVerifier
from hub.service import HubService
from schemas import MAX_BATCH


class ApiSecurity:
    """What the routes need to authenticate, authorize and audit (kept in `app.state`)."""

    def __init__(
        self, hub: HubService, store: AuthStore, authenticator: Authenticator | None = None
    ) -> None:
        self.store = store
        self.db = hub.db
        self.clock = hub.clock
        # team -> burst dollars accrued this month; hub.spend.SpendMeter supplies it.
        self.month_spend: Callable[[], Mapping[str, float]] = dict
        oidc = None
        if hub.settings.oidc_config is not None:
            oidc = OidcVerifier(OidcSettings.load(hub.settings.oidc_config))
        self.authenticator = authenticator or Authenticator(
            self.store, hub.db, hub.clock, admin_token=hub.settings.admin_token, oidc=oidc
        )
        listed, window_s = hub.settings.audit_refusals_listed, hub.settings.audit_refusals_window_s
        refusals = RefusalThrottle[AuditEntry](listed, window_s) if listed else None
        self.auditor = Auditor(self.store, hub.db, hub.clock, refusals)
        rate, burst = hub.settings.api_rate_per_s, hub.settings.api_burst
        # Requests per caller (admins are not limited): None when the hub is told not to.
        self.limits = RateLimits(rate, burst) if rate > 0 else None

    def admit(self, who: Principal) -> None:
        """Raise RateLimited when `who` has made more requests than its rate allows."""
        if self.limits is None or who.admin:
            return
        wait = self.limits.take((who.user, who.via), self.clock())
        if wait > 0:
            limits = self.limits
            raise RateLimited(
                f"{who.user} made more than {limits.burst} requests at once or "
                f"{limits.rate_per_s:g} a second; try again in {wait:.1f} s (a batch, "
                f"POST /v1/workloads:batch, submits up to {MAX_BATCH:,} workloads as one request)",
                retry_after_s=wait,
            )


def security(request: HTTPConnection) -> ApiSecurity:
    """The app's ApiSecurity (of a request's app, or a WebSocket's)."""
    sec: ApiSecurity = request.app.state.security
    return sec


async def current_principal(
    request: Request,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    """The authenticated caller; raises Unauthenticated (401) without a valid bearer token,
    RateLimited (429) past its rate of requests."""
    sec = security(request)
    who = await sec.authenticator.authenticate(authorization)
    sec.admit(who)
    return who


Caller = Annotated[Principal, Depends(current_principal)]
Security = Annotated[ApiSecurity, Depends(security)]
#: A time in a query (`since=`, `until=`): unix seconds, finite and not before 1970, so a
#: `nan` or `-inf` is a 422 naming it rather than a window that counts nonsense.
Instant = Annotated[float, Query(ge=0, le=1e11, allow_inf_nan=False)]
