"""Services across regions, and across a hub restart."""

from __future__ import annotations

from tests.integration.fed import InProcessFederation, nodes
from tests.integration.services.test_services import TEAM, service, show, wait_service


async def test_replicas_spread_over_the_preferred_regions(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "L4"))
    await fed.start_spoke("us-1", "us", nodes("us-1", 1, 2, "L4"))
    await fed.start_spoke("ap-1", "ap", nodes("ap-1", 1, 2, "L4"))
    await fed.wait_spokes(3)
    assert fed.api is not None
    spec = service("spread", replicas=2, regions=["us", "eu"])
    assert (await fed.api.post("/v1/services", json=spec)).status_code == 201
    status = await wait_service(fed.api, "spread", "two ready", lambda s: s["ready"] == 2)
    assert sorted(r["spoke_id"] for r in status["replicas"]) == ["eu-1", "us-1"]


async def test_a_restarted_hub_keeps_its_services_and_their_replicas(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "L4"))
    await fed.wait_spokes(1)
    assert fed.api is not None
    assert (await fed.api.post("/v1/services", json=service("keep"))).status_code == 201
    before = await wait_service(fed.api, "keep", "ready", lambda s: s["ready"] == 1)
    assert (await fed.api.get(f"/svc/{TEAM}/keep/x")).status_code == 200

    await fed.api.aclose()
    await fed.stop("hub")
    await fed.start_hub()
    assert fed.api is not None
    after = await wait_service(fed.api, "keep", "ready again", lambda s: s["ready"] == 1)
    assert [r["workload_id"] for r in after["replicas"]] == [
        r["workload_id"] for r in before["replicas"]
    ]
    answer = await fed.api.get(f"/svc/{TEAM}/keep/y")
    assert answer.status_code == 200
    assert (await show(fed.api, "keep"))["requests"] >= 1
