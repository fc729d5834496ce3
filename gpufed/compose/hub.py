"""Build and run the hub: store, bus, service loop and REST API in one process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
import uvicorn
from fastapi import FastAPI
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from bus.client import Bus, BusSettings
from bus.identities import HUB, inbox_prefix
from bus.tasks import pause
from bus.urls import mask_url
from gpufed.compose import collector
from gpufed.compose.signals import stop_on_signals
from gpufed.dirlock import FolderLock
from gpufed.secretfile import private_dir
from hub.api import create_app
from hub.apideps import ApiSecurity
from hub.authstore import AuthStore
from hub.core.policy import Policy
from hub.errors import Unavailable
from hub.policyfile import policy_from_dict
from hub.service import HubService
from hub.settings import HubSettings
from hub.spend import SpendMeter
from hub.store import Store

log = structlog.get_logger(__name__)

#: Waits between tries to reach a store's database at start: doubling from the first.
STORE_RETRY_FIRST_S = 0.5
STORE_RETRY_MAX_S = 10.0


@dataclass(frozen=True)
class Hub:
    """The parts of one hub: the service, its store (closed by the owner), its REST app, what
    the app authenticates and audits with, and the burst spend meter (run beside the service)."""

    service: HubService
    store: Store
    app: FastAPI
    security: ApiSecurity
    meter: SpendMeter


def build_hub(
    settings: HubSettings,
    policy: Policy | None = None,
    bus_name: str = "gpufed-hub",
    clock: Callable[[], float] = time.time,
    store: Store | None = None,
) -> Hub:
    """A hub from its settings; `policy` and `clock` (tests) override `settings.policy_file`
    and the system clock, `store` one opened already (`open_store`)."""
    private_dir(settings.data_dir)  # the SQLite store holds secret env values
    store = store or Store(settings.resolved_store_url())
    bus = Bus(
        BusSettings(
            url=settings.nats_url,
            name=bus_name,
            inbox_prefix=inbox_prefix(HUB),
            user_credentials=str(settings.nats_creds) if settings.nats_creds else None,
            tls_ca=str(settings.nats_ca) if settings.nats_ca else None,
        )
    )
    policy_text = None
    if settings.policy_file is not None and policy is None:
        policy_text = settings.policy_file.read_text()
    if policy is None:
        # No policy set anywhere yet: the document defaults (unlisted teams may not burst,
        # burst spend capped, max_queued), not the core's unrestricted Policy().
        policy = policy_from_dict({})
    service = HubService(settings, store, bus, policy, clock, policy_file_text=policy_text)
    security = ApiSecurity(service, AuthStore(store.engine))
    meter = SpendMeter(service, security.auditor)
    security.month_spend = meter.spend
    service.state.submit_audit = security.auditor.nats_entry  # saved with the workload
    service.state.submit_listeners.append(security.auditor.nats_submit)  # the refused
    return Hub(service, store, create_app(service, security), security, meter)


def api_server(app: FastAPI, settings: HubSettings) -> uvicorn.Server:
    """The hub's HTTP server. Told to exit, it takes no new connection and gives the requests
    in flight `settings.drain_s` to finish, then cuts them: a streamed answer or an upload
    through the gateway can run for minutes and must not hold a stopping hub that long."""
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=settings.drain_s,
    )
    return uvicorn.Server(config)


async def serve_hub(settings: HubSettings, stop: asyncio.Event | None = None) -> None:
    """Run the hub and its API until SIGINT/SIGTERM (or `stop`)."""
    lock = _sqlite_lock(settings)
    try:
        await _serve(settings, stop or asyncio.Event())
    finally:
        if lock is not None:
            lock.release()


def _sqlite_lock(settings: HubSettings) -> FolderLock | None:
    """One hub per SQLite store: a second would lead beside the first (leadership is shared
    only through PostgreSQL) and place work twice. Held on the store file's folder."""
    url = make_url(settings.resolved_store_url())
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return FolderLock(Path(url.database).resolve().parent, "hub on this SQLite store").take()


async def open_store(url: str, stop: asyncio.Event) -> Store | None:
    """The store at `url`, once its database answers; None if `stop` is set first.

    A PostgreSQL server that is not up yet (started after the hub, restarting, out of
    connections) is waited for, each try logged as `store_unreachable` with the URL's password
    masked, as the hub waits for NATS; a SQLite file that cannot be opened will not open later
    and is said at once (`Unavailable`)."""
    delay = STORE_RETRY_FIRST_S
    while not stop.is_set():
        try:
            return await asyncio.to_thread(Store, url)
        except OperationalError as exc:
            reason = mask_url(str(getattr(exc, "orig", None) or exc).splitlines()[0])
            if make_url(url).get_backend_name() == "sqlite":
                raise Unavailable(f"cannot open the store {mask_url(url)}: {reason}") from None
            log.warning("store_unreachable", url=mask_url(url), error=reason, retry_in_s=delay)
        await pause(stop, delay)
        delay = min(delay * 2, STORE_RETRY_MAX_S)
    return None


async def _serve(settings: HubSettings, stop: asyncio.Event) -> None:
    stop_on_signals(stop)
    private_dir(settings.data_dir)
    store = await open_store(settings.resolved_store_url(), stop)
    if store is None:
        log.info("hub_stopped", store=False)
        return
    hub = build_hub(settings, store=store)
    collector.settle()  # its pauses would land inside scheduling cycles
    server = api_server(hub.app, settings)
    hub_task = asyncio.create_task(hub.service.run(stop))
    api_task = asyncio.create_task(server.serve())
    spend_task = asyncio.create_task(hub.meter.run(stop), name="hub-spend")
    log.info("hub_api", url=f"http://{settings.api_host}:{settings.api_port}")
    done, _ = await asyncio.wait({hub_task, api_task}, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    server.should_exit = True
    await asyncio.gather(hub_task, api_task, spend_task, return_exceptions=True)
    with contextlib.suppress(Exception):  # counts of refusals held: written, or logged
        await hub.security.auditor.close()
    hub.store.close()
    for task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
