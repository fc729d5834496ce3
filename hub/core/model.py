"""Plain data the placement core decides with, and the plan it returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from schemas import Assignment, RuntimeCapabilities, SpokeKind, WorkloadKind, WorkloadSpec
from schemas.workloads import Affinity


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
    # When set, only these teams may place here (a cloud spoke launched for their demand).
    reserved_for: tuple[str, ...] = ()
    # What its runtime can run (fractions, gangs, MIG): nothing else is placed here.
    capabilities: RuntimeCapabilities = field(default_factory=RuntimeCapabilities)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The fleet at one instant."""

    spokes: tuple[Spoke, ...]


class SpecLike(Protocol):
    """What placement reads of a workload's spec: a `WorkloadSpec`, or its `Need`."""

    @property
    def team(self) -> str: ...
    @property
    def priority_class(self) -> str: ...
    @property
    def kind(self) -> WorkloadKind: ...
    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def gpu_fraction(self) -> float | None: ...
    @property
    def gpu_models(self) -> tuple[str, ...]: ...
    @property
    def affinity(self) -> Affinity: ...
    @property
    def total_gpus(self) -> float: ...


class Need:
    """A spec's fields that placement reads, copied into slots once per view.

    A plan reads these a few dozen times per decision and per running workload it looks at;
    from a pydantic model each read goes through the instance's `__dict__`, a separate object
    in memory, and `total_gpus` is a computed property. Read only, as the spec it copies.
    """

    __slots__ = (
        "affinity",
        "gpu_fraction",
        "gpu_models",
        "gpus_per_node",
        "kind",
        "nodes",
        "priority_class",
        "team",
        "total_gpus",
    )

    def __init__(self, spec: WorkloadSpec) -> None:
        self.team: str = spec.team
        self.priority_class: str = spec.priority_class
        self.kind: WorkloadKind = spec.kind
        self.nodes: int = spec.nodes
        self.gpus_per_node: int = spec.gpus_per_node
        self.gpu_fraction: float | None = spec.gpu_fraction
        self.gpu_models: tuple[str, ...] = spec.gpu_models
        self.affinity: Affinity = spec.affinity
        self.total_gpus: float = spec.total_gpus


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload waiting for GPUs."""

    id: str
    spec: WorkloadSpec
    submitted_at: float  # seconds; the hub's clock at submission
    # Its preemption victims have stopped: it goes first, so the devices freed for it reach
    # it rather than the victims (which would be preempted again, and again).
    claims_freed: bool = False
    # Spokes that rejected it (their runtime refused it): it is not sent back there.
    avoid_spokes: frozenset[str] = frozenset()
    # GPU-seconds it has run so far (earlier attempts): least attained service (ordering).
    attained_gpu_s: float = 0.0
    need: Need = field(init=False, repr=False, compare=False)  # `spec`, as placement reads it

    def __post_init__(self) -> None:
        object.__setattr__(self, "need", Need(self.spec))


@dataclass(frozen=True, slots=True)
class RunningWorkload:
    """A workload that holds GPUs (placed or running)."""

    id: str
    spec: WorkloadSpec
    spoke_id: str
    assignments: tuple[Assignment, ...]
    started_at: float
    # Set by the hub once a Preempt command went out: the devices are about to be freed, and
    # the workload is never chosen as a victim again.
    preempting: bool = False
    # The pending workload it was preempted for (Preemption.for_workload), when known: its
    # devices count toward that workload first.
    preempted_for: str | None = None
    # GPU-seconds run in earlier attempts (this one's run since started_at comes on top).
    attained_gpu_s: float = 0.0
    need: Need = field(init=False, repr=False, compare=False)  # `spec`, as placement reads it

    def __post_init__(self) -> None:
        object.__setattr__(self, "need", Need(self.spec))


class Reason(StrEnum):
    """Why a workload was left pending: stable codes for machines."""

    NO_SPOKES = "no_spokes"
    NO_MATCHING_MODEL = "no_matching_model"
    NO_MATCHING_REGION = "no_matching_region"
    NO_MATCHING_LABELS = "no_matching_labels"
    BURST_NOT_ALLOWED = "burst_not_allowed"
    RESERVED_FOR_OTHER_TEAMS = "reserved_for_other_teams"
    INSUFFICIENT_FREE = "insufficient_free"
    SHAPE_NEVER_FITS = "shape_never_fits"
    TEAM_LIMIT = "team_limit"
    DEPARTMENT_LIMIT = "department_limit"
    GUARANTEE_EXHAUSTED = "guarantee_exhausted"
    WAITING_FOR_PREEMPTION = "waiting_for_preemption"
    UNKNOWN_PRIORITY_CLASS = "unknown_priority_class"
    RUNTIME_REFUSES = "runtime_refuses"


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
    # The pending workload that needs the devices; the hub passes it back as
    # RunningWorkload.preempted_for while the victim stops.
    for_workload: str = ""


@dataclass(frozen=True, slots=True)
class Unplaced:
    workload_id: str
    reason: Reason
    message: str  # a sentence a person can act on
    # Running workloads it waits for (preempted for it, now stopping).
    waiting_for: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    # Of `unplaced`, those whose explanation is not the very object the last plan of the same
    # kept state gave (`hub.core.planstate.PlanState`): what changed, for a caller that applied
    # that plan. None: not known (every one may have changed).
    explained: tuple[Unplaced, ...] | None = field(default=None, compare=False)
