"""What a spoke reports about the workloads it runs."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from schemas.common import Identifier, WireModel


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

    event_id: Identifier = Field(description="Unique per event; used as the Nats-Msg-Id.")
    spoke_id: Identifier
    workload_id: Identifier
    epoch: int = Field(ge=0)
    phase: EventPhase
    exit_code: int | None = None
    reason: str = ""
    message: str = Field(default="", max_length=4096)
    at: float = Field(description="Spoke clock, seconds since the epoch.")
