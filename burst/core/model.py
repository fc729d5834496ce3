"""Plain data the burst planner decides with, and the plan it returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from schemas.burst import DemandItem, InstanceState, Market


@dataclass(frozen=True, slots=True, order=True)
class OfferKey:
    """What a capacity error blocks: one instance type, in one region, bought one way."""

    instance_type: str
    region: str
    market: Market


@dataclass(frozen=True, slots=True)
class Offer:
    """One way to buy GPUs: an instance type in a region, spot or on-demand, at a price."""

    instance_type: str
    region: str
    market: Market
    price_per_hour: float
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float = 0.0

    @property
    def key(self) -> OfferKey:
        return OfferKey(self.instance_type, self.region, self.market)


@dataclass(frozen=True, slots=True)
class CloudInstance:
    """A burst instance as the store knows it.

    `id` is its burst id (the launch's request id, what Provisioner.terminate takes). `state`
    REQUESTED means booting: launched, its spoke has not joined yet. `idle_since` is when
    its spoke last stopped running any workload (None while busy or booting). `workload_ids` are
    the pending workloads it was launched for.
    """

    id: str
    instance_type: str
    region: str
    market: Market
    team: str
    state: InstanceState
    launched_at: float
    price_per_hour: float
    zone: str = ""
    idle_since: float | None = None
    runs_non_preemptible: bool = False
    workload_ids: tuple[str, ...] = ()


class MarketPreference(StrEnum):
    # Spot and on-demand offers compete on price (spot wins ties); spot is skipped for work that
    # must not be interrupted, and on-demand takes over while spot offers are blocked.
    SPOT_FIRST = "spot_first"
    ON_DEMAND_ONLY = "on_demand_only"


@dataclass(frozen=True, slots=True)
class TeamBudget:
    """A team's limits: a $/h rate over its live instances, and/or a total $ it may accrue.

    Once `dollars_total` is reached no new instance is launched for the team (those running
    keep running until idle release).
    """

    dollars_per_hour: float | None = None
    dollars_total: float | None = None
    #: `dollars_total` is what the hub's policy leaves the team this month (`burst_budget.
    #: dollars_per_month`) over what this controller counted, not a total of its own.
    monthly: bool = False


@dataclass(frozen=True, slots=True)
class BurstPolicy:
    """Knobs of the burst planner. Times are seconds; None means unlimited."""

    burst_after_s: float = 60.0
    idle_ttl_s: float = 300.0
    cooldown_s: float = 120.0
    capacity_backoff_s: float = 180.0
    boot_timeout_s: float = 1200.0
    demand_stale_s: float = 120.0
    max_instances: int | None = 10
    max_dollars_per_hour: float | None = None
    team_budgets: Mapping[str, TeamBudget] = field(default_factory=dict)
    allowed_teams: frozenset[str] | None = None
    markets: MarketPreference = MarketPreference.SPOT_FIRST
    regions: frozenset[str] | None = None
    # Waiting budget (Starburst): demand bursts once its oldest workload has waited
    # burst_after_s + wait_per_gpu_s x its GPUs: big jobs wait longer, since on-prem frees
    # for them, and small ones burst soon, where a cloud instance is cheap.
    wait_per_gpu_s: float = 0.0
    # One instance per single-node workload, the cheapest that holds it, instead of packing
    # several onto big instances that stay billed until their longest job ends.
    right_size: bool = True
    # Demand of work that ran before (DemandItem.attained_s > 0: preempted, requeued) bursts
    # only if True. Such work has started, so bursting it cuts no one's wait, and with
    # heavy-tailed run times it is the long work that makes the cloud bill.
    burst_restarted: bool = False

    def waiting_budget_s(self, item: DemandItem) -> float:
        """How long `item`'s oldest workload waits on-prem before it may burst."""
        gpus = (item.gpu_fraction or item.gpus_per_node) * item.nodes
        return self.burst_after_s + self.wait_per_gpu_s * gpus

    def __post_init__(self) -> None:
        for name in (
            "burst_after_s",
            "wait_per_gpu_s",
            "idle_ttl_s",
            "cooldown_s",
            "capacity_backoff_s",
            "boot_timeout_s",
            "demand_stale_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.max_instances is not None and self.max_instances < 0:
            raise ValueError("max_instances must not be negative")
        if self.max_dollars_per_hour is not None and self.max_dollars_per_hour < 0:
            raise ValueError("max_dollars_per_hour must not be negative")


@dataclass(frozen=True, slots=True)
class PlannerState:
    """What the planner remembers between rounds; changed only by the pure helpers in state.py.

    `last_launch_at` / `last_terminate_at`: team -> time of its latest launch / termination
    (cooldowns). `blocked`: offer -> time until which it is skipped after a capacity error.
    `team_spend`: team -> dollars accrued so far (for `TeamBudget.dollars_total`).
    """

    last_launch_at: Mapping[str, float] = field(default_factory=dict)
    last_terminate_at: Mapping[str, float] = field(default_factory=dict)
    blocked: Mapping[OfferKey, float] = field(default_factory=dict)
    team_spend: Mapping[str, float] = field(default_factory=dict)


class SkipReason(StrEnum):
    """Why pending demand got no instance this round."""

    STALE_DEMAND = "stale_demand"  # the report is too old to act on
    TOO_YOUNG = "too_young"  # younger than burst_after: on-prem may still free up
    RESTARTED = "restarted"  # it ran before and burst_restarted is off
    COVERED = "covered"  # an instance already launched for these workloads
    TEAM_NOT_ALLOWED = "team_not_allowed"
    TEAM_BUDGET_SPENT = "team_budget_spent"
    COOLDOWN = "cooldown"  # a recent launch is still booting, or the team just released one
    NO_OFFER = "no_offer"  # no catalog instance type fits the shape in an allowed region
    CAPACITY_BACKOFF = "capacity_backoff"  # every fitting offer is blocked after capacity errors
    MAX_INSTANCES = "max_instances"
    GLOBAL_BUDGET = "global_budget"
    TEAM_BUDGET = "team_budget"


class TerminateReason(StrEnum):
    IDLE = "idle"  # spoke idle longer than idle_ttl
    BOOT_TIMEOUT = "boot_timeout"  # its spoke never joined


@dataclass(frozen=True, slots=True)
class Launch:
    """Start one instance. `request_id` is the idempotency key and becomes the spoke id."""

    request_id: str
    instance_type: str
    region: str
    market: Market
    team: str
    price_per_hour: float
    gpu_model: str
    gpu_count: int
    workload_ids: tuple[str, ...]

    @property
    def offer(self) -> OfferKey:
        return OfferKey(self.instance_type, self.region, self.market)


@dataclass(frozen=True, slots=True)
class Terminate:
    """Terminate one instance."""

    instance_id: str
    team: str
    reason: TerminateReason
    message: str


@dataclass(frozen=True, slots=True)
class Skip:
    """`count` workloads of `item` (ids listed when known) got no instance, and why."""

    item: DemandItem
    reason: SkipReason
    message: str
    count: int
    workload_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BurstPlan:
    """What to do now. Empty lists mean nothing to do."""

    launches: tuple[Launch, ...] = ()
    terminations: tuple[Terminate, ...] = ()
    skipped: tuple[Skip, ...] = ()

    @property
    def dollars_per_hour(self) -> float:
        """Added cost rate of the launches."""
        return sum(launch.price_per_hour for launch in self.launches)


class InstanceShape(Protocol):
    """What the planner reads of one instance type."""

    @property
    def gpu_model(self) -> str: ...


class OfferCatalog(Protocol):
    """What the planner reads of the instance catalog (`burst.catalog.Catalog` is one).

    Both methods are pure lookups: no I/O, the same answer every call.
    """

    def offers(self) -> tuple[Offer, ...]:
        """Every (instance type, region, market) the catalog prices, in a stable order."""
        ...

    def get(self, name: str) -> InstanceShape | None:
        """The instance type called `name`; None when the catalog does not list it."""
        ...
