"""Run a spoke: pick its inventory and runtime from settings, then serve."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import warnings
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


def _api_client(settings: SpokeSettings) -> Any:
    from spoke.kube import load_api_client

    return load_api_client(settings.kubeconfig, settings.kube_context)


async def serve(settings: SpokeSettings, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or `stop`)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    _watch_children_with_pidfd(loop)
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    inventory = make_inventory(settings)
    agent = SpokeAgent(
        settings,
        Bus(
            BusSettings(
                url=settings.nats_url,
                name=f"gpufed-spoke-{settings.id}",
                # Per-spoke NATS users may only subscribe below their own inbox prefix.
                inbox_prefix=f"_INBOX_{settings.id}",
                token=settings.nats_token,
            )
        ),
        inventory,
        make_runtime_factory(settings),
    )
    await agent.run(stop)
