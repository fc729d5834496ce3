"""Errors of the hub, split by what the caller should do (the shape is `schemas.errors`)."""

from __future__ import annotations

from schemas.errors import GpufedError


class HubError(GpufedError):
    """Root of the hub's errors. `code` is stable; the message is for people."""

    code = "hub_error"


class InvalidWorkload(HubError):
    code = "invalid_workload"


class InvalidRequest(HubError):
    """A request that is wrong other than in a workload's or the policy's body: a query
    parameter, a token to mint, a time window."""

    code = "invalid_request"


class KeyReused(InvalidRequest):
    """An Idempotency-Key sent before with another spec: the two are not one request."""

    code = "idempotency_key_reused"


class NotFound(HubError):
    code = "not_found"


class Conflict(HubError):
    code = "conflict"


class Unavailable(HubError):
    """The store or the bus is down; try again."""

    code = "unavailable"
    retryable = True


class StoreUnavailable(Unavailable):
    """The hub's store does not answer: the same request may work in a moment (a write sent
    again under its Idempotency-Key is taken at most once)."""

    code = "store_unavailable"


class NotLeader(Unavailable):
    """This hub is a standby: it answers reads; writes go to the leader."""

    code = "not_leader"


class InvalidPolicy(HubError):
    """A policy the hub refuses; the one in force stays."""

    code = "invalid_policy"


class Forbidden(HubError):
    code = "forbidden"


class Unauthenticated(HubError):
    """No bearer token, or one the hub does not accept (401)."""

    code = "unauthenticated"


class TooMany(HubError):
    """A per-team cap is reached (429); try again once some of the team's work has left."""

    code = "too_many_queued"
    retryable = True


class RateLimited(TooMany):
    """The caller made more requests than its rate allows (429, with Retry-After)."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
