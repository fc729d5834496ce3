"""What a spoke reports about itself every few seconds."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from schemas.common import (
    MAX_EPOCH,
    MAX_LABELS,
    DnsLabel,
    Identifier,
    LabelKey,
    LabelValue,
    ShortText,
    SpokeId,
    WireModel,
)
from schemas.workloads import MAX_NODES, GpuModel, WorkloadKind

#: Bounds that keep one report (and what the hub keeps of it) small.
MAX_NODES_PER_SPOKE = 4096
MAX_RUNNING = 65_536


class SpokeKind(StrEnum):
    ONPREM = "onprem"
    CLOUD = "cloud"


class NodeCapacity(WireModel):
    """One GPU node of a spoke.

    `free_devices` are device indexes nobody uses; `device_free_fraction` gives, for devices
    shared by fractional workloads, the share still free (absent devices are wholly free or
    wholly used, per `free_devices`).
    """

    name: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    gpu_model: GpuModel
    gpu_count: int = Field(ge=0, le=64)
    free_devices: tuple[int, ...] = Field(default=(), max_length=64)
    device_free_fraction: dict[int, float] = Field(default_factory=dict, max_length=64)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    schedulable: bool = True


class RunningRef(WireModel):
    """A workload a spoke is running, with the assignment epoch it runs under.

    In a capacity report it may carry how busy it is: `gpu_util`, the utilisation of the
    busiest device it holds (percent; None: not measured), and `quiet_s`, seconds since its
    port last carried traffic (a session or service; None: not measured).
    """

    workload_id: Identifier
    epoch: int = Field(ge=0, le=MAX_EPOCH)
    gpu_util: float | None = Field(default=None, ge=0, le=100)
    quiet_s: float | None = Field(default=None, ge=0, le=10 * 365 * 86400)


#: A MIG slice pool is reported as a node named "<host>/mig-<profile>".
MIG_NODE_SEPARATOR = "/"


def mig_profile(node_name: str) -> str | None:
    """The MIG profile ("mig-1g.10gb") a node name stands for, or None for a whole-GPU node."""
    _host, sep, profile = node_name.partition(MIG_NODE_SEPARATOR)
    return profile if sep and profile.startswith("mig-") else None


class RuntimeCapabilities(WireModel):
    """What a spoke's runtime can run; the hub never places anything else there.

    The defaults describe a runtime that refuses nothing, so a report from an older spoke,
    which carries no capabilities, is read as it was meant before.
    """

    fractions: bool = Field(default=True, description="Runs a share of one GPU (gpu_fraction).")
    gangs: bool = Field(default=True, description="Runs one workload across several nodes.")
    max_gang_nodes: int = Field(default=MAX_NODES, ge=1, le=MAX_NODES)
    mig: bool = Field(default=True, description="Runs work on the MIG slices it reports.")
    mig_profiles: tuple[str, ...] = Field(
        default=(), description="MIG profiles its nodes offer now (mig-1g.10gb, ...)."
    )
    kinds: tuple[WorkloadKind, ...] = Field(
        default=tuple(WorkloadKind),
        description="Kinds of workload it runs: session and service need a port it exposes.",
    )

    def refuses(
        self,
        nodes: int,
        fraction: bool,
        node_names: tuple[str, ...] = (),
        kind: WorkloadKind = WorkloadKind.JOB,
    ) -> str | None:
        """Why this runtime would refuse such a workload, or None."""
        if kind not in self.kinds:
            return f"its runtime does not run {kind.value}s (it exposes no port)"
        if fraction and not self.fractions:
            return "its runtime does not run fractional GPUs"
        if nodes > 1 and not self.gangs:
            return "its runtime does not run multi-node gangs"
        if nodes > self.max_gang_nodes:
            return f"its runtime runs gangs of at most {self.max_gang_nodes} nodes"
        if not self.mig and any(mig_profile(n) for n in node_names):
            return "its runtime does not run MIG slices"
        return None


class LeaseAck(WireModel):
    """The hub's answer to a capacity report: it heard report `seq` of that incarnation.

    A spoke measures "heard the hub" from when it *sent* the acknowledged report, which is
    never later than when the hub saw it: its fence deadline always falls before the hub's
    lost_after deadline for the same report.
    """

    spoke_id: Identifier
    incarnation: str
    seq: int = Field(ge=0)
    lost_after_s: float = Field(gt=0)
    term: int = Field(default=0, ge=0, description="The leading hub's term.")


class CapacityReport(WireModel):
    """Heartbeat: inventory, what runs, and who the spoke is."""

    spoke_id: SpokeId
    region: DnsLabel
    kind: SpokeKind = SpokeKind.ONPREM
    incarnation: ShortText = Field(description="Changes each time the spoke process starts.")
    seq: int = Field(ge=0, description="Increases with every report of one incarnation.")
    nodes: tuple[NodeCapacity, ...] = Field(default=(), max_length=MAX_NODES_PER_SPOKE)
    running: tuple[RunningRef, ...] = Field(default=(), max_length=MAX_RUNNING)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    applied_seq: int = Field(
        default=0, ge=0, description="Command stream sequence of the last command applied."
    )
    sent_at: float = Field(description="Spoke clock, seconds since the epoch.")
    capabilities: RuntimeCapabilities = Field(default_factory=RuntimeCapabilities)
