"""Run the hub: store, bus, service loop and REST API in one process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal

import structlog
import uvicorn

from bus.client import Bus, BusSettings
from hub.api import create_app
from hub.service import HubService
from hub.settings import HubSettings
from hub.store import Store

log = structlog.get_logger(__name__)


async def serve(settings: HubSettings, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or `stop`)."""
    stop = stop or asyncio.Event()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(settings.resolved_store_url())
    bus = Bus(BusSettings(url=settings.nats_url, name="gpufed-hub"))
    policy_text = settings.policy_file.read_text() if settings.policy_file else None
    hub = HubService(settings, store, bus, policy_file_text=policy_text)
    # Long-lived objects (policy, records) would be rescanned by every full collection, and
    # such pauses land inside scheduling cycles: move what exists at start out of the GC's way.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    config = uvicorn.Config(
        create_app(hub),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    hub_task = asyncio.create_task(hub.run(stop))
    api_task = asyncio.create_task(server.serve())
    log.info("hub_api", url=f"http://{settings.api_host}:{settings.api_port}")
    done, _ = await asyncio.wait({hub_task, api_task}, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    server.should_exit = True
    await asyncio.gather(hub_task, api_task, return_exceptions=True)
    store.close()
    for task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
