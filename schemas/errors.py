"""One error shape for every gpufed service: a stable code, a message, the field at fault, and
whether trying again may help.

`GpufedError` is the root of `HubError`, `SpokeError` and `BurstError`; `ErrorReply` is the
same shape on the wire (REST error bodies and NATS replies). A cloud provider's own error code
is never our `code`: it travels as `provider_code` on burst's errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field, field_validator

from schemas.common import PATTERN_MEANINGS, SpecParts, WireModel, unknown_names, unknown_text


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


#: Where FastAPI says a problem was (`loc`'s first part): not a field of ours.
_REQUEST_PARTS = frozenset({"body", "query", "path", "header"})


def in_model(loc: Sequence[Any]) -> tuple[Any, ...]:
    """A problem's place in the model: `loc` without FastAPI's leading `body`, `query`..."""
    return tuple(loc[1:]) if loc[:1] and loc[0] in _REQUEST_PARTS else tuple(loc)


#: Problems named in one message; the rest are counted.
MAX_PROBLEMS_NAMED = 10


def describe_problems(errors: Sequence[Mapping[str, Any]]) -> tuple[str | None, str]:
    """pydantic's validation problems as (the field at fault in the first, a sentence about
    each, up to MAX_PROBLEMS_NAMED, counting the rest): "name: must be lower-case letters, ...
    (not 'Hello_1'); nodes: Input should be greater than or equal to 1". Every mistake of a
    spec at once: one fix and one resubmission, not one per mistake."""
    errors = _without_follow_ons(errors)
    if not errors:
        return None, "invalid"
    fields = [".".join(str(part) for part in in_model(e.get("loc", ()))) or None for e in errors]
    parts = [
        f"{field}: {problem_sentence(error)}" if field else problem_sentence(error)
        for field, error in zip(fields, errors[:MAX_PROBLEMS_NAMED], strict=False)
    ]
    text = "; ".join(parts)
    more = len(errors) - len(parts)
    if more:
        text += f" (and {more} more problem{'s' if more > 1 else ''})"
    return fields[0], text


def problems_unknown_first(
    errors: Sequence[Mapping[str, Any]],
    data: object,
    parts: SpecParts,
) -> tuple[str | None, str]:
    """Why `data` is no document (`describe_problems` of pydantic's `errors`), the fields it
    names that its models lack first: a typo (`gpu: 2`) beside a bad value is named with it,
    not once the value is fixed. `parts`: each model with the key it is under, with a dot
    (`""` for the document itself, `"affinity."` for `data["affinity"]`)."""
    field, text = describe_problems(errors)
    if not isinstance(data, Mapping):
        return field, text
    unknown: list[tuple[str, str | None]] = []
    for prefix, model in parts:
        part = data.get(prefix[:-1]) if prefix else data
        if isinstance(part, Mapping):
            unknown += unknown_names(part, model.model_fields, prefix)
    if not unknown:
        return field, text
    return unknown[0][0], f"{unknown_text(unknown)}; {text}"


def _without_follow_ons(errors: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Without a list's "too short" that only follows from a bad item in it (`command: [true]`
    is `command.0: ...`, not also `command: ... at least 1 item`)."""
    inside = {tuple(e.get("loc", ()))[:-1] for e in errors}
    return [
        e
        for e in errors
        if not (e.get("type") == "too_short" and tuple(e.get("loc", ())) in inside)
    ]


def problem_sentence(problem: Mapping[str, Any]) -> str:
    """One pydantic problem in words: a broken naming rule says the rule, not its pattern; a
    boolean where text belongs says how YAML made it one."""
    given = problem.get("input")
    if problem.get("type") == "string_type" and isinstance(given, bool):
        return (
            f"must be text, not {str(given).lower()} (YAML reads unquoted yes, no, on, off, "
            "true and false as booleans: quote it)"
        )
    if problem.get("type") == "string_pattern_mismatch":
        meaning = PATTERN_MEANINGS.get((problem.get("ctx") or {}).get("pattern", ""))
        if meaning is not None:
            shown = f" (not {given!r})" if isinstance(given, str) and len(given) <= 80 else ""
            return f"must be {meaning}{shown}"
    return str(problem.get("msg", "invalid")).removeprefix("Value error, ")
