"""Batch submission: each spec stands or falls alone, the valid ones are all stored, and a batch
over the limit is refused whole with an error that says so."""

from __future__ import annotations

import json
import time

import pytest

from bus.client import Bus
from hub.core.policy import Policy, Team
from schemas import MAX_BATCH, Phase, SubmitBatchReply, subjects
from tests.integration.fed import InProcessFederation, nodes

pytestmark = pytest.mark.integration

GOOD = {"name": "ok", "team": "vision", "command": ["true"]}


async def test_rest_batch_stores_the_valid_and_names_each_problem(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    assert fed.api is not None
    specs = [
        {**GOOD, "name": "first"},
        {**GOOD, "nodes": 0},
        {**GOOD, "name": "third"},
        {**GOOD, "priority_class": "vip"},
        "not a spec",
    ]
    response = await fed.api.post("/v1/workloads:batch", json={"workloads": specs})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["accepted"], body["refused"]) == (2, 3)
    results = body["results"]
    assert [r["ok"] for r in results] == [True, False, True, False, False]
    assert results[1]["error"]["field"] == "nodes"
    assert results[3]["error"]["field"] == "priority_class"
    assert results[4]["error"]["code"] == "invalid_workload"
    listed = (await fed.api.get("/v1/workloads")).json()
    assert sorted(w["spec"]["name"] for w in listed) == ["first", "third"]
    assert {w["id"] for w in listed} == {results[0]["workload_id"], results[2]["workload_id"]}


async def test_rest_batch_over_the_limit_is_refused_whole(fed: InProcessFederation) -> None:
    await fed.start_hub()
    assert fed.api is not None
    response = await fed.api.post("/v1/workloads:batch", json=[GOOD] * (MAX_BATCH + 1))
    assert response.status_code == 413
    body = response.json()
    assert body["code"] == "batch_too_large"
    assert str(MAX_BATCH) in body["message"]
    response = await fed.api.post("/v1/workloads:batch", json={"name": "not a list"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_batch"
    assert (await fed.api.get("/v1/workloads")).json() == []  # nothing was stored


async def test_nats_batch_of_the_largest_size_is_stored_and_runs(
    fed: InProcessFederation,
) -> None:
    # Room for it all: a batch's items count against the team's max_queued (5,000 by default).
    fed.policy = Policy(teams=(Team("vision", max_queued=MAX_BATCH),))
    hub = await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 2, 8, "H100"))
    bus = Bus(fed.tool_settings())
    await bus.connect()
    try:
        spec = {"name": "b", "team": "vision", "command": ["true"]}
        payload = json.dumps([spec] * MAX_BATCH).encode()
        reply = SubmitBatchReply.model_validate_json(
            (await bus.nc.request(subjects.SUBMIT_BATCH, payload, 60)).data
        )
    finally:
        await bus.close()
    assert reply.error is None
    assert (reply.accepted, reply.refused) == (MAX_BATCH, 0)
    ids = [r.workload_id for r in reply.results]
    assert len(set(ids)) == MAX_BATCH
    stored = await hub.db(hub.store.find, limit=MAX_BATCH + 1)
    assert {w.id for w in stored} == set(ids)
    # They are scheduled like any other submission: the first in the queue runs.
    record = await fed.wait_phase(ids[0], {Phase.SUCCEEDED}, timeout=60)
    assert record["phase"] == "succeeded"


async def test_a_nats_batch_whose_every_spec_is_refused_is_answered(
    fed: InProcessFederation,
) -> None:
    """Its reply, whole, is over twice the server's `max_payload` (1 MiB): it was never sent,
    and the sender waited for nothing while the rest of a batch like it would have been taken."""
    await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()
    try:
        specs = [{**GOOD, "priority_class": "urgent"}] * (MAX_BATCH - 1) + [GOOD]
        data = (await bus.nc.request(subjects.SUBMIT_BATCH, json.dumps(specs).encode(), 60)).data
        assert len(data) <= bus.nc.max_payload
        reply = SubmitBatchReply.model_validate_json(data)
    finally:
        await bus.close()
    assert (reply.accepted, reply.refused) == (1, MAX_BATCH - 1)
    first, *others, taken = reply.results
    assert first.error is not None and first.error.field == "priority_class"
    assert "priority class 'urgent' is not defined" in first.error.message
    assert all(r.error is not None and r.error.field == "priority_class" for r in others)
    assert {r.error.message for r in others if r.error is not None} == {"as item 0"}
    assert taken.ok and taken.workload_id is not None
    assert fed.hub is not None
    assert [w.id for w in fed.hub.workloads.values()] == [taken.workload_id]


async def test_a_list_since_a_time_holds_only_what_was_submitted_from_then(
    fed: InProcessFederation,
) -> None:
    # `gpufed replay --from-hub --since 7d` reads its window only: a hub keeps 90 days of
    # ended work, and a list of all of it costs the hub about 13 KiB of memory a workload.
    day = 86400.0
    shift = [-2 * day]
    await fed.start_hub(clock=lambda: time.time() + shift[0])
    assert fed.api is not None
    old = await fed.api.post("/v1/workloads:batch", json=[GOOD, GOOD])
    assert old.json()["accepted"] == 2
    shift[0] = 0.0
    new = await fed.api.post("/v1/workloads:batch", json=[GOOD])
    (newest,) = [r["workload_id"] for r in new.json()["results"]]
    since = {"since": time.time() - day}
    assert [w["id"] for w in (await fed.api.get("/v1/workloads", params=since)).json()] == [newest]
    assert len((await fed.api.get("/v1/workloads")).json()) == 3
    refused = await fed.api.get("/v1/workloads", params={"since": -1})
    assert refused.status_code == 422
