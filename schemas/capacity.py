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
from schemas.workloads import GpuModel

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
    """A workload a spoke is running, with the assignment epoch it runs under."""

    workload_id: Identifier
    epoch: int = Field(ge=0, le=MAX_EPOCH)


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
