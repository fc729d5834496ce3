"""How busy each running workload is, for the capacity report: GPU utilisation and port traffic.

Every `interval_s` the spoke samples its devices (spoke.telemetry: NVML, or the load the
workloads of a simulated inventory write to $GPUFED_LOAD_FILE) and keeps, per workload, the
utilisation of the busiest device it holds. A runtime that fronts session ports with a relay
(the local runtime) says how long each port has been quiet. On real GPUs a workload sharing
a device (a fraction) reads as busy as the device; on simulated ones its own load counts.
The hub decides what is idle (hub.core.idle); the spoke only measures, so the policy stays in
one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import structlog

from bus.tasks import pause
from schemas import Assignment, RunningRef
from spoke.ports import NodeInventory
from spoke.telemetry import DeviceSample, Telemetry

log = structlog.get_logger(__name__)

Allocations = Mapping[str, tuple[int, tuple[Assignment, ...]]]


@runtime_checkable
class TrafficSource(Protocol):
    """A runtime that knows when a workload's port last carried traffic."""

    def quiet_s(self, workload_id: str) -> float | None:
        """Seconds since its port last carried bytes; None when it has no port. Cheap, pure."""
        ...


class ActivityMonitor:
    """Samples the spoke's devices and answers, per workload, how busy it is."""

    def __init__(
        self,
        telemetry: Telemetry,
        nodes: Callable[[], list[NodeInventory]],
        allocations: Callable[[], Allocations],
        traffic: object,
        interval_s: float,
    ) -> None:
        self.telemetry = telemetry
        self._nodes = nodes
        self._allocations = allocations
        self._traffic = traffic if isinstance(traffic, TrafficSource) else None
        self.interval_s = interval_s
        self.utilisation: dict[str, float] = {}  # workload id -> busiest device, percent

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until `stop` is set."""
        while not stop.is_set():
            await self.sample_once()
            await pause(stop, self.interval_s)

    async def sample_once(self) -> None:
        """Read every device now; a failed read keeps the last readings."""
        allocations = dict(self._allocations())
        try:
            samples = await self.telemetry.sample(self._nodes(), allocations)
        except Exception as exc:  # logged; the next sample may work
            log.warning("telemetry_failed", error=str(exc) or type(exc).__name__)
            return
        own = getattr(self.telemetry, "workload_utilisation", None)
        # Simulated GPUs know each workload's own load; real ones only each device's.
        self.utilisation = own(allocations) if own else workload_utilisation(samples, allocations)

    def refs(self, running: Mapping[str, int]) -> tuple[RunningRef, ...]:
        """The report's running list, each with its readings."""
        return tuple(
            RunningRef(
                workload_id=wid,
                epoch=epoch,
                gpu_util=self.utilisation.get(wid),
                quiet_s=self._traffic.quiet_s(wid) if self._traffic is not None else None,
            )
            for wid, epoch in sorted(running.items())
        )


def workload_utilisation(samples: list[DeviceSample], allocations: Allocations) -> dict[str, float]:
    """Workload id -> utilisation of the busiest device it holds (those with a reading)."""
    by_device = {(s.node, s.index): s.utilization for s in samples}
    out: dict[str, float] = {}
    for wid, (_epoch, assignments) in allocations.items():
        readings = [
            by_device[(a.node, d)]
            for a in assignments
            for d in a.devices
            if (a.node, d) in by_device
        ]
        if readings:
            out[wid] = max(readings)
    return out
