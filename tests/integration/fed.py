"""An in-process federation over a real nats-server: hub and spokes as tasks of one loop.

Built by the composition root (gpufed.compose) as `gpufed hub` and `gpufed spoke` are.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from nats.aio.client import RawCredentials

from bus import identities
from bus.authority import NatsAuthority, write_secret
from bus.client import BusSettings
from bus.jwt import Permissions
from gpufed.compose.hub import api_server, build_hub
from gpufed.compose.spoke import RuntimeFactory, build_spoke
from hub.authstore import AuthStore
from hub.core.access import Role
from hub.core.policy import Policy
from hub.service import HubService
from hub.settings import HubSettings
from hub.tokens import mint_token
from schemas import Phase
from spoke.agent import SpokeAgent
from spoke.inventory.static import StaticInventory
from spoke.ports import NodeInventory
from spoke.settings import SpokeSettings
from tests.support.processes import kill_workloads_under
from tests.support.wait import wait_until


def nodes(prefix: str, count: int, gpus: int, model: str) -> list[NodeInventory]:
    return [NodeInventory(f"{prefix}-n{i}", model, gpus) for i in range(count)]


class InProcessServer(uvicorn.Server):
    """uvicorn's server for a test's loop, leaving the process's signals to pytest.

    `uvicorn.Server.serve` takes SIGINT and SIGTERM while it serves, stops itself on one and
    raises it again as it ends: in a test run that was inside the teardown meant to stop every
    other server, which it cut short (tests/conftest.py makes SIGTERM pytest's Ctrl-C).
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class InProcessFederation:
    """Start and stop a hub and spokes; talk to the hub's REST API without a socket."""

    def __init__(
        self,
        nats_url: str,
        root: Path,
        policy: Policy | None = None,
        authority: NatsAuthority | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.root = root
        self.policy = policy
        self.authority = authority  # the server's: hub and spokes get confined credentials
        self.hub: HubService | None = None
        self.spokes: dict[str, SpokeAgent] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.api: httpx.AsyncClient | None = None
        self.app: Any = None
        self.hub_settings: HubSettings | None = None
        self.http_server: uvicorn.Server | None = None  # the latest `serve()`'s
        self.auth_store: AuthStore | None = None
        self.admin_token = ""

    async def start_hub(
        self, clock: Callable[[], float] = time.time, **overrides: Any
    ) -> HubService:
        settings = HubSettings(
            nats_url=self.nats_url,
            data_dir=self.root / "hub",
            nats_creds=self.creds_file(identities.HUB, identities.hub_permissions()),
            **overrides,
        )
        self.hub_settings = settings
        hub = build_hub(settings, self.policy, bus_name="hub", clock=clock)
        self.hub = hub.service
        self._spawn("hub", hub.service.run)
        await asyncio.wait_for(hub.service.ready.wait(), 10)
        if "spend" in self._tasks:  # the previous hub's meter
            await self.stop("spend")
        hub.meter.every_s = 0.2
        self._spawn("spend", hub.meter.run)
        self.app = hub.app
        self.auth_store = hub.security.store
        self.admin_token = await self.token("admin", "admin")
        self.api = self.client(self.admin_token)
        return hub.service

    async def token(self, user: str, role: str, team: str | None = None) -> str:
        """Mint an API token straight in the hub's store (as `gpufed token --store-url`)."""
        assert self.hub is not None and self.auth_store is not None
        store = self.auth_store
        text, _ = await self.hub.db(
            lambda: mint_token(
                store, user=user, role=Role(role), team=team, created_by="test", now=time.time()
            )
        )
        return text

    def client(self, token: str | None) -> httpx.AsyncClient:
        """A REST client of the hub sending `token` (None: no Authorization header)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://hub", headers=headers)

    @contextlib.asynccontextmanager
    async def serve(self, port: int = 0) -> AsyncIterator[str]:
        """The hub's REST API over real HTTP on a free loopback port, or `port` (its base URL),
        stopped by its own server handle: for clients that need a socket (a CLI, a streamed
        answer)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", port))
        port = sock.getsockname()[1]
        assert self.hub_settings is not None
        server = InProcessServer(api_server(self.app, self.hub_settings).config)
        self.http_server = server
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                await asyncio.sleep(0.02)
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            await task
            sock.close()

    async def start_spoke(
        self,
        spoke_id: str,
        region: str,
        static_nodes: list[NodeInventory] | None,
        *,
        heartbeat_s: float = 0.5,
        runtime_factory: RuntimeFactory | None = None,
        nats_url: str | None = None,
        ready_s: float = 10,
        **extra: Any,
    ) -> SpokeAgent:
        """A spoke agent running in this process until `close`, once it is ready.

        `static_nodes` is its inventory; None: the one its settings name (`extra`, e.g.
        `inventory="kubernetes", runtime="kubernetes", kubeconfig=...`), as `gpufed spoke`.
        """
        nats_url = nats_url or self.nats_url  # a regional leaf node, or the hub's server
        settings = SpokeSettings(
            id=spoke_id,
            region=region,
            nats_url=nats_url,
            nats_creds=self.creds_file(f"spoke-{spoke_id}", identities.spoke_permissions(spoke_id)),
            state_dir=self.root / "spokes",
            heartbeat_s=heartbeat_s,
            stop_grace_s=2.0,
            **extra,
        )
        inventory = StaticInventory(static_nodes) if static_nodes is not None else None
        agent = build_spoke(settings, inventory, runtime_factory)
        self.spokes[spoke_id] = agent
        self._spawn(spoke_id, agent.run)
        await asyncio.wait_for(agent.ready.wait(), ready_s)
        return agent

    def creds_file(self, name: str, permissions: Permissions) -> Path | None:
        """A fresh credential for `name` as a 0600 file (None when the server has no auth)."""
        if self.authority is None:
            return None
        issued = self.authority.issue(name, permissions, now=int(time.time()))
        return write_secret(self.root / "creds" / f"{name}.creds", issued.creds)

    def tool_settings(self, name: str = "test") -> BusSettings:
        """A test's own connection, with the hub's rights (credential in memory)."""
        creds = None
        if self.authority is not None:
            issued = self.authority.issue(name, identities.hub_permissions(), now=int(time.time()))
            creds = RawCredentials(issued.creds)
        return BusSettings(
            url=self.nats_url,
            name=name,
            user_credentials=creds,
            inbox_prefix=identities.inbox_prefix(identities.HUB),
        )

    async def wait_spokes(self, count: int, timeout: float = 10) -> None:
        assert self.hub is not None
        hub = self.hub
        await wait_until(lambda: len(hub.reports) >= count, timeout, f"{count} spokes to report")

    async def submit(self, **spec: Any) -> str:
        assert self.api is not None
        response = await self.api.post("/v1/workloads", json=spec)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def workload(self, workload_id: str) -> dict[str, Any]:
        assert self.api is not None
        response = await self.api.get(f"/v1/workloads/{workload_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def wait_phase(
        self, workload_id: str, phases: set[Phase], timeout: float = 20
    ) -> dict[str, Any]:
        wanted = {p.value for p in phases}
        record: dict[str, Any] = {}

        async def reached() -> bool:
            record.update(await self.workload(workload_id))
            return record["phase"] in wanted

        await wait_until(reached, timeout, f"{workload_id} to reach {sorted(wanted)}", every=0.05)
        return record

    async def stop(self, name: str) -> None:
        self._stops[name].set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._tasks.pop(name), 15)

    async def close(self) -> None:
        for name in list(self._tasks):
            if name != "hub":
                await self.stop(name)
        if "hub" in self._tasks:
            await self.stop("hub")
        if self.api is not None:
            await self.api.aclose()
        if self.app is not None:  # as `gpufed hub` stops: the counts of refusals held
            await self.app.state.security.auditor.close()
        if self.hub is not None:
            self.hub.store.close()
        # Spokes leave their workloads running for a restarted spoke to adopt; none will come.
        kill_workloads_under(self.root)

    def _spawn(self, name: str, run: Callable[[asyncio.Event], Any]) -> None:
        stop = asyncio.Event()
        self._stops[name] = stop
        self._tasks[name] = asyncio.create_task(run(stop), name=name)
