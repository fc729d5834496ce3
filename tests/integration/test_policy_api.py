"""Policy through the REST API: quota reclaim, priority preemption, explanations, bad policy."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes

POLICY: dict[str, Any] = {
    "version": 1,
    "teams": [
        {"name": "vision", "quotas": {"H100": {"guaranteed": 4, "limit": 8}}},
        {"name": "nlp", "quotas": {"H100": {"guaranteed": 4, "limit": 8}}},
        {"name": "tiny", "quotas": {"H100": {"guaranteed": 0, "limit": 1}}},
    ],
}


def long_job(name: str, team: str, klass: str = "batch", gpus: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "team": team,
        "priority_class": klass,
        "gpus_per_node": gpus,
        "gpu_model": "H100",
        "command": ["sleep", "60"],
    }


async def tinys_second_job(fed: InProcessFederation) -> dict[str, Any]:
    """Team tiny's second one-H100 job, once the hub says why it waits (or after 5 s): the
    first has started (within 30 s, as a restarted hub may first wait for the spoke)."""
    first = await fed.submit(**long_job("t1", "tiny"))
    await fed.wait_phase(first, {Phase.RUNNING}, timeout=30)
    second = await fed.submit(**long_job("t2", "tiny"))
    record: dict[str, Any] = {}
    for _ in range(100):
        record = await fed.workload(second)
        if record["reason"]:
            break
        await asyncio.sleep(0.05)
    return record


async def put_policy(fed: InProcessFederation, policy: dict[str, Any]) -> Any:
    assert fed.api is not None
    return await fed.api.put("/v1/policy", json=policy)


async def test_invalid_policy_is_refused_and_the_old_one_stays(fed: InProcessFederation) -> None:
    await fed.start_hub()
    assert (await put_policy(fed, POLICY)).status_code == 200
    bad = {
        "version": 1,
        "teams": [{"name": "x", "quotas": {"H100": {"guaranteed": 8, "limit": 4}}}],
    }
    response = await put_policy(fed, bad)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_policy"
    assert "limit" in response.json()["message"]
    assert fed.api is not None
    current = (await fed.api.get("/v1/policy")).json()
    assert [t["name"] for t in current["teams"]] == ["vision", "nlp", "tiny"]


async def test_a_refusal_names_every_bad_field_by_team_and_model(
    fed: InProcessFederation,
) -> None:
    # `gpufed policy set` goes through the API: it used to answer with the first problem only,
    # by list index ("teams.0.quotas.H100.guaranted: ... (and 1 more problem)"), unlike the
    # names docs/policy.md shows and `gpufed hub --policy` prints.
    await fed.start_hub()
    bad = {
        "teams": [
            {"name": "vision", "quotas": {"H100": {"guaranted": 4}}},
            {"name": "nlp", "quotas": {"A100": {"guaranteed": -1}}},
        ],
    }
    response = await put_policy(fed, bad)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_policy"
    assert response.json()["message"] == (
        "teams[vision].quotas[H100]: unknown field: guaranted (did you mean guaranteed?); "
        "teams[nlp].quotas[A100].guaranteed: Input should be greater than or equal to 0"
    )


async def test_policy_survives_a_hub_restart(fed: InProcessFederation) -> None:
    await fed.start_hub()
    assert (await put_policy(fed, POLICY)).status_code == 200
    await fed.stop("hub")
    assert fed.api is not None
    await fed.api.aclose()
    fed.hub.store.close()  # type: ignore[union-attr]
    await fed.start_hub()
    current = (await fed.api.get("/v1/policy")).json()
    assert {t["name"] for t in current["teams"]} == {"vision", "nlp", "tiny"}


async def test_a_policy_an_older_hub_stored_with_one_model_twice_keeps_the_hub_up(
    fed: InProcessFederation,
) -> None:
    # An older hub keyed quotas as written: tiny's `h100` quota held nothing beside its
    # `H100` one, and the stored policy has both. The hub refused it on restore, and did not
    # start; it starts, and tiny keeps the H100 limit it had.
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    await fed.stop("hub")
    assert fed.api is not None and fed.hub is not None
    await fed.api.aclose()
    stored = {"h100": {"limit": 4}, "H100": {"limit": 1}}  # the one not in force first
    document = {"version": 1, "teams": [{"name": "tiny", "quotas": stored}]}
    fed.hub.store.put_setting("policy", json.dumps(document), 0.0)
    fed.hub.store.close()
    await fed.start_hub()
    current = (await fed.api.get("/v1/policy")).json()
    tiny = next(t for t in current["teams"] if t["name"] == "tiny")
    assert tiny["quotas"] == {"H100": {"guaranteed": 0, "limit": 1}}
    record = await tinys_second_job(fed)
    assert (record["phase"], record["reason"]) == ("queued", "team_limit")
    assert "H100" in record["message"] and "1/1" in record["message"]


async def test_team_under_guarantee_reclaims_borrowed_gpus(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await put_policy(fed, POLICY)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"))
    await fed.wait_spokes(1)
    borrowed = [await fed.submit(**long_job(f"nlp-{i}", "nlp")) for i in range(8)]
    for wid in borrowed:
        await fed.wait_phase(wid, {Phase.RUNNING})
    # vision is under its guarantee of 4: it takes back what nlp borrowed beyond its own 4.
    reclaim = [await fed.submit(**long_job(f"vision-{i}", "vision")) for i in range(4)]
    for wid in reclaim:
        await fed.wait_phase(wid, {Phase.RUNNING}, timeout=30)
    nlp = [await fed.workload(w) for w in borrowed]
    requeued = [r for r in nlp if r["phase"] == "queued"]
    assert len(requeued) == 4
    for r in requeued:
        events = [h["event"] for h in r["history"]]
        assert "preempted" in events and "requeued" in events
        assert r["message"]  # and it says why it waits now
    assert sum(r["phase"] == "running" for r in nlp) == 4  # nlp keeps its guarantee


async def test_higher_priority_evicts_lower_within_a_team(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await put_policy(fed, POLICY)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    batch = [await fed.submit(**long_job(f"b-{i}", "vision")) for i in range(4)]
    for wid in batch:
        await fed.wait_phase(wid, {Phase.RUNNING})
    urgent = await fed.submit(**long_job("urgent", "vision", klass="training", gpus=2))
    await fed.wait_phase(urgent, {Phase.RUNNING}, timeout=30)
    phases = [(await fed.workload(w))["phase"] for w in batch]
    assert sorted(phases) == ["queued", "queued", "running", "running"]


async def test_explanations_name_the_limit(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await put_policy(fed, POLICY)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    record = await tinys_second_job(fed)
    assert record["phase"] == "queued"
    assert record["reason"] == "team_limit"
    assert (
        "tiny" in record["message"] and "H100" in record["message"] and "1/1" in record["message"]
    )


async def test_a_quota_typed_in_another_case_limits_the_fleets_model(
    fed: InProcessFederation,
) -> None:
    # `h100: {limit: 1}` was no H100 limit at all: tiny ran as many H100s as were free.
    lower = {"version": 1, "teams": [{"name": "tiny", "quotas": {"h100": {"limit": 1}}}]}
    await fed.start_hub()
    assert (await put_policy(fed, lower)).json()["teams"][0]["quotas"] == {
        "h100": {"guaranteed": 0.0, "limit": 1.0}  # no spoke has reported an H100 yet
    }
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    record = await tinys_second_job(fed)
    assert (record["phase"], record["reason"]) == ("queued", "team_limit")
    assert "H100" in record["message"] and "1/1" in record["message"]
    assert fed.api is not None
    current = (await fed.api.get("/v1/policy")).json()
    assert current["teams"][0]["quotas"] == {"H100": {"guaranteed": 0.0, "limit": 1.0}}
    # Set again now that the fleet has H100s: answered in the fleet's spelling.
    answered = (await put_policy(fed, lower)).json()
    assert answered["teams"][0]["quotas"] == {"H100": {"guaranteed": 0.0, "limit": 1.0}}
