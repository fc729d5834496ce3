"""A session listens on $GPUFED_PORT and is reached through the URL its spoke reports."""

from __future__ import annotations

import httpx

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.integration.sessions.helpers import STOP_ON_EXIT, get_when_up, session


async def test_a_session_is_reached_at_the_url_its_spoke_reports(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    wid = await fed.submit(**session("notebook"))
    record = await fed.wait_phase(wid, {Phase.RUNNING})
    assert record["spec"]["priority_class"] == "dev"  # a session's class unless it names one
    url = record["endpoint"]
    assert url and url.startswith("http://127.0.0.1:")
    response = await get_when_up(url)
    assert response.status_code == 200
    assert response.text == f"hello from {wid}"

    assert fed.api is not None
    listed = (await fed.api.get("/v1/workloads")).json()
    assert [w["endpoint"] for w in listed if w["id"] == wid] == [url]

    await fed.api.delete(f"/v1/workloads/{wid}")
    ended = await fed.wait_phase(wid, {Phase.CANCELLED})
    assert ended["endpoint"] is None  # an ended session has no URL


async def test_each_session_gets_a_host_name_of_its_own_where_the_url_host_asks(
    fed: InProcessFederation,
) -> None:
    # A browser sends a host's cookies to every port of it: two teams' notebooks on one
    # spoke host at one name would each be sent the other's. `{id}` in the URL host (with
    # wildcard DNS to the spoke host) gives each its own name.
    await fed.start_hub()
    await fed.start_spoke(
        "eu-1", "eu", nodes("eu-1", 1, 2, "H100"), expose_url_host="{id}.nb.gpu.example",
        **STOP_ON_EXIT,
    )  # fmt: skip
    await fed.wait_spokes(1)
    ids = [
        await fed.submit(**session("vision-nb")),
        await fed.submit(**session("nlp-nb", team="nlp")),
    ]
    for wid in ids:
        url = httpx.URL((await fed.wait_phase(wid, {Phase.RUNNING}))["endpoint"])
        assert url.host == f"{wid}.nb.gpu.example"
        # what the wildcard name resolves to: the spoke host, whose relay answers at the port
        response = await get_when_up(f"http://127.0.0.1:{url.port}")
        assert response.text == f"hello from {wid}"


async def test_a_job_gets_no_port_and_no_url(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    wid = await fed.submit(
        name="plain",
        team="vision",
        command=["sh", "-c", 'test -z "$GPUFED_PORT" && sleep 30'],
    )
    record = await fed.wait_phase(wid, {Phase.RUNNING})
    assert record["spec"]["priority_class"] == "batch"
    assert record["endpoint"] is None


async def test_a_session_keeps_its_url_across_a_spoke_restart(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(**session("notebook"))
    url = (await fed.wait_phase(wid, {Phase.RUNNING}))["endpoint"]
    await get_when_up(url)

    await fed.stop("eu-1")  # the session's process runs on; its relay went with the spoke
    agent = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)

    assert agent.runtime.running() == {wid: 1}  # re-adopted, not restarted
    response = await get_when_up(url)  # the URL the hub and its user hold works again
    assert response.text == f"hello from {wid}"
    assert (await fed.workload(wid))["endpoint"] == url
