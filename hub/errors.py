"""Errors of the hub, split by what the caller should do."""

from __future__ import annotations


class HubError(Exception):
    """Root of the hub's errors. `code` is stable; the message is for people."""

    code = "hub_error"
    retryable = False

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidWorkload(HubError):
    code = "invalid_workload"


class NotFound(HubError):
    code = "not_found"


class Conflict(HubError):
    code = "conflict"


class Unavailable(HubError):
    """The store or the bus is down; try again."""

    code = "unavailable"
    retryable = True


class InvalidPolicy(HubError):
    """A policy the hub refuses; the one in force stays."""

    code = "invalid_policy"


class Forbidden(HubError):
    code = "forbidden"
