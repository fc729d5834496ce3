"""Errors of the spoke, split by what the caller should do."""

from __future__ import annotations


class SpokeError(Exception):
    """Root of the spoke's errors."""

    retryable: bool = False


class RetryableSpokeError(SpokeError):
    """Try again later: the API server or the bus is unavailable, a watch expired."""

    retryable = True


class PermanentSpokeError(SpokeError):
    """Retrying will not help: bad configuration, invalid assignment, no GPUs found."""
