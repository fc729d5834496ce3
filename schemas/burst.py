"""Cloud burst: unplaceable demand (hub -> burst) and cloud instance events (burst -> hub)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from schemas.common import DnsLabel, Identifier, ShortText, SpokeId, WireModel
from schemas.workloads import MAX_GPUS_PER_NODE, MAX_NODES, GpuModel

#: Hub -> burst: demand the hub cannot place on any spoke it has.
BURST_DEMAND = "gpufed.v1.burst.demand"
#: Burst -> hub: lifecycle of the cloud instances burst launched.
BURST_INSTANCES = "gpufed.v1.burst.instances"
#: Burst -> hub: why its latest round rents nothing for waiting work (`BurstVerdicts`).
BURST_VERDICTS = "gpufed.v1.burst.verdicts"

MAX_DEMAND_ITEMS = 1024
MAX_WORKLOAD_IDS = 256


class Market(StrEnum):
    """How a cloud instance is bought."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"


class InstanceState(StrEnum):
    """Lifecycle of a burst instance.

    `requested`: asked of the cloud, its spoke has not joined yet (booting). `running`: its spoke
    joined the hub. `terminating`: asked to go away, still billed. `terminated`, `failed`: gone.
    """

    REQUESTED = "requested"
    RUNNING = "running"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"

    @property
    def gone(self) -> bool:
        """The instance no longer exists (terminated or failed): its spoke will not return."""
        return self is InstanceState.TERMINATED or self is InstanceState.FAILED

    @property
    def active(self) -> bool:
        """Exists (and is billed) at the cloud provider."""
        return self in (InstanceState.REQUESTED, InstanceState.RUNNING, InstanceState.TERMINATING)


class DemandItem(WireModel):
    """`count` identical pending workloads of one team that no spoke can serve.

    `workload_ids` lists up to MAX_WORKLOAD_IDS of them (`count` is authoritative when there
    are more). `oldest_age_s` is the age of the oldest one when the report was sent.
    """

    team: DnsLabel
    gpu_model: GpuModel | None = Field(default=None, description="None means any model.")
    gpus_per_node: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE)
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1)
    count: int = Field(default=1, ge=1, le=10_000_000)
    oldest_age_s: float = Field(ge=0)
    workload_ids: tuple[Identifier, ...] = Field(default=(), max_length=MAX_WORKLOAD_IDS)
    regions: tuple[DnsLabel, ...] = Field(
        default=(), max_length=32, description="Regions the workloads may run in; empty: any."
    )
    spot_ok: bool = Field(
        default=True, description="False for work that must not be interrupted: never on spot."
    )
    attained_s: float = Field(
        default=0.0,
        ge=0,
        description="Least run time (s) of these workloads' earlier attempts: > 0 when every "
        "one of them ran before and was preempted. Older hubs send 0.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DemandItem:
        if self.gpu_fraction is not None and (self.gpus_per_node != 1 or self.nodes != 1):
            raise ValueError("gpu_fraction needs gpus_per_node=1 and nodes=1")
        if len(self.workload_ids) > self.count:
            raise ValueError("more workload_ids than count")
        if len(set(self.workload_ids)) != len(self.workload_ids):
            raise ValueError("workload_ids repeat")
        return self


class TeamBurstBudget(WireModel):
    """One team's burst limits from the hub's policy (None: no limit)."""

    dollars_per_hour: float | None = Field(default=None, ge=0)
    dollars_left_this_month: float | None = Field(
        default=None, description="Its monthly budget less what the hub has accrued (>= 0)."
    )


class BurstBudget(WireModel):
    """The spend limits of the hub's policy, with the spend the hub's store has accrued.

    The controller applies the stricter of these and its own settings. `allowed_teams` None
    means any team the demand lists.
    """

    dollars_per_hour: float | None = Field(default=None, ge=0)
    allowed_teams: tuple[DnsLabel, ...] | None = Field(default=None, max_length=4096)
    teams: dict[str, TeamBurstBudget] = Field(default_factory=dict, max_length=4096)


class DemandReport(WireModel):
    """All unplaceable demand at one instant; each report replaces the previous one."""

    items: tuple[DemandItem, ...] = Field(default=(), max_length=MAX_DEMAND_ITEMS)
    sent_at: float = Field(description="Hub clock, seconds since the epoch.")
    seq: int = Field(ge=0, description="Increases with every report of one hub process.")
    budget: BurstBudget | None = Field(
        default=None, description="The hub policy's spend limits; None: the controller's own."
    )
    term: int = Field(default=0, ge=0, description="The sending hub's term; older ones ignored.")


class InstanceEvent(WireModel):
    """A state change of one burst instance (its `burst_id` is also its spoke id)."""

    burst_id: SpokeId
    provider: str = Field(min_length=1, max_length=32)
    instance_type: str = Field(min_length=1, max_length=64)
    region: DnsLabel
    zone: str = Field(default="", max_length=64)
    market: Market
    gpu_model: str = Field(default="", max_length=63)
    gpu_count: int = Field(default=0, ge=0, le=64)
    price_per_hour: float = Field(ge=0)
    team: DnsLabel
    state: InstanceState
    spoke_id: SpokeId | None = None
    reason: ShortText = ""
    at: float = Field(description="Burst service clock, seconds since the epoch.")
    provider_instance_id: str = Field(default="", max_length=64)
    workload_ids: tuple[Identifier, ...] = Field(default=(), max_length=MAX_WORKLOAD_IDS)


#: Burst -> hub, request/reply: the instances the hub's store knows (burst's state on restart).
BURST_STATE = "gpufed.v1.burst.state"
#: JetStream stream holding BURST_INSTANCES (the hub consumes it durably as `hub-burst`).
BURST_STREAM = "GPUFED_BURST"
HUB_BURST_CONSUMER = "hub-burst"


class BurstStateRequest(WireModel):
    provider: str = Field(default="", max_length=32)


class BurstStateReply(WireModel):
    """The latest event of every burst instance the hub has recorded, oldest first."""

    instances: tuple[InstanceEvent, ...] = Field(default=(), max_length=100_000)


class BurstVerdict(WireModel):
    """Why a round of the burst controller rents no instance for these waiting workloads."""

    reason: str = Field(min_length=1, max_length=32, pattern=r"^[a-z_]+$")
    message: ShortText
    workload_ids: tuple[Identifier, ...] = Field(default=(), max_length=MAX_WORKLOAD_IDS)


class BurstVerdicts(WireModel):
    """Every verdict of one controller's latest round; each replaces that controller's last.

    Core NATS, not durable: sent when they change and every few seconds while there are any,
    so a hub that missed one (or restarted) has them again soon; the hub forgets a
    controller's verdicts that stop coming (`hub.cloudwait.VERDICTS_FRESH_S`)."""

    provider: str = Field(min_length=1, max_length=32)
    at: float = Field(description="Burst service clock, seconds since the epoch.")
    verdicts: tuple[BurstVerdict, ...] = Field(default=(), max_length=MAX_DEMAND_ITEMS)
