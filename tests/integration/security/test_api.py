"""Who may do what through the REST API: the 401/403 matrix, secrets, audit and hostile input.

A real hub on a real nats-server; every caller holds a real token minted in the hub's store.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bus.client import Bus
from schemas import SubmitBatchReply, SubmitReply, subjects
from tests.integration.fed import InProcessFederation

OWN, OTHER = "vision", "nlp"


def job(team: str, name: str = "j", **extra: Any) -> dict[str, Any]:
    # Nothing runs: no spoke joins, so every workload stays queued and can be cancelled.
    return {"name": name, "team": team, "command": ["sleep", "60"], **extra}


class Callers:
    """One client per role (on OWN), plus a member of OTHER, plus anonymous and forged."""

    def __init__(self, fed: InProcessFederation) -> None:
        self.fed = fed
        self.clients: dict[str, httpx.AsyncClient] = {}
        self.token_ids: dict[str, str] = {}

    async def start(self) -> Callers:
        tokens = {
            "admin": await self.fed.token("root", "admin"),
            "team-admin": await self.fed.token("tess", "team-admin", OWN),
            "member": await self.fed.token("mia", "member", OWN),
            "viewer": await self.fed.token("vic", "viewer", OWN),
            "other-member": await self.fed.token("olaf", "member", OTHER),
        }
        for name, token in tokens.items():
            self.clients[name] = self.fed.client(token)
            self.token_ids[name] = token.split("_")[1]
        self.clients["anonymous"] = self.fed.client(None)
        self.clients["bad"] = self.fed.client("gpufed_0123456789ab_" + "x" * 43)
        self.clients["garbage"] = self.fed.client("not-a-token")
        return self

    def __getitem__(self, name: str) -> httpx.AsyncClient:
        return self.clients[name]

    async def close(self) -> None:
        for client in self.clients.values():
            await client.aclose()


@pytest.fixture
async def callers(fed: InProcessFederation) -> Any:
    await fed.start_hub()
    result = await Callers(fed).start()
    try:
        yield result
    finally:
        await result.close()


async def _workload(c: Callers, team: str) -> str:
    response = await c["admin"].post("/v1/workloads", json=job(team, f"seed-{team}"))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


# role -> (submit own, submit other, read own, read other, cancel own, cancel other,
#          usage, audit own, audit other, policy set, token create)
MATRIX: dict[str, tuple[int, ...]] = {
    "viewer": (403, 403, 200, 403, 403, 403, 403, 403, 403, 403, 403),
    "member": (201, 403, 200, 403, 202, 403, 403, 403, 403, 403, 403),
    "team-admin": (201, 403, 200, 403, 202, 403, 200, 200, 403, 403, 403),
    "admin": (201, 201, 200, 200, 202, 202, 200, 200, 200, 200, 201),
}


@pytest.mark.parametrize("role", list(MATRIX))
async def test_each_role_may_do_exactly_what_it_should_on_own_and_other_team(
    callers: Callers, role: str
) -> None:
    client = callers[role]
    own, other = await _workload(callers, OWN), await _workload(callers, OTHER)
    policy = (await callers["admin"].get("/v1/policy")).json()
    got = (
        (await client.post("/v1/workloads", json=job(OWN))).status_code,
        (await client.post("/v1/workloads", json=job(OTHER))).status_code,
        (await client.get(f"/v1/workloads/{own}")).status_code,
        (await client.get(f"/v1/workloads/{other}")).status_code,
        (await client.delete(f"/v1/workloads/{own}")).status_code,
        (await client.delete(f"/v1/workloads/{other}")).status_code,
        (await client.get("/v1/usage")).status_code,
        (await client.get("/v1/audit", params={"team": OWN})).status_code,
        (await client.get("/v1/audit", params={"team": OTHER})).status_code,
        (await client.put("/v1/policy", json=policy)).status_code,
        (
            await client.post("/v1/tokens", json={"user": "x", "role": "viewer", "team": OWN})
        ).status_code,
    )
    assert got == MATRIX[role]


async def test_a_refusal_is_403_naming_the_team(callers: Callers) -> None:
    other = await _workload(callers, OTHER)
    for response in (
        await callers["member"].post("/v1/workloads", json=job(OTHER)),
        await callers["member"].delete(f"/v1/workloads/{other}"),
        await callers["viewer"].get(f"/v1/workloads/{other}"),
        await callers["member"].get("/v1/workloads", params={"team": OTHER}),
    ):
        assert response.status_code == 403
        body = response.json()
        assert body["code"] == "forbidden" and OTHER in body["message"]
    # The other team's work was not touched.
    assert (await callers["admin"].get(f"/v1/workloads/{other}")).json()["phase"] == "queued"


async def test_production_for_a_team_the_caller_is_not_in_is_refused(callers: Callers) -> None:
    response = await callers["member"].post(
        "/v1/workloads", json=job(OTHER, priority_class="production")
    )
    assert response.status_code == 403
    listed = (await callers["admin"].get("/v1/workloads", params={"team": OTHER})).json()
    assert listed == []


async def test_every_v1_route_but_health_needs_a_valid_token(
    callers: Callers, fed: InProcessFederation
) -> None:
    schema = (await callers["anonymous"].get("/openapi.json")).json()
    routes = [
        (method, path.replace("{workload_id}", "w1").replace("{token_id}", "t1"))
        for path, item in schema["paths"].items()
        for method in item
        if path.startswith("/v1/") and path != "/v1/health"
    ]
    assert len(routes) >= 14
    for name in ("anonymous", "bad", "garbage"):
        for method, path in routes:
            response = await callers[name].request(method.upper(), path, json={})
            assert response.status_code == 401, (name, method, path, response.text)
            assert response.json()["code"] == "unauthenticated"
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert (await callers["anonymous"].get("/v1/health")).status_code == 200


async def test_a_workload_records_who_submitted_it(callers: Callers) -> None:
    created = await callers["member"].post("/v1/workloads", json=job(OWN, "mine"))
    assert created.status_code == 201
    assert created.json()["user"] == "mia"  # usage --by user adds up per person
    batch = await callers["member"].post("/v1/workloads:batch", json=[job(OWN, "b")])
    [result] = batch.json()["results"]
    fetched = await callers["admin"].get(f"/v1/workloads/{result['workload_id']}")
    assert fetched.json()["user"] == "mia"


async def test_lists_show_only_permitted_teams(callers: Callers) -> None:
    await _workload(callers, OWN)
    await _workload(callers, OTHER)
    for role in ("viewer", "member", "team-admin"):
        teams = {w["spec"]["team"] for w in (await callers[role].get("/v1/workloads")).json()}
        assert teams == {OWN}, role
    everyone = (await callers["admin"].get("/v1/workloads")).json()
    assert {w["spec"]["team"] for w in everyone} == {OWN, OTHER}
    usage = (await callers["team-admin"].get("/v1/usage")).json()
    assert set(usage["rows"]) <= {OWN}


async def test_secret_env_values_are_never_shown_back(callers: Callers) -> None:
    spec = job(OWN, env={"HF_TOKEN": {"value": "hf_s3cret", "secret": True}, "MODE": "fast"})
    created = await callers["member"].post("/v1/workloads", json=spec)
    assert created.status_code == 201
    wid = created.json()["id"]
    # The old wire form, a list of names beside a plain env, works the same.
    older = job(OWN, "older", env={"KEY": "k3y"}, secret_env=["KEY"])
    assert (await callers["member"].post("/v1/workloads", json=older)).status_code == 201
    shown = [
        created.text,
        (await callers["member"].get(f"/v1/workloads/{wid}")).text,
        (await callers["admin"].get("/v1/workloads")).text,
        (await callers["member"].delete(f"/v1/workloads/{wid}")).text,
        (await callers["admin"].get("/v1/audit")).text,
    ]
    for text in shown:
        assert "hf_s3cret" not in text and "k3y" not in text
    record = (await callers["member"].get(f"/v1/workloads/{wid}")).json()
    assert record["spec"]["env"] == {"HF_TOKEN": "***", "MODE": "fast"}


async def test_a_revoked_or_expired_token_is_refused(
    callers: Callers, fed: InProcessFederation
) -> None:
    created = await callers["admin"].post(
        "/v1/tokens", json={"user": "temp", "role": "member", "team": OWN}
    )
    assert created.status_code == 201
    token = created.json()["token"]
    listed = (await callers["admin"].get("/v1/tokens")).json()
    assert all("token" not in t and "secret_hash" not in t for t in listed)
    async with fed.client(token) as temp:
        assert (await temp.get("/v1/whoami")).json()["teams"] == {OWN: "member"}
        revoked = await callers["admin"].delete(f"/v1/tokens/{created.json()['id']}")
        assert revoked.status_code == 200
        assert (await temp.get("/v1/whoami")).status_code == 401
    short = await callers["admin"].post(
        "/v1/tokens", json={"user": "blink", "role": "viewer", "team": OWN, "ttl_s": 1e-9}
    )
    async with fed.client(short.json()["token"]) as blink:
        assert (await blink.get("/v1/whoami")).status_code == 401


async def test_mutating_actions_are_audited_with_who_what_and_result(callers: Callers) -> None:
    ok = (await callers["member"].post("/v1/workloads", json=job(OWN, "audited"))).json()["id"]
    await callers["member"].delete(f"/v1/workloads/{ok}")
    await callers["member"].post("/v1/workloads", json=job(OTHER, "sneaky"))
    await callers["viewer"].put("/v1/policy", json={})
    created = await callers["admin"].post(
        "/v1/tokens", json={"user": "new", "role": "viewer", "team": OWN}
    )
    await callers["admin"].delete(f"/v1/tokens/{created.json()['id']}")
    entries = (await callers["admin"].get("/v1/audit")).json()
    seen = {(e["actor"], e["action"], e["team"], e["result"]) for e in entries}
    assert ("mia", "submit", OWN, "ok") in seen
    assert ("mia", "cancel", OWN, "ok") in seen
    assert ("mia", "submit", OTHER, "denied") in seen
    assert ("vic", "policy.set", None, "denied") in seen
    assert ("root", "token.create", OWN, "ok") in seen
    assert ("root", "token.revoke", OWN, "ok") in seen
    submit = next(e for e in entries if e["action"] == "submit" and e["target"] == ok)
    assert submit["at"] > 0 and submit["role"] == "member"
    assert submit["via"] == f"token:{callers.token_ids['member']}"  # which token acted
    sneaky = next(e for e in entries if e["action"] == "submit" and e["team"] == OTHER)
    assert sneaky["role"] == "none"  # mia holds no role on the team she tried
    by_token = await callers["admin"].get("/v1/audit", params={"via": submit["via"]})
    assert {e["actor"] for e in by_token.json()} == {"mia"}
    # A team-admin reads its own team's entries only.
    own_only = (await callers["team-admin"].get("/v1/audit")).json()
    assert own_only and {e["team"] for e in own_only} == {OWN}


async def test_a_submission_over_nats_is_audited_with_its_workload(callers: Callers) -> None:
    bus = Bus(callers.fed.tool_settings())
    await bus.connect()
    try:
        msgs = [
            await bus.nc.request(subjects.SUBMIT, json.dumps(job(OWN, f"n{i}")).encode(), 5)
            for i in range(3)
        ]
    finally:
        await bus.close()
    ids = {SubmitReply.model_validate_json(m.data).workload_id for m in msgs}
    assert None not in ids and len(ids) == 3
    # Answered once stored: the entries are there as soon as the replies are.
    entries = (await callers["admin"].get("/v1/audit", params={"action": "submit"})).json()
    audited = {e["target"]: e for e in entries if e["actor"] == "nats"}
    assert ids <= audited.keys()
    assert all(audited[i]["team"] == OWN and audited[i]["result"] == "ok" for i in ids)
    assert all("over NATS" in audited[i]["detail"] for i in ids)


async def test_hostile_input_is_refused_cleanly(callers: Callers) -> None:
    admin = callers["admin"]
    for limit in ("1e20", "0", "-1", "99999999999999999999", "abc"):
        response = await admin.get("/v1/workloads", params={"limit": limit})
        assert response.status_code == 422, (limit, response.text)
    deep = b'{"name": "x", "team": "vision", "command": ["true"], "env": ' + b"[" * 100_000
    response = await admin.post(
        "/v1/workloads", content=deep, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and response.json()["code"] == "too_deep"
    nested_policy = {"teams": [{"name": "a", "quotas": {}}]}
    for _ in range(40):
        nested_policy = {"x": nested_policy}
    assert (await admin.put("/v1/policy", json=nested_policy)).status_code == 422
    big = b'{"name": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    response = await admin.post("/v1/workloads", content=big)
    assert response.status_code == 413 and response.json()["code"] == "body_too_large"

    async def chunks() -> Any:
        for _ in range(40):
            yield b"x" * 65536

    streamed = await admin.post("/v1/workloads", content=chunks())
    assert streamed.status_code == 413
    huge_path = await admin.get("/v1/workloads/" + "w" * 5000)
    assert huge_path.status_code == 422
    # Nothing got in, and the hub still answers.
    assert (await admin.get("/v1/workloads")).json() == []


async def test_a_team_past_max_queued_gets_429(callers: Callers) -> None:
    policy = {"teams": [{"name": OWN, "max_queued": 2}, {"name": OTHER}]}
    assert (await callers["admin"].put("/v1/policy", json=policy)).status_code == 200
    # A batch counts its own items: two of three are taken, the third would pass the cap.
    jobs = [job(OWN, f"q{i}") for i in range(3)]
    batch = (await callers["member"].post("/v1/workloads:batch", json=jobs)).json()
    assert [r["ok"] for r in batch["results"]] == [True, True, False]
    assert batch["results"][2]["error"]["code"] == "too_many_queued"
    refused = await callers["member"].post("/v1/workloads", json=job(OWN, "one-too-many"))
    assert refused.status_code == 429 and "max_queued" in refused.json()["message"]
    assert refused.json()["retryable"] is True
    # Over NATS too.
    bus = Bus(callers.fed.tool_settings())
    await bus.connect()
    try:
        msg = await bus.nc.request(subjects.SUBMIT, json.dumps(job(OWN, "nats")).encode(), 5)
    finally:
        await bus.close()
    reply = SubmitReply.model_validate_json(msg.data)
    assert not reply.ok and reply.error is not None and reply.error.code == "too_many_queued"
    entries = (await callers["admin"].get("/v1/audit", params={"action": "submit"})).json()
    seen = {(e["actor"], e["team"], e["result"]) for e in entries}
    assert ("nats", OWN, "too_many_queued") in seen and ("mia", OWN, "too_many_queued") in seen
    # Another team is not held up by it.
    other = await callers["other-member"].post("/v1/workloads", json=job(OTHER, "fine"))
    assert other.status_code == 201


async def test_openapi_carries_request_and_response_schemas(callers: Callers) -> None:
    schema = (await callers["anonymous"].get("/openapi.json")).json()
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            ok = next(r for code, r in operation["responses"].items() if code.startswith("2"))
            assert "schema" in ok["content"]["application/json"], (method, path)
            if method in ("post", "put"):
                assert "requestBody" in operation, (method, path)
    assert "WorkloadSpec" in schema["components"]["schemas"]


async def test_a_batch_is_audited_per_workload_under_its_team(callers: Callers) -> None:
    specs = [job(OWN, "b1"), job(OWN, "b2"), job(OWN, "vip", priority_class="vip")]
    reply = await callers["member"].post("/v1/workloads:batch", json=specs)
    assert reply.status_code == 200, reply.text
    rest_ids = {r["workload_id"] for r in reply.json()["results"][:2]}
    bus = Bus(callers.fed.tool_settings())
    await bus.connect()
    try:
        payload = json.dumps([job(OWN, "n1"), job(OWN, "n2")]).encode()
        msg = await bus.nc.request(subjects.SUBMIT_BATCH, payload, 5)
    finally:
        await bus.close()
    nats_ids = {r.workload_id for r in SubmitBatchReply.model_validate_json(msg.data).results}
    assert None not in rest_ids | nats_ids
    # The team's admin reads who submitted each workload of the batch, as for one submission.
    entries = (await callers["team-admin"].get("/v1/audit", params={"action": "submit"})).json()
    by_target = {e["target"]: e for e in entries}
    assert rest_ids | nats_ids <= by_target.keys()
    assert {by_target[i]["actor"] for i in rest_ids} == {"mia"}
    assert {by_target[i]["actor"] for i in nats_ids} == {"nats"}
    assert all(by_target[i]["team"] == OWN and by_target[i]["result"] == "ok" for i in rest_ids)
    refused = [e for e in entries if e["detail"].startswith("vip ")]
    assert [(e["actor"], e["result"]) for e in refused] == [("mia", "invalid_workload")]
