"""Build and run a spoke: its inventory and runtime picked from settings, then the agent."""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from bus import lifeline
from bus.client import Bus, BusSettings
from bus.identities import inbox_prefix
from bus.metrics_http import serve_metrics
from gpufed.compose import collector
from gpufed.compose.signals import stop_on_signals
from gpufed.dirlock import FolderLock
from spoke.agent import SpokeAgent
from spoke.errors import PermanentSpokeError
from spoke.fencing import Guard, fence_file
from spoke.ports import EventSink, Inventory, Runtime
from spoke.runtime.retention import Keep
from spoke.settings import SpokeSettings
from spoke.telemetry import Telemetry

log = structlog.get_logger(__name__)

RuntimeFactory = Callable[[EventSink], Runtime]


def build_spoke(
    settings: SpokeSettings,
    inventory: Inventory | None = None,
    runtime_factory: RuntimeFactory | None = None,
) -> SpokeAgent:
    """A spoke agent; `inventory` and `runtime_factory` (tests) override the settings' choice."""
    bus = Bus(
        BusSettings(
            url=settings.nats_url,
            name=f"gpufed-spoke-{settings.id}",
            # Per-spoke NATS users may only subscribe below their own inbox prefix.
            inbox_prefix=inbox_prefix(settings.id),
            token=settings.nats_token,
            user_credentials=str(settings.nats_creds) if settings.nats_creds else None,
            tls_ca=str(settings.nats_ca) if settings.nats_ca else None,
        )
    )
    inventory = make_inventory(settings) if inventory is None else inventory
    return SpokeAgent(
        settings,
        bus,
        inventory,
        make_runtime_factory(settings) if runtime_factory is None else runtime_factory,
        telemetry=make_telemetry(settings, inventory),
    )


async def serve_spoke(settings: SpokeSettings, stop: asyncio.Event | None = None) -> None:
    """Run the spoke until SIGINT/SIGTERM (or `stop`)."""
    stop = stop or asyncio.Event()
    _watch_children_with_pidfd(asyncio.get_running_loop())
    stop_on_signals(stop)
    _stop_with_lifeline(stop)
    lock = FolderLock(settings.workdir, f"spoke {settings.id}").take()  # one journal writer
    try:
        await _serve(build_spoke(settings), settings, stop)
    finally:
        lock.release()


def _stop_with_lifeline(stop: asyncio.Event) -> None:
    """A cloud spoke of the local burst provider stops when `gpufed up` is gone (`bus.lifeline`):
    it outlives the controller that started it, not the federation."""
    fd = lifeline.passed()
    if fd is None:
        return

    def ended() -> None:
        log.warning("lifeline_ended", why="gpufed up, whose federation this spoke is in, ended")
        stop.set()

    lifeline.watch(fd, asyncio.get_running_loop(), ended)


async def _serve(agent: SpokeAgent, settings: SpokeSettings, stop: asyncio.Event) -> None:
    collector.settle()  # its pauses would hold up a run of workload starts
    if settings.metrics_port is None:
        await agent.run(stop)
        return
    from spoke.metrics import SpokeMetrics

    metrics = SpokeMetrics(agent, agent.activity.telemetry, settings.heartbeat_s)
    await asyncio.gather(
        agent.run(stop),
        metrics.run(stop),
        serve_metrics(metrics.registry, settings.metrics_host, settings.metrics_port, stop),
    )


