"""One error shape for every gpufed service: a stable code, a message, the field at fault, and
whether trying again may help.

`GpufedError` is the root of `HubError`, `SpokeError` and `BurstError`; `ErrorReply` is the
same shape on the wire (REST error bodies and NATS replies). A cloud provider's own error code
is never our `code`: it travels as `provider_code` on burst's errors.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from schemas.common import WireModel


class ErrorReply(WireModel):
    """A refusal a person can act on: a stable `code`, a message, and the field at fault.

    `retryable` says whether the same request may succeed later (the service was unavailable)
    or must change first (it was invalid); it was added after v1, hence its default.
    """

    code: str = Field(max_length=64)
    message: str = Field(max_length=4096)
    field: str | None = Field(default=None, max_length=256)
    retryable: bool = False

    @field_validator("message", mode="before")
    @classmethod
    def _shorten(cls, value: Any) -> Any:
        # Written by us, often around a user's input: cut to the bound rather than fail.
        if isinstance(value, str) and len(value) > 4096:
            return value[:4093] + "..."
        return value


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
