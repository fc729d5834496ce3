"""Plain data the placement core decides with, and the plan it returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from schemas import Assignment, SpokeKind, WorkloadSpec


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node as the hub sees it now, assumed allocations already taken off."""

    name: str
    gpu_model: str
    gpu_count: int
    free: tuple[int, ...]  # wholly free device indexes, ascending
    free_fraction: Mapping[int, float] = field(default_factory=dict)  # shared devices
    labels: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True


@dataclass(frozen=True, slots=True)
class Spoke:
    """A cluster that can take work."""

    id: str
    region: str
    kind: SpokeKind
    nodes: tuple[Node, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    accepts_work: bool = True  # False while its lease is suspect
    price_per_gpu_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The fleet at one instant."""

    spokes: tuple[Spoke, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload waiting for GPUs."""

    id: str
    spec: WorkloadSpec
    submitted_at: float  # seconds; the hub's clock at submission


@dataclass(frozen=True, slots=True)
class RunningWorkload:
    """A workload that holds GPUs (placed or running)."""

    id: str
    spec: WorkloadSpec
    spoke_id: str
    assignments: tuple[Assignment, ...]
    started_at: float


class Reason(StrEnum):
    """Why a workload was left pending: stable codes for machines."""

    NO_SPOKES = "no_spokes"
    NO_MATCHING_MODEL = "no_matching_model"
    NO_MATCHING_REGION = "no_matching_region"
    INSUFFICIENT_FREE = "insufficient_free"
    SHAPE_NEVER_FITS = "shape_never_fits"


@dataclass(frozen=True, slots=True)
class Placement:
    workload_id: str
    spoke_id: str
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True, slots=True)
class Preemption:
    workload_id: str
    spoke_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Unplaced:
    workload_id: str
    reason: Reason
    message: str  # a sentence a person can act on


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
