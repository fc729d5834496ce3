"""What a spoke reports about itself every few seconds."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from schemas.common import DnsLabel, Identifier, WireModel
from schemas.workloads import GpuModel


class SpokeKind(StrEnum):
    ONPREM = "onprem"
    CLOUD = "cloud"


class NodeCapacity(WireModel):
    """One GPU node of a spoke.

    `free_devices` are device indexes nobody uses; `device_free_fraction` gives, for devices
    shared by fractional workloads, the share still free (absent devices are wholly free or
    wholly used, per `free_devices`).
    """

    name: str = Field(min_length=1, max_length=253)
    gpu_model: GpuModel
    gpu_count: int = Field(ge=0, le=64)
    free_devices: tuple[int, ...] = ()
    device_free_fraction: dict[int, float] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    schedulable: bool = True


class RunningRef(WireModel):
    """A workload a spoke is running, with the assignment epoch it runs under."""

    workload_id: Identifier
    epoch: int = Field(ge=0)


class CapacityReport(WireModel):
    """Heartbeat: inventory, what runs, and who the spoke is."""

    spoke_id: Identifier
    region: DnsLabel
    kind: SpokeKind = SpokeKind.ONPREM
    incarnation: str = Field(description="Changes each time the spoke process starts.")
    seq: int = Field(ge=0, description="Increases with every report of one incarnation.")
    nodes: tuple[NodeCapacity, ...] = ()
    running: tuple[RunningRef, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    applied_seq: int = Field(
        default=0, ge=0, description="Command stream sequence of the last command applied."
    )
    sent_at: float = Field(description="Spoke clock, seconds since the epoch.")
