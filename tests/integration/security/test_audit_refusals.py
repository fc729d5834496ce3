"""Refusals alike do not grow the audit log without bound: the first few are listed, the
rest counted in one entry. A real hub on a real nats-server, real tokens."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.integration.fed import InProcessFederation

OWN, OTHER = "vision", "nlp"


async def _denied_cancels(fed: InProcessFederation, times: int) -> tuple[str, httpx.AsyncClient]:
    """A member of OWN cancels a workload of OTHER `times` times: each refused."""
    seeded = await fed.api.post(
        "/v1/workloads", json={"name": "theirs", "team": OTHER, "command": ["sleep", "60"]}
    )
    assert seeded.status_code == 201, seeded.text
    target = str(seeded.json()["id"])
    mia = fed.client(await fed.token("mia", "member", OWN))
    for _ in range(times):
        assert (await mia.delete(f"/v1/workloads/{target}")).status_code == 403
    return target, mia


async def _mias_cancels(fed: InProcessFederation) -> list[dict[str, Any]]:
    entries = (await fed.api.get("/v1/audit", params={"action": "cancel", "limit": 1000})).json()
    return [e for e in entries if e["actor"] == "mia"]


async def test_a_hammered_refusal_is_listed_ten_times_and_the_rest_counted(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub(audit_refusals_window_s=1.5)
    target, mia = await _denied_cancels(fed, 40)
    try:
        listed = await _mias_cancels(fed)
        assert len(listed) == 10
        assert {(e["result"], e["target"]) for e in listed} == {("denied", target)}
        # Another action of the same caller is not alike: listed.
        assert (await mia.put("/v1/policy", json={})).status_code == 403
        policy = (await fed.api.get("/v1/audit", params={"action": "policy.set"})).json()
        assert [e["actor"] for e in policy] == ["mia"]
        # Once the window ends, the other 30 are one entry, with the target they asked for.
        for _ in range(100):
            entries = await _mias_cancels(fed)
            if len(entries) > 10:
                break
            await asyncio.sleep(0.1)
        summary = entries[0]  # newest first
        assert len(entries) == 11 and summary["result"] == "denied"
        assert summary["detail"] == (
            f"30 more denied alike within 1.5 s of the first, not listed one by one "
            f"(targets: {target})"
        )
        assert summary["role"] == "none" and summary["via"].startswith("token:")
    finally:
        await mia.aclose()


async def test_what_is_held_is_written_when_the_hub_stops(fed: InProcessFederation) -> None:
    await fed.start_hub()  # a minute's window: nothing summed while the test runs
    _, mia = await _denied_cancels(fed, 15)
    await mia.aclose()
    assert len(await _mias_cancels(fed)) == 10
    assert fed.app is not None
    await fed.app.state.security.auditor.close()  # what `gpufed hub` does as it stops
    entries = await _mias_cancels(fed)
    assert len(entries) == 11
    assert entries[0]["detail"].startswith("5 more denied alike within 60 s of the first")


async def test_a_hub_told_to_list_every_refusal_lists_every_one(fed: InProcessFederation) -> None:
    await fed.start_hub(audit_refusals_listed=0)  # `gpufed hub --audit-refusals 0`
    _, mia = await _denied_cancels(fed, 25)
    await mia.aclose()
    assert len(await _mias_cancels(fed)) == 25
