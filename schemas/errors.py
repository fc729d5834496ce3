"""One error shape for every gpufed service: a stable code, a message, the field at fault, and
whether trying again may help.

`GpufedError` is the root of `HubError`, `SpokeError` and `BurstError`; `ErrorReply` is the
same shape on the wire (REST error bodies and NATS replies). A cloud provider's own error code
is never our `code`: it travels as `provider_code` on burst's errors.
"""

from __future__ import annotations

from typing import ClassVar

from schemas.common import WireModel


class ErrorReply(WireModel):
    """A refusal a person can act on: a stable `code`, a message, and the field at fault.

    `retryable` says whether the same request may succeed later (the service was unavailable)
    or must change first (it was invalid); it was added after v1, hence its default.
    """

    code: str
    message: str
    field: str | None = None
    retryable: bool = False


class GpufedError(Exception):
    """Root of every gpufed error: (code, message, field, retryable).

    Subclasses set `code` (stable, snake_case, for programs) and `retryable` (what the caller
    should do); the message is for people. `field` names the input at fault, when there is one.
    """

    code: ClassVar[str] = "error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def reply(self) -> ErrorReply:
        """This error as its wire model."""
        return ErrorReply(
            code=self.code, message=self.message, field=self.field, retryable=self.retryable
        )
