"""Errors of the burst service, split by what the caller should do."""

from __future__ import annotations

from burst.core.model import OfferKey


class BurstError(Exception):
    """Root of burst's errors. `code` is the provider's error code when there is one."""

    retryable: bool = False

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class RetryableBurstError(BurstError):
    """Try again later: throttled, provider unavailable, capacity exhausted."""

    retryable = True


class PermanentBurstError(BurstError):
    """Retrying the same call will not help: bad configuration, no permission, quota reached."""


class CatalogError(PermanentBurstError):
    """The instance catalog cannot be read or is invalid."""


class InsufficientCapacityError(RetryableBurstError):
    """The provider has no capacity for this offer now: block it for a while, try the next."""

    def __init__(self, offer: OfferKey, message: str, *, code: str = "") -> None:
        super().__init__(message, code=code)
        self.offer = offer


class InstanceLimitError(PermanentBurstError):
    """An account quota (instances, vCPUs, spot requests) is reached: ask for a higher quota.

    Other instance families may still have room, so the caller may try the next offer.
    """

    def __init__(self, offer: OfferKey, message: str, *, code: str = "") -> None:
        super().__init__(message, code=code)
        self.offer = offer


class UnauthorizedError(PermanentBurstError):
    """The credentials are missing, invalid, or lack a permission burst needs."""