def make_inventory(settings: SpokeSettings, api_client: Any = None) -> Inventory:
    """`static:FILE`, `nvml`, `kubernetes` or `slurm`."""
    kind, _, arg = settings.inventory.partition(":")
    if kind == "static":
        from spoke.inventory.static import StaticInventory

        if not arg:
            raise PermanentSpokeError("--inventory static needs a file: static:FILE")
        return StaticInventory.from_file(Path(arg))
    if kind == "nvml":
        from spoke.inventory.nvml import NvmlInventory

        return NvmlInventory(arg or None)
    if kind == "kubernetes":
        from spoke.inventory.kubernetes import KubernetesInventory

        return KubernetesInventory(api_client or _api_client(settings))
    if kind == "slurm":
        from spoke.inventory.slurm import SlurmInventory
        from spoke.slurm import SlurmCli

        return SlurmInventory(SlurmCli(), settings.id, settings.slurm_partition)
    raise PermanentSpokeError(
        f"unknown inventory {settings.inventory!r}: use static:FILE, nvml, kubernetes or slurm"
    )


def make_runtime_factory(settings: SpokeSettings, api_client: Any = None) -> RuntimeFactory:
    """A function building the runtime around the agent's event sink."""
    if settings.runtime == "local":
        from spoke.runtime.local import LocalRuntime
        from spoke.runtime.runas import RunAs

        log_dir = settings.workdir / "logs"
        host, url_host = settings.expose_host, settings.expose_url_host
        run_as = RunAs.resolve(settings.run_as) if settings.run_as else None
        keep = Keep(settings.keep_ended_s, settings.keep_ended)
        guard = _guard(settings)
        return lambda sink: LocalRuntime(
            sink, log_dir, expose_host=host, url_host=url_host, run_as=run_as, keep=keep,
            guard=guard,
        )  # fmt: skip
    if settings.runtime == "kubernetes":
        from spoke.runtime.kubernetes import KubernetesRuntime

        client = api_client or _api_client(settings)
        kube_guard = _guard(settings)

        def build(sink: EventSink) -> Runtime:
            return KubernetesRuntime(client, sink, settings.id, guard=kube_guard)

        return build
    if settings.runtime == "slurm":
        from spoke.runtime.slurm import SiteOptions, SlurmRuntime
        from spoke.slurm import SlurmCli

        site = SiteOptions(settings.slurm_partition, settings.slurm_account, settings.slurm_qos)
        cli, logs = SlurmCli(), settings.workdir / "logs"
        keep = Keep(settings.keep_ended_s, settings.keep_ended)
        guard = _guard(settings)
        return lambda sink: SlurmRuntime(
            cli, sink, settings.id, logs, site=site, keep=keep, guard=guard
        )
    raise PermanentSpokeError(
        f"unknown runtime {settings.runtime!r}: use local, kubernetes or slurm"
    )


def _guard(settings: SpokeSettings) -> Guard:
    """The spoke's fence rule, for a runtime to apply with the spoke gone."""
    return Guard(
        fence_file(settings.workdir),
        heartbeat_s=settings.heartbeat_s,
        stop_grace_s=settings.stop_grace_s,
        fence_after_s=settings.fence_after_s,
    )


def _api_client(settings: SpokeSettings) -> Any:
    from spoke.kube import load_api_client

    return load_api_client(settings.kubeconfig, settings.kube_context)


def _watch_children_with_pidfd(loop: asyncio.AbstractEventLoop) -> None:
    # Python 3.11 waits for each child in a thread of its own; a pidfd in the event loop
    # costs far less per workload (3.12 does this by default).
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return  # kernel without pidfd
        watcher = asyncio.PidfdChildWatcher()
        asyncio.set_child_watcher(watcher)
        watcher.attach_loop(loop)


def make_telemetry(settings: SpokeSettings, inventory: Inventory) -> Telemetry:
    """NVML's readings for real GPUs; what the workloads report for simulated ones; none on
    Kubernetes, where the cluster's dcgm-exporter reports each GPU under the same names."""
    from spoke.telemetry import NoTelemetry, NvmlTelemetry, SimulatedTelemetry

    nvml = getattr(inventory, "nvml", None)
    if nvml is not None:
        return NvmlTelemetry(nvml)
    if settings.inventory.startswith("static"):
        return SimulatedTelemetry(settings.workdir / "load")
    return NoTelemetry()
