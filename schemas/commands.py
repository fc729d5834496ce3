"""What the hub tells a spoke to do."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from schemas.common import MAX_EPOCH, Identifier, ShortText, WireModel, is_json_array
from schemas.workloads import WorkloadSpec


class Assignment(WireModel):
    """GPUs of one node given to a workload: whole devices, or a share of one device."""

    node: str = Field(min_length=1, max_length=253)
    devices: tuple[int, ...] = Field(max_length=64)
    fraction: float | None = Field(default=None, gt=0, le=1)


class _CommandBase(WireModel):
    decision_id: Identifier
    workload_id: Identifier
    epoch: int = Field(
        ge=0, le=MAX_EPOCH, description="Assignment epoch; a spoke drops older ones."
    )
    term: int = Field(
        default=0, ge=0, description="The leading hub's term; a spoke drops older terms."
    )


class PlaceCommand(_CommandBase):
    """Run `spec` on the assigned devices."""

    kind: Literal["place"] = "place"
    spec: WorkloadSpec
    assignments: tuple[Assignment, ...] = Field(min_length=1)


class CancelCommand(_CommandBase):
    """Stop the workload now; it ends Cancelled."""

    kind: Literal["cancel"] = "cancel"
    reason: ShortText = ""


class PreemptCommand(_CommandBase):
    """Stop the workload after `grace_s` (SIGTERM, then SIGKILL); the hub requeues it."""

    kind: Literal["preempt"] = "preempt"
    reason: ShortText = ""
    grace_s: float = Field(default=30.0, ge=0, le=3600)


Command = Annotated[PlaceCommand | CancelCommand | PreemptCommand, Field(discriminator="kind")]
_COMMAND = TypeAdapter(Command)


def parse_command(data: bytes) -> PlaceCommand | CancelCommand | PreemptCommand:
    """Parse a command from its JSON bytes (raises pydantic.ValidationError)."""
    return _COMMAND.validate_json(data)


#: Most commands one message on `spoke.<id>.commands` carries, and about the most bytes (a
#: Place carries its spec): a cycle's commands to a spoke go in as few messages.
MAX_COMMANDS_PER_MESSAGE = 64
MAX_COMMANDS_BYTES = 256 * 1024

_COMMANDS: TypeAdapter[list[PlaceCommand | CancelCommand | PreemptCommand]] = TypeAdapter(
    Annotated[list[Command], Field(min_length=1, max_length=4 * MAX_COMMANDS_PER_MESSAGE)]
)


def parse_commands(data: bytes) -> list[PlaceCommand | CancelCommand | PreemptCommand]:
    """The commands of one message, in order: one command, or a JSON array of them (raises
    pydantic.ValidationError)."""
    if is_json_array(data):
        return _COMMANDS.validate_json(data)
    return [_COMMAND.validate_json(data)]
