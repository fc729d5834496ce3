"""Plain models of what the hub keeps: the rest of the hub sees these, never the tables."""

from __future__ import annotations

from pydantic import BaseModel, Field

from schemas import Assignment, CapacityReport, Phase, WorkloadSpec


class HistoryEntry(BaseModel):
    """One thing that happened to a workload (kept across requeues)."""

    at: float
    event: str
    epoch: int = 0
    spoke_id: str | None = None
    detail: str = ""


class WorkloadRecord(BaseModel):
    """A workload as the hub tracks it."""

    id: str
    spec: WorkloadSpec
    phase: Phase = Phase.QUEUED
    epoch: int = 0
    spoke_id: str | None = None
    assignments: tuple[Assignment, ...] = ()
    submitted_at: float
    placed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    restarts: int = 0
    cancel_requested: bool = False
    preempting: bool = False
    preempted_for: str | None = None  # the pending workload it is being stopped for
    command_seq: int | None = None  # command stream sequence of the current Place
    history: list[HistoryEntry] = Field(default_factory=list)

    def note(self, at: float, event: str, detail: str = "") -> None:
        """Append to the history (the API shows it; requeues keep it)."""
        self.history.append(
            HistoryEntry(
                at=at, event=event, epoch=self.epoch, spoke_id=self.spoke_id, detail=detail
            )
        )


class DecisionRecord(BaseModel):
    """A command the hub decided to send; kept until the bus has acknowledged it."""

    decision_id: str
    workload_id: str
    spoke_id: str
    subject: str
    payload: bytes
    created_at: float
    published: bool = False


class SpokeRecord(BaseModel):
    """A spoke as last heard of."""

    id: str
    region: str
    kind: str
    first_seen: float
    last_seen: float
    lost_at: float | None = None  # declared lost (its work was moved); cleared when it returns
    report: CapacityReport | None = None
