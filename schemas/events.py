"""What a spoke reports about the workloads it runs."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, TypeAdapter

from schemas.common import (
    MAX_EPOCH,
    EventId,
    Identifier,
    LongText,
    ShortText,
    SpokeId,
    WireModel,
    is_json_array,
)


class EventPhase(StrEnum):
    """Phase changes a spoke observes."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    REJECTED = "rejected"  # the spoke could not start it (bad assignment, runtime error)


class WorkloadEvent(WireModel):
    """One phase change of one workload under one assignment epoch."""

    event_id: EventId = Field(description="Unique per event; used as the Nats-Msg-Id.")
    spoke_id: SpokeId
    workload_id: Identifier
    epoch: int = Field(ge=0, le=MAX_EPOCH)
    phase: EventPhase
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31)
    reason: ShortText = ""
    message: LongText = ""
    at: float = Field(description="Spoke clock, seconds since the epoch.")
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="With `running`, for a session or service: the URL its spoke exposes it at.",
    )


def without_log_path(message: str) -> str:
    """An event's message without the `log <path>` part a spoke adds to an end (`exit code 3;
    log /var/lib/...`): the path is on the spoke's host, of no use where the message is read
    elsewhere (`gpufed logs` fetches the log itself)."""
    return "; ".join(p for p in message.split("; ") if not p.startswith("log "))


#: Most events one message on `spoke.<id>.events` carries, and about the most bytes: a spoke's
#: outbox sends what has queued up in as few messages (a RUNNING wave of a cycle's starts is
#: one), far inside nats-server's 1 MB max_payload.
MAX_EVENTS_PER_MESSAGE = 64
MAX_EVENTS_BYTES = 256 * 1024

_EVENT_LIST: TypeAdapter[list[WorkloadEvent]] = TypeAdapter(
    Annotated[list[WorkloadEvent], Field(min_length=1, max_length=4 * MAX_EVENTS_PER_MESSAGE)]
)


def parse_events(data: bytes) -> list[WorkloadEvent]:
    """The events of one message on `spoke.<id>.events`, in order: one event, or a JSON array
    of them. Raises pydantic's ValidationError for anything else."""
    if is_json_array(data):
        return _EVENT_LIST.validate_json(data)
    return [WorkloadEvent.model_validate_json(data)]
