"""Real GPUs of this host, read through NVML (nvidia-ml-py)."""

from __future__ import annotations

import socket
from typing import Any

import anyio.to_thread

from spoke.errors import PermanentSpokeError
from spoke.inventory.models import short_model
from spoke.ports import NodeInventory


class NvmlInventory:
    """This host as one node; its GPU model from the first device's name."""

    def __init__(self, node_name: str | None = None) -> None:
        self.node_name = node_name or socket.gethostname()
        self.nvml = _load_nvml()  # the telemetry reads utilisation through the same handle

    async def nodes(self) -> list[NodeInventory]:
        return [await anyio.to_thread.run_sync(self._read)]

    def _read(self) -> NodeInventory:
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            names = [
                _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(count)
            ]
            memory = [
                nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).total
                for i in range(count)
            ]
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            raise PermanentSpokeError(f"NVML failed reading GPUs: {exc}") from exc
        if count == 0:
            raise PermanentSpokeError("NVML found no GPUs on this host")
        if len(set(names)) > 1:
            raise PermanentSpokeError(
                f"mixed GPU models on one host are not supported yet: {sorted(set(names))}"
            )
        return NodeInventory(
            name=self.node_name,
            gpu_model=short_model(names[0]),
            gpu_count=count,
            labels={
                "nvidia.com/gpu.product": names[0].replace(" ", "-"),
                "nvidia.com/gpu.memory-mib": str(memory[0] // (1024 * 1024)),
                "nvidia.com/driver": driver,
            },
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _load_nvml() -> Any:
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError as exc:
        raise PermanentSpokeError(
            "the nvml inventory needs nvidia-ml-py: pip install 'gpufed[nvml]'"
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise PermanentSpokeError(
            f"no NVIDIA GPUs usable here: NVML could not start ({exc}); is the NVIDIA driver "
            "installed and are the devices visible to this process? Use --inventory static:FILE "
            "to simulate GPUs."
        ) from exc
    return pynvml
