"""Errors of the burst service, split by what the caller should do (shape: `schemas.errors`)."""

from __future__ import annotations

from burst.core.model import OfferKey
from schemas.errors import GpufedError


class BurstError(GpufedError):
    """Root of burst's errors. `provider_code` is the cloud's own error code, when there is one."""

    code = "burst_error"

    def __init__(self, message: str, *, provider_code: str = "") -> None:
        super().__init__(message)
        self.provider_code = provider_code


class RetryableBurstError(BurstError):
    """Try again later: throttled, provider unavailable, capacity exhausted."""

    code = "burst_unavailable"
    retryable = True


class PermanentBurstError(BurstError):
    """Retrying the same call will not help: bad configuration, no permission, quota reached."""

    code = "burst_refused"


class CatalogError(PermanentBurstError):
    """The instance catalog cannot be read or is invalid."""

    code = "invalid_catalog"


class InsufficientCapacityError(RetryableBurstError):
    """The provider has no capacity for this offer now: block it for a while, try the next."""

    code = "insufficient_capacity"

    def __init__(self, offer: OfferKey, message: str, *, provider_code: str = "") -> None:
        super().__init__(message, provider_code=provider_code)
        self.offer = offer


class InstanceLimitError(PermanentBurstError):
    """An account quota (instances, vCPUs, spot requests) is reached: ask for a higher quota.

    Other instance families may still have room, so the caller may try the next offer.
    """

    code = "instance_limit"

    def __init__(self, offer: OfferKey, message: str, *, provider_code: str = "") -> None:
        super().__init__(message, provider_code=provider_code)
        self.offer = offer


class UnauthorizedError(PermanentBurstError):
    """The credentials are missing, invalid, or lack a permission burst needs."""

    code = "unauthorized"
