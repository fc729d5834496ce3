"""The spoke's Prometheus metrics, served on `--metrics-port` at `/metrics`.

Per-device utilisation and memory use DCGM exporter's field names (`DCGM_FI_DEV_GPU_UTIL`,
`DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE`, in its units: percent and MiB) and labels, so
dashboards built for dcgm-exporter work on gpufed spokes too. The rest are gpufed's own.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from bus.metric_families import Spec, build, counter, describe, gauge, nats_reconnects
from bus.tasks import pause
from spoke.agent import SpokeAgent
from spoke.telemetry import (
    Device,
    DeviceSample,
    Telemetry,
    allocated_devices,
    allocated_idle,
    idle_since,
)

log = structlog.get_logger(__name__)

DCGM_LABELS = "gpu UUID device modelName Hostname spoke"
#: Why the spoke dropped a command (the agent's counters of the same names).
COMMAND_DROPS = ("malformed", "duplicate", "stale")


class SpokeMetrics(Collector):
    """Samples the spoke's GPUs every `interval_s` and exports them with the agent's state."""

    def __init__(
        self,
        agent: SpokeAgent,
        telemetry: Telemetry,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.agent = agent
        self.telemetry = telemetry
        self.interval_s = interval_s
        self.clock = clock
        self.samples: list[DeviceSample] = []
        self.idle: dict[Device, float] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until `stop` is set."""
        while not stop.is_set():
            await self.sample_once()
            await pause(stop, self.interval_s)

    async def sample_once(self) -> None:
        """Read every device now and update the idle tracking."""
        allocations = dict(self.agent.journal.state.allocations)
        try:
            samples = await self.telemetry.sample(self.agent.nodes(), allocations)
        except Exception as exc:  # a failed read is logged; the next one may work
            log.warning("telemetry_failed", error=str(exc) or type(exc).__name__)
            return
        held = set(allocated_devices(allocations))
        self.samples = samples
        self.idle = idle_since(self.idle, samples, held, self.clock())

    def describe(self) -> Iterable[Metric]:
        return describe(_SPECS)

    def collect(self) -> Iterable[Metric]:
        f = build(_SPECS)
        agent = self.agent
        spoke = agent.settings.id
        held = allocated_devices(agent.journal.state.allocations)
        for s in self.samples:
            labels = [str(s.index), s.uuid, f"nvidia{s.index}", s.gpu_model, s.node, spoke]
            f["util"].add_metric(labels, s.utilization)
            f["fb_used"].add_metric(labels, s.memory_used_bytes / 2**20)
            if s.memory_total_bytes is not None:
                free = max(0.0, s.memory_total_bytes - s.memory_used_bytes)
                f["fb_free"].add_metric(labels, free / 2**20)
            allocated = 1.0 if (s.node, s.index) in held else 0.0
            f["allocated"].add_metric([spoke, s.node, str(s.index), s.gpu_model], allocated)
        models = {(s.node, s.index): s.gpu_model for s in self.samples}
        idle: dict[str, int] = defaultdict(int)
        for device in allocated_idle(self.idle, self.clock()):
            idle[models.get(device, "unknown")] += 1
        for model in sorted(set(models.values()) | set(idle)):
            f["idle"].add_metric([spoke, model], idle.get(model, 0))
        f["running"].add_metric([spoke], len(agent.runtime.running()))
        f["pending"].add_metric([spoke], len(agent.journal.state.outbox))
        for reason in COMMAND_DROPS:
            f["dropped"].add_metric([spoke, reason], agent.counters[reason])
        f["events_dropped"].add_metric([spoke], agent.counters["events_dropped"])
        f["reconnects"].add_metric([spoke], agent.bus.reconnects)
        yield from f.values()


_SPECS: dict[str, Spec] = {
    "util": gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", DCGM_LABELS),
    "fb_used": gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", DCGM_LABELS),
    "fb_free": gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", DCGM_LABELS),
    "allocated": gauge(
        "gpufed_gpu_allocated",
        "1 while gpufed work holds the device (whole or a share), else 0.",
        "spoke Hostname gpu gpu_model",
    ),
    "idle": gauge(
        "gpufed_gpus_allocated_idle",
        "Allocated GPUs under 5 % busy for 10 minutes without a break.",
        "spoke gpu_model",
    ),
    "running": gauge("gpufed_spoke_workloads_running", "Workloads running on the spoke.", "spoke"),
    "pending": gauge(
        "gpufed_spoke_events_pending",
        "Workload events journaled and not yet acknowledged by the hub.",
        "spoke",
    ),
    "dropped": counter(
        "gpufed_spoke_commands_dropped",
        "Commands dropped: malformed, duplicate decision, or for a superseded epoch.",
        "spoke reason",
    ),
    "events_dropped": counter(
        "gpufed_spoke_events_dropped",
        "Workload events dropped because the journal's outbox was full.",
        "spoke",
    ),
    "reconnects": nats_reconnects("Times the NATS connection was re-established.", "spoke"),
}
