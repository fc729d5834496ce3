"""What a spoke reports about the workloads it runs."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from schemas.common import MAX_EPOCH, EventId, Identifier, LongText, ShortText, SpokeId, WireModel


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
