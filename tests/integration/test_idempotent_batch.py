"""A batch sent again under its Idempotency-Key takes each of its workloads at most once: a
pipeline whose 10,000-job sweep timed out sends it again without running any job twice.

A real hub on a real nats-server, its REST API in-process; no spoke joins, so what is taken
stays queued.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bus.client import Bus
from hub.core.policy import Policy, Team
from schemas import SubmitBatchReply, subjects
from tests.integration.fed import InProcessFederation


def _items(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {"name": f"{prefix}-{i}", "team": "vision", "command": ["sleep", "60"]}
        for i in range(count)
    ]


async def _send(fed: InProcessFederation, key: str | None, items: list[Any]) -> dict[str, Any]:
    assert fed.api is not None
    headers = {"Idempotency-Key": key} if key is not None else {}
    response = await fed.api.post("/v1/workloads:batch", json=items, headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def _count(fed: InProcessFederation, prefix: str) -> int:
    assert fed.api is not None
    listed = (await fed.api.get("/v1/workloads", params={"team": "vision"})).json()
    return sum(w["spec"]["name"].startswith(prefix + "-") for w in listed)


async def test_a_batch_sent_again_answers_with_what_it_made(fed: InProcessFederation) -> None:
    await fed.start_hub()
    items = [*_items("sweep", 5), {"name": "Not_A_Name", "team": "vision", "command": ["x"]}]
    first = await _send(fed, "sweep-1", items)
    again = await _send(fed, "sweep-1", items)
    assert (first["accepted"], first["refused"]) == (5, 1)
    assert again["results"] == first["results"]  # the same ids, the same refusal
    assert await _count(fed, "sweep") == 5
    # Sent many times at once under another key: each of its workloads once.
    at_once = await asyncio.gather(*(_send(fed, "sweep-2", _items("sweep", 5)) for _ in range(4)))
    assert all(reply["results"] == at_once[0]["results"] for reply in at_once)
    assert await _count(fed, "sweep") == 10
    # Another spec at one place under the first key: that one refused, the rest as before.
    changed = [*items[:2], {**items[2], "command": ["sleep", "61"]}, *items[3:]]
    reply = await _send(fed, "sweep-1", changed)
    assert reply["results"][2]["error"]["code"] == "idempotency_key_reused"
    assert "item 2" in reply["results"][2]["error"]["message"]
    assert [r for i, r in enumerate(reply["results"]) if i != 2] == [
        r for i, r in enumerate(first["results"]) if i != 2
    ]
    assert await _count(fed, "sweep") == 10
    # Without a key a batch sent again is another batch, as before.
    await _send(fed, None, _items("plain", 2))
    await _send(fed, None, _items("plain", 2))
    assert await _count(fed, "plain") == 4
    assert fed.api is not None
    bad = await fed.api.post("/v1/workloads:batch", json=items, headers={"Idempotency-Key": " "})
    assert (bad.status_code, bad.json()["code"]) == (422, "invalid_request")


async def test_what_policy_refused_is_taken_when_sent_again_with_room(
    fed: InProcessFederation,
) -> None:
    fed.policy = Policy(teams=(Team("vision", max_queued=3),))
    await fed.start_hub()
    assert fed.api is not None
    full = await _send(fed, None, _items("fill", 3))
    first = await _send(fed, "k", _items("q", 2))
    assert [r["error"]["code"] for r in first["results"]] == ["too_many_queued"] * 2
    cancelled = await fed.api.delete(f"/v1/workloads/{full['results'][0]['workload_id']}")
    assert cancelled.status_code == 202
    # Nothing of it was taken: sent again with room for one, its first item is taken now,
    # and then only once.
    again = await _send(fed, "k", _items("q", 2))
    assert [r["ok"] for r in again["results"]] == [True, False]
    assert (await _send(fed, "k", _items("q", 2)))["results"] == again["results"]
    assert await _count(fed, "q") == 1
    # With room for the other, the other: the first is the workload it was.
    cancelled = await fed.api.delete(f"/v1/workloads/{full['results'][1]['workload_id']}")
    assert cancelled.status_code == 202
    last = await _send(fed, "k", _items("q", 2))
    assert [r["ok"] for r in last["results"]] == [True, True]
    assert last["results"][0] == again["results"][0]
    assert await _count(fed, "q") == 2


async def test_over_nats_a_batch_under_its_key_is_taken_once(fed: InProcessFederation) -> None:
    await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()

    async def send(key: str) -> SubmitBatchReply:
        payload = json.dumps(_items("nats", 3)).encode()
        headers = {subjects.IDEMPOTENCY_KEY: key}
        msg = await bus.nc.request(subjects.SUBMIT_BATCH, payload, 10, headers=headers)
        return SubmitBatchReply.model_validate_json(msg.data)

    try:
        first, again = await send("n"), await send("n")
        bad = await send("with space")
    finally:
        await bus.close()
    assert first.accepted == 3 and again.results == first.results
    assert bad.error is not None and bad.error.code == "invalid_request"
    assert await _count(fed, "nats") == 3
