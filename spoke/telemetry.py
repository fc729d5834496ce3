"""Per-device GPU utilisation and memory, and which allocated GPUs sit idle.

Real GPUs are read through NVML (`NvmlTelemetry`). Simulated GPUs (the static inventory) report
what their workloads say: the local runtime gives each workload a file in `$GPUFED_LOAD_FILE`
where it may write its load, `UTIL_PERCENT [MEMORY_MIB]` (`echo 3 > "$GPUFED_LOAD_FILE"` for a
notebook left open); a workload that writes nothing counts as fully busy. Memory totals come
from the node label `nvidia.com/gpu.memory-mib` where the inventory file sets it.

The idle rule is a pure function: a GPU is *allocated but idle* when gpufed work holds it and
it has been under `IDLE_PERCENT` busy for `IDLE_AFTER_S` without a break.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread

from schemas import Assignment
from spoke.ports import NodeInventory

#: Under this utilisation (percent) a GPU counts as idle.
IDLE_PERCENT = 5.0
#: An allocated GPU idle this long (seconds, unbroken) is reported as allocated-but-idle.
IDLE_AFTER_S = 600.0
#: Simulated utilisation of a workload that reports nothing.
DEFAULT_LOAD_PERCENT = 100.0

Device = tuple[str, int]  # (node, device index)


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One GPU at one instant."""

    node: str
    index: int
    gpu_model: str
    utilization: float  # percent, 0-100
    memory_used_bytes: float
    memory_total_bytes: float | None = None
    uuid: str = ""


class Telemetry(Protocol):
    """Where utilisation comes from."""

    async def sample(
        self,
        nodes: Iterable[NodeInventory],
        allocations: Mapping[str, tuple[int, tuple[Assignment, ...]]],
    ) -> list[DeviceSample]:
        """Every device of `nodes` now. Read-only; never raises for one unreadable device."""
        ...


def idle_since(
    previous: Mapping[Device, float],
    samples: Iterable[DeviceSample],
    allocated: set[Device],
    now: float,
    threshold: float = IDLE_PERCENT,
) -> dict[Device, float]:
    """Since when each allocated device has been idle without a break.

    A device drops out when it is busy or no longer allocated; one newly idle starts at `now`.
    """
    out: dict[Device, float] = {}
    for s in samples:
        device = (s.node, s.index)
        if device in allocated and s.utilization < threshold:
            out[device] = previous.get(device, now)
    return out


def allocated_idle(
    since: Mapping[Device, float], now: float, after_s: float = IDLE_AFTER_S
) -> set[Device]:
    """The devices idle (per `idle_since`) for at least `after_s`."""
    return {device for device, start in since.items() if now - start >= after_s}


def allocated_devices(
    allocations: Mapping[str, tuple[int, tuple[Assignment, ...]]],
) -> dict[Device, list[tuple[str, float]]]:
    """Device -> [(workload id, share of the device)] for everything placed here."""
    out: dict[Device, list[tuple[str, float]]] = {}
    for wid, (_epoch, assignments) in allocations.items():
        for a in assignments:
            share = a.fraction if a.fraction is not None else 1.0
            for d in a.devices:
                out.setdefault((a.node, d), []).append((wid, share))
    return out


class SimulatedTelemetry:
    """Utilisation of simulated GPUs: what their workloads wrote to their load files."""

    def __init__(self, load_dir: Path) -> None:
        self.load_dir = load_dir

    async def sample(
        self,
        nodes: Iterable[NodeInventory],
        allocations: Mapping[str, tuple[int, tuple[Assignment, ...]]],
    ) -> list[DeviceSample]:
        held = allocated_devices(allocations)
        loads = {wid: self._load(wid) for wid in allocations}
        out = []
        for node in nodes:
            total_mib = _memory_mib(node)
            for index in range(node.gpu_count):
                util = mem = 0.0
                for wid, share in held.get((node.name, index), ()):
                    percent, mib = loads[wid]
                    util += percent * share
                    mem += mib * share
                out.append(
                    DeviceSample(
                        node=node.name,
                        index=index,
                        gpu_model=node.gpu_model,
                        utilization=min(100.0, util),
                        memory_used_bytes=mem * 2**20,
                        memory_total_bytes=None if total_mib is None else total_mib * 2**20,
                    )
                )
        return out

    def workload_utilisation(
        self, allocations: Mapping[str, tuple[int, tuple[Assignment, ...]]]
    ) -> dict[str, float]:
        """Each workload's own reported load (percent): what a share of a GPU does by itself,
        which the device's reading, summed over its sharers, cannot tell."""
        return {wid: self._load(wid)[0] for wid in allocations}

    def load_file(self, workload_id: str) -> Path:
        return self.load_dir / f"{workload_id}.load"

    def _load(self, workload_id: str) -> tuple[float, float]:
        try:
            words = self.load_file(workload_id).read_text().split()
            util = float(words[0])
            mib = float(words[1]) if len(words) > 1 else 0.0
        except (OSError, ValueError, IndexError):
            return DEFAULT_LOAD_PERCENT, 0.0
        return max(0.0, min(100.0, util)), max(0.0, mib)


def _memory_mib(node: NodeInventory) -> float | None:
    # The same label the nvml inventory and NVIDIA's GPU feature discovery set.
    try:
        return float(node.labels["nvidia.com/gpu.memory-mib"])
    except (KeyError, ValueError):
        return None


class NoTelemetry:
    """No per-device readings: a Kubernetes cluster's dcgm-exporter reports its GPUs itself."""

    async def sample(
        self,
        nodes: Iterable[NodeInventory],
        allocations: Mapping[str, tuple[int, tuple[Assignment, ...]]],
    ) -> list[DeviceSample]:
        return []


class NvmlTelemetry:
    """Utilisation and memory of this host's GPUs, read through NVML."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    async def sample(
        self,
        nodes: Iterable[NodeInventory],
        allocations: Mapping[str, tuple[int, tuple[Assignment, ...]]],
    ) -> list[DeviceSample]:
        node_list = list(nodes)
        if not node_list:
            return []
        return await anyio.to_thread.run_sync(self._read, node_list[0])

    def _read(self, node: NodeInventory) -> list[DeviceSample]:
        nvml = self._nvml
        out = []
        for index in range(node.gpu_count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                uuid = nvml.nvmlDeviceGetUUID(handle)
            except nvml.NVMLError:
                continue  # one unreadable device must not hide the others
            out.append(
                DeviceSample(
                    node=node.name,
                    index=index,
                    gpu_model=node.gpu_model,
                    utilization=float(util.gpu),
                    memory_used_bytes=float(memory.used),
                    memory_total_bytes=float(memory.total),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                )
            )
        return out
