"""Run a spoke: pick its inventory and runtime from settings, then serve."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

import structlog

from bus.client import Bus, BusSettings
from spoke.agent import SpokeAgent
from spoke.errors import PermanentSpokeError
from spoke.ports import EventSink, Inventory, Runtime
from spoke.settings import SpokeSettings

log = structlog.get_logger(__name__)


def make_inventory(settings: SpokeSettings, api_client: Any = None) -> Inventory:
    """`static:FILE`, `nvml` or `kubernetes`."""
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
    raise PermanentSpokeError(
        f"unknown inventory {settings.inventory!r}: use static:FILE, nvml or kubernetes"
    )


def make_runtime_factory(settings: SpokeSettings, api_client: Any = None) -> Any:
    """A function building the runtime around the agent's event sink."""
    if settings.runtime == "local":
        from spoke.runtime.local import LocalRuntime

        log_dir = settings.workdir / "logs"
        return lambda sink: LocalRuntime(sink, log_dir)
    if settings.runtime == "kubernetes":
        from spoke.runtime.kubernetes import KubernetesRuntime

        client = api_client or _api_client(settings)

        def build(sink: EventSink) -> Runtime:
            return KubernetesRuntime(client, sink, settings.id)

        return build
    raise PermanentSpokeError(f"unknown runtime {settings.runtime!r}: use local or kubernetes")


def _api_client(settings: SpokeSettings) -> Any:
    from spoke.kube import load_api_client

    return load_api_client(settings.kubeconfig, settings.kube_context)


async def serve(settings: SpokeSettings, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or `stop`)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    inventory = make_inventory(settings)
    agent = SpokeAgent(
        settings,
        Bus(BusSettings(url=settings.nats_url, name=f"gpufed-spoke-{settings.id}")),
        inventory,
        make_runtime_factory(settings),
    )
    await agent.run(stop)
