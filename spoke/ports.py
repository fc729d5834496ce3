"""The spoke's ports: where GPUs come from (Inventory) and how work runs (Runtime)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from schemas import Assignment, EventPhase, RuntimeCapabilities, WorkloadSpec


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """One GPU node as the inventory sees it.

    `busy_outside` counts devices in use by something gpufed did not start (other pods, a
    person's process): the spoke never hands those out.
    """

    name: str
    gpu_model: str
    gpu_count: int
    labels: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True
    busy_outside: int = 0


class Inventory(Protocol):
    """Source of the spoke's GPU nodes."""

    async def nodes(self) -> list[NodeInventory]:
        """Current nodes. Read-only and repeatable; raises SpokeError when the source fails."""
        ...


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything a runtime needs to start one workload under one assignment epoch."""

    workload_id: str
    epoch: int
    decision_id: str
    spec: WorkloadSpec
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """A phase change the runtime observed."""

    workload_id: str
    epoch: int
    phase: EventPhase
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    endpoint: str = ""  # with RUNNING, for a session or service: the URL it is reached at


EventSink = Callable[[RuntimeEvent], Awaitable[None]]


class Runtime(Protocol):
    """Runs workloads on this spoke's GPUs and reports what happens to them.

    A runtime is given an EventSink when it is built; it calls it with RUNNING once a workload
    has started and with exactly one terminal phase (SUCCEEDED, FAILED, CANCELLED, PREEMPTED)
    when it ends.
    """

    async def start(self, launch: Launch) -> None:
        """Start a workload; returns once it is started, not when it ends.

        Idempotent per (workload_id, epoch): starting one that is already known is a no-op.
        Raises SpokeError when it cannot be started (the spoke reports it REJECTED).
        """
        ...

    async def stop(self, workload_id: str, grace_s: float, phase: EventPhase) -> None:
        """Stop a workload: ask it to end, kill it after `grace_s`, report `phase`.

        Idempotent; an unknown or already finished workload is a no-op. Returns once it is gone.
        """
        ...

    async def adopt(self) -> dict[str, int]:
        """Find workloads a previous process of this spoke started and watch them again.

        Called once at start-up, before any command is consumed. Returns workload id -> epoch
        of those still running; those that ended meanwhile are reported through the sink.
        """
        ...

    def running(self) -> dict[str, int]:
        """Workloads started and not yet ended: workload id -> epoch."""
        ...

    def capabilities(self) -> RuntimeCapabilities:
        """What this runtime can run (the hub places nothing else here). Pure, cheap."""
        ...

    async def close(self) -> None:
        """Stop watching (workloads keep running; a restarted spoke re-adopts them)."""
        ...


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Bytes [offset, next_offset) of a workload's log; `size` is the file's size then."""

    data: bytes
    offset: int
    next_offset: int
    size: int
    epoch: int


@runtime_checkable
class LogSource(Protocol):
    """A runtime that can hand out its workloads' logs (the local runtime's files)."""

    def read_log(
        self, workload_id: str, epoch: int | None, offset: int | None, max_bytes: int
    ) -> LogChunk:
        """Up to `max_bytes` from `offset` (None: the last `max_bytes`) of the log of
        `workload_id` under `epoch` (None or absent: the latest epoch it has a log of).

        Blocking (reads a file); read-only. Raises SpokeError when there is no such log.
        """
        ...
