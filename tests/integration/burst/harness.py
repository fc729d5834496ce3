"""Start burst controllers (real LocalProvider, real NATS) in a test and clean up after them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from burst.catalog import Catalog
from burst.providers.local import STATE_FILE, LocalProvider
from burst.service import BurstController
from burst.settings import BurstSettings
from gpufed.compose.burst import build_burst, build_provider
from tests.integration.burst.hub_role import HubRole, process_gone


def fast_settings(root: Path, nats_url: str, **overrides: Any) -> BurstSettings:
    """Settings with the timings shrunk to seconds (burst_after 0.8, idle_ttl 2, cooldown 1)."""
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "provider": "local",
        "tick_s": 0.2,
        "burst_after_s": 0.8,
        "idle_ttl_s": 2.0,
        "cooldown_s": 1.0,
        "capacity_backoff_s": 30.0,
        "reconcile_s": 0.5,
        "orphan_grace_s": 30.0,
        "launch_grace_s": 5.0,
        "state_timeout_s": 0.5,
        "state_dir": root / "burst",
        "spoke_heartbeat_s": 0.5,
        "local_stop_grace_s": 5.0,
    }
    values.update(overrides)
    return BurstSettings(**values)


class Harness:
    """Controllers as tasks of the test's loop; each one gets a provider of its own (as after a
    process restart) over the same state directory. `close` stops them and every spoke."""

    def __init__(self, root: Path, nats_url: str) -> None:
        self.root = root
        self.nats_url = nats_url
        self.hubs: list[HubRole] = []
        self.providers: list[LocalProvider] = []
        self._running: dict[int, tuple[asyncio.Event, asyncio.Task[None]]] = {}

    async def hub(self, **options: Any) -> HubRole:
        hub = await HubRole(self.nats_url, **options).start()
        self.hubs.append(hub)
        return hub

    def provider(self, settings: BurstSettings, catalog: Catalog) -> LocalProvider:
        provider = build_provider(settings, catalog)
        assert isinstance(provider, LocalProvider), settings.provider
        self.providers.append(provider)
        return provider

    async def start(
        self,
        settings: BurstSettings,
        catalog: Catalog,
        *,
        provider_catalog: Catalog | None = None,
        wait_ready: bool = True,
    ) -> BurstController:
        provider = self.provider(settings, provider_catalog or catalog)
        controller = build_burst(settings, catalog, provider, bus_name="test-burst")
        stop = asyncio.Event()
        task = asyncio.create_task(controller.run(stop))
        self._running[id(controller)] = (stop, task)
        if wait_ready:
            await asyncio.wait_for(controller.ready.wait(), 15)
        return controller

    async def stop(self, controller: BurstController) -> None:
        stop, task = self._running.pop(id(controller))
        stop.set()
        await asyncio.wait_for(task, 20)

    def recorded(self) -> dict[str, dict[str, Any]]:
        """The local provider's state file(s): burst id -> record."""
        found: dict[str, dict[str, Any]] = {}
        for path in {p.state_dir / STATE_FILE for p in self.providers}:
            if path.exists():
                found.update(json.loads(path.read_text())["instances"])
        return found

    async def close(self) -> None:
        for key in list(self._running):
            stop, task = self._running.pop(key)
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
        for hub in self.hubs:
            await hub.close()
        if self.providers:
            await self.providers[-1].terminate(list(self.recorded()))
        for provider in self.providers:
            provider.close()
        leaked = [key for key, rec in self.recorded().items() if not process_gone(rec["pid"], key)]
        assert not leaked, f"spoke processes left running: {leaked}"
