"""Errors of the spoke, split by what the caller should do (the shape is `schemas.errors`)."""

from __future__ import annotations

from schemas.errors import GpufedError


class SpokeError(GpufedError):
    """Root of the spoke's errors."""

    code = "spoke_error"


class RetryableSpokeError(SpokeError):
    """Try again later: the API server or the bus is unavailable, a watch expired."""

    code = "spoke_unavailable"
    retryable = True


class PermanentSpokeError(SpokeError):
    """Retrying will not help: bad configuration, invalid assignment, no GPUs found."""

    code = "spoke_invalid"
