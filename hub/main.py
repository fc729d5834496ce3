"""Run the hub: store, bus, service loop and REST API in one process."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog
import uvicorn

from bus.client import Bus, BusSettings
from hub.api import create_app
from hub.core.policy import Policy
from hub.service import HubService
from hub.settings import HubSettings
from hub.store import Store

log = structlog.get_logger(__name__)


def load_policy(settings: HubSettings) -> Policy:
    """The policy in force at start: the file's if one is given, else the defaults."""
    if settings.policy_file is None:
        return Policy()
    from hub.policyfile import load_policy as parse

    policy: Policy = parse(settings.policy_file.read_text())
    return policy


async def serve(settings: HubSettings, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or `stop`)."""
    stop = stop or asyncio.Event()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(settings.resolved_store_url())
    bus = Bus(BusSettings(url=settings.nats_url, name="gpufed-hub"))
    hub = HubService(settings, store, bus, load_policy(settings))
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
