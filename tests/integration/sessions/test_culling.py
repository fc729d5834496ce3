"""Idle sessions are culled, and long ones stopped, by the policy; busy or used ones run on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

from hub.policyfile import load_policy, policy_to_dict
from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.integration.sessions.helpers import STOP_ON_EXIT, get_when_up, gpufed, session


async def set_policy(fed: InProcessFederation, text: str) -> None:
    assert fed.api is not None
    response = await fed.api.put("/v1/policy", json=policy_to_dict(load_policy(text)))
    assert response.status_code == 200, response.text


@contextlib.asynccontextmanager
async def traffic(url: str) -> AsyncIterator[None]:
    """Someone working in the session: a request every 0.2 s until the block ends."""

    async def use() -> None:
        async with httpx.AsyncClient() as client:
            while True:
                await client.get(url, timeout=5)
                await asyncio.sleep(0.2)

    task = asyncio.create_task(use())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_only_the_session_idle_on_gpu_and_port_is_culled(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await set_policy(fed, "sessions: {idle_after: 2s}")
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    idle = await fed.submit(**session("idle", load_percent=1))
    busy = await fed.submit(**session("busy"))  # reports no load: counts as fully busy
    used = await fed.submit(**session("used", load_percent=1))
    urls = {}
    for wid in (idle, busy, used):
        record = await fed.wait_phase(wid, {Phase.RUNNING})
        urls[wid] = record["endpoint"]
        await get_when_up(urls[wid])

    async with traffic(urls[used]):
        culled = await fed.wait_phase(idle, {Phase.CANCELLED}, timeout=30)
        # By now the others have been running as long, idle GPU or quiet port alone.
        assert (await fed.workload(busy))["phase"] == "running"
        assert (await fed.workload(used))["phase"] == "running"

    assert culled["reason"] == "idle_culled"
    notices = [h["detail"] for h in culled["history"] if h["event"] == "stopping"]
    assert notices and "no traffic on its port" in notices[0]
    assert "sessions.idle_after 2s" in notices[0]
    assert culled["history"][-1]["event"] == "idle_culled"


async def test_a_session_is_stopped_at_its_maximum_lifetime(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await set_policy(fed, "sessions: {max_lifetime: 2s}")
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    wid = await fed.submit(**session("long"))  # busy and in use would not save it
    running = await fed.wait_phase(wid, {Phase.RUNNING})
    ended = await fed.wait_phase(wid, {Phase.CANCELLED}, timeout=30)

    assert ended["reason"] == "max_lifetime"
    assert ended["finished_at"] - running["started_at"] >= 2.0
    assert "maximum lifetime of 2s" in ended["message"]


async def test_jobs_says_why_the_hub_stopped_a_session(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await set_policy(fed, "sessions: {max_lifetime: 1s}")
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    wid = await fed.submit(**session("nb"))
    await fed.wait_phase(wid, {Phase.CANCELLED}, timeout=30)
    async with fed.serve() as api:
        code, out, err = await gpufed(fed, api, "jobs")
    assert code == 0, err
    [row] = [line for line in out.splitlines() if line.startswith(wid)]
    # The owner of a notebook that went away sees why in the table, not a blank.
    assert "cancelled" in row and "maximum lifetime of 1s" in row
