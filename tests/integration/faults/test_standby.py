"""Two hub replicas on one PostgreSQL: one leads, the other stands by and takes over when the
leader is killed with SIGKILL. Each workload appends "<id> <node>" to one file when it starts:
the workloads' own record of how often they ran.
"""

from __future__ import annotations

import asyncio
import stat
from collections import Counter
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from bus.client import Bus
from gpufed.client import HubClient
from gpufed.up import Federation, SimSpoke
from tests.integration.faults.test_faults import (
    job,
    runs,
    submit_retrying,
    wait_http,
    wait_terminal,
)
from tests.support.wait import wait_until


@pytest.fixture
def two_hubs(tmp_path: Path, pg_url: str) -> Iterator[tuple[Federation, int]]:
    fleet = (
        SimSpoke("eu-1", "eu", nodes=2, gpus=4, model="H100"),
        SimSpoke("us-1", "us", nodes=2, gpus=4, model="L4"),
    )
    fed = Federation(tmp_path / "fed", api_port=0, fleet=fleet, store_url=pg_url)
    try:
        fed.start(hubs=2)  # as `gpufed up --hubs 2`
        # The store's URL holds PostgreSQL's password: the hubs read it from a private file.
        assert stat.S_IMODE(fed.store_url_file.stat().st_mode) == 0o600
        password = make_url(pg_url).password
        assert password
        for name in ("hub", "hub-2"):
            argv = Path(f"/proc/{fed.procs[name].pid}/cmdline").read_bytes().decode()
            assert "--store-url-file" in argv and password not in argv, name
        yield fed, fed.hub_ports["hub-2"]
    finally:
        fed.stop()


async def health(client: httpx.AsyncClient) -> dict[str, Any]:
    try:
        return dict((await client.get("/v1/health")).json())
    except httpx.TransportError:
        return {}


async def _one_each(found: Awaitable[dict[str, str]]) -> bool:
    return sorted((await found).values()) == ["leader", "standby"]


async def test_standby_refuses_writes_then_takes_over_from_a_killed_leader(
    two_hubs: tuple[Federation, int], tmp_path: Path
) -> None:
    fed, port_b = two_hubs
    auth = {"Authorization": f"Bearer {fed.admin_token}"}  # both replicas read one token table
    clients = {
        "hub": httpx.AsyncClient(base_url=fed.api_url, timeout=5, headers=auth),
        "hub-2": httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_b}", timeout=5, headers=auth),
    }
    bus = Bus(fed.client_settings("drill"))

    async def roles() -> dict[str, str]:
        return {name: (await health(c)).get("role", "") for name, c in clients.items()}

    try:
        # Whichever replica took the lock first leads; the other stands by.
        await wait_until(lambda: _one_each(roles()), timeout=60, what="one leader and one standby")
        found = await roles()
        leader_name = next(name for name, role in found.items() if role == "leader")
        leader = clients[leader_name]
        standby = clients["hub-2" if leader_name == "hub" else "hub"]
        await wait_http(leader, {"eu-1", "us-1"})
        # A cordon set on the leader shows on the standby's reads too (and lifted, is gone).
        put = await leader.put("/v1/spokes/us-1/cordon", json={"reason": "rack 4 power work"})
        assert put.status_code == 200, put.text

        async def standby_shows(reason: str | None) -> bool:
            spokes = {s["id"]: s for s in (await standby.get("/v1/spokes")).json()}
            cordon = spokes.get("us-1", {}).get("cordoned")
            return cordon is None if reason is None else (cordon or {}).get("reason") == reason

        reason = "rack 4 power work"
        await wait_until(lambda: standby_shows(reason), timeout=10, what="the cordon there")
        assert (await leader.delete("/v1/spokes/us-1/cordon")).status_code == 200
        await wait_until(lambda: standby_shows(None), timeout=10, what="it lifted there")
        log = tmp_path / "runs.log"
        refused = await standby.post("/v1/workloads", json=job(log, "w", 0.1))
        assert refused.status_code == 503
        assert refused.json()["code"] == "not_leader"
        assert "standby" in refused.json()["message"]
        assert str(leader.base_url).rstrip("/") in refused.json()["message"]  # names the leader
        # The CLI's client, given only the standby's URL, follows to the leader it names.
        follower = HubClient(str(standby.base_url), timeout_s=5, token=fed.admin_token)
        try:
            followed = await asyncio.to_thread(follower.submit, job(log, "followed", 0.1))
        finally:
            follower.close()
        assert follower.base_url == str(leader.base_url).rstrip("/")
        first = (await leader.post("/v1/workloads", json=job(log, "first", 0.1))).json()["id"]
        await wait_terminal(leader, {first, followed["id"]}, timeout=30)
        listed = (await standby.get(f"/v1/workloads/{first}")).json()  # reads are served
        assert listed["phase"] == "succeeded"

        await bus.connect()
        accepted: list[str] = []

        async def submitter() -> None:
            for i in range(80):
                wid = await submit_retrying(bus, job(log, f"j{i}", 0.3))
                if wid is not None:
                    accepted.append(wid)
                await asyncio.sleep(0.02)

        task = asyncio.create_task(submitter())
        while len(accepted) < 25:
            await asyncio.sleep(0.05)
        fed.kill(leader_name)  # kill -9 of the leader mid-stream
        await task
        assert len(accepted) == 80
        while (await health(standby)).get("role") != "leader":
            await asyncio.sleep(0.1)
        records = await wait_terminal(standby, {first, *accepted}, timeout=120)
    finally:
        await bus.close()
        for client in clients.values():
            await client.aclose()
    assert {r["phase"] for r in records.values()} == {"succeeded"}
    counts = Counter(w for w, _ in runs(log))
    assert counts[followed["id"]] == 1
    assert all(counts[w] == 1 for w in [first, *accepted]), {
        w: counts[w] for w in accepted if counts[w] != 1
    }
    assert max(counts.values()) == 1
