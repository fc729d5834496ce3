"""Inference services end to end: a small HTTP server as the replica, load from a bounded
generator through the hub's gateway, real spokes running the replicas as processes."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK, InvalidStatus

from gpufed.cli import main
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

TEAM = "serving"


def service(name: str, **over: Any) -> dict[str, Any]:
    replica = {
        "command": [sys.executable, "-m", "gpufed.replica"],
        "gpu_fraction": 0.25,
        "env": {"REPLICA_DELAY_S": "0.02"},
    }
    return {
        "name": name,
        "team": TEAM,
        "replica": {**replica, **over.pop("replica", {})},
        "health": {"path": "/health", "period_s": 0.2, "failure_threshold": 2, "startup_s": 30},
        **over,
    }


async def start(
    fed: InProcessFederation, price: float = 0.0, **hub_settings: Any
) -> httpx.AsyncClient:
    await fed.start_hub(**hub_settings)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "L4"), price_per_gpu_hour=price)
    await fed.wait_spokes(1)
    assert fed.api is not None
    return fed.api


async def show(api: httpx.AsyncClient, name: str) -> dict[str, Any]:
    answer = await api.get(f"/v1/services/{TEAM}/{name}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def wait_service(
    api: httpx.AsyncClient, name: str, what: str, check: Any, timeout: float = 30
) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def done() -> bool:
        seen.update(await show(api, name))
        return bool(check(seen))

    await wait_until(done, timeout, f"{name}: {what}", every=0.1)
    return seen


async def generate(
    api: httpx.AsyncClient,
    name: str,
    count: int,
    concurrency: int,
    stop: asyncio.Event,
    answers: list[httpx.Response],
) -> None:
    """Up to `count` GETs through the gateway, `concurrency` at a time (fewer once `stop`),
    each answer appended to `answers` as it comes."""
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < count and not stop.is_set():
            sent += 1
            answers.append(await api.get(f"/svc/{TEAM}/{name}/infer", timeout=60))

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def answered_by(answers: list[httpx.Response]) -> Counter[str]:
    """How many of `answers` each replica gave (the gateway names it in a header)."""
    return Counter(a.headers["x-gpufed-replica"] for a in answers if a.status_code == 200)


async def test_a_service_scales_up_under_load_and_down_after_it_with_its_cost(
    fed: InProcessFederation,
) -> None:
    api = await start(fed, price=3.6)
    spec = service(
        "llm",
        min_replicas=1,
        max_replicas=3,
        autoscaling={"target": 2, "window_s": 2, "scale_down_delay_s": 2},
    )
    created = await api.post("/v1/services", json=spec)
    assert created.status_code == 201, created.text
    await wait_service(api, "llm", "one replica ready", lambda s: s["ready"] == 1)

    stop = asyncio.Event()
    peak: list[int] = []
    answers: list[httpx.Response] = []

    async def watch() -> None:
        status = await wait_service(api, "llm", "3 ready", lambda s: s["ready"] == 3, 120)
        peak.append(status["ready"])
        # The load goes on until round robin has reached all three: stopping as soon as the
        # last one is ready left a starved generator no request to send them (seen at load 12).
        await wait_until(lambda: len(answered_by(answers)) >= 3, 120, "all three answering")
        stop.set()

    watcher = asyncio.create_task(watch())
    await generate(api, "llm", count=5000, concurrency=4, stop=stop, answers=answers)
    await watcher
    assert peak == [3]
    assert {a.status_code for a in answers} == {200}

    status = await show(api, "llm")
    assert status["requests"] == len(answers)
    answered = answered_by(answers)
    assert len(answered) >= 3  # round robin over the replicas that became ready
    for replica in status["replicas"]:  # each counted what it answered
        assert replica["requests"] == answered[replica["workload_id"]]
    assert status["cost_per_1k_requests"] > 0
    expected = status["cost_dollars"] / status["requests"] * 1000
    assert abs(status["cost_per_1k_requests"] - expected) < 1e-3

    down = await wait_service(
        api, "llm", "back to one replica", lambda s: len(s["replicas"]) == 1, 60
    )
    assert down["desired"] == 1
    assert any(h["event"] == "scaled" and "-> 3" in h["detail"] for h in down["history"])


async def test_a_service_at_zero_replicas_wakes_for_a_request(
    fed: InProcessFederation,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = await start(fed)
    spec = service(
        "sleepy",
        min_replicas=0,
        max_replicas=2,
        autoscaling={"scale_to_zero_after_s": 1, "scale_down_delay_s": 0},
    )
    assert (await api.post("/v1/services", json=spec)).status_code == 201
    # Its first replica starts, and a second after the service's creation, with no request,
    # it goes again. (Waiting for that replica to be ready first raced it: on a loaded machine
    # the replica's process took over a second to answer, and was stopped before it did.)
    idle = await wait_service(
        api,
        "sleepy",
        "scaled to zero",
        lambda s: not s["replicas"] and any(h["detail"] == "1 -> 0 (idle)" for h in s["history"]),
        60,
    )
    scaled = [h["detail"] for h in idle["history"] if " -> " in h["detail"]]
    assert scaled[0].startswith("0 -> 1") and scaled[1] == "1 -> 0 (idle)"

    answer = await api.get(f"/svc/{TEAM}/sleepy/hello", timeout=60)
    assert answer.status_code == 200
    assert answer.text.startswith("v1 ")
    # Not the hub's origin in a browser: the console's token is out of its page's reach.
    assert answer.headers["content-security-policy"].startswith("sandbox allow-scripts")
    status = await show(api, "sleepy")
    assert status["requests"] == 1
    woke = [h["detail"] for h in status["history"] if h["detail"].startswith("0 -> 1")]
    assert woke  # the request waiting at zero started a replica
    async with fed.serve() as url:  # and `gpufed service show` counts it in words
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["service", "show", f"{TEAM}/sleepy"]) == 0
        assert "  cost:      1 request, " in capsys.readouterr().out


async def test_a_request_to_a_service_whose_replicas_keep_failing_is_told_why(
    fed: InProcessFederation,
) -> None:
    """A caller waiting for a replica of a service whose replicas die at start gets 503 with
    the replica's failure once two have failed while it waited, not after the whole wake
    timeout (five minutes here) with no reason."""
    api = await start(fed)
    crash = "import sys; sys.exit(3)"
    spec = service(
        "broken",
        min_replicas=0,
        max_replicas=1,
        replica={"command": [sys.executable, "-c", crash]},
        autoscaling={"wake_timeout_s": 300},
    )
    assert (await api.post("/v1/services", json=spec)).status_code == 201
    answer = await api.get(f"/svc/{TEAM}/broken/hello", timeout=120)
    assert answer.status_code == 503
    body = answer.json()
    assert body["code"] == "unavailable"
    assert body["message"].startswith(
        f"service {TEAM}/broken has no ready replica: its replicas keep failing "
    ), body
    assert body["message"].endswith(": exit code 3); see `gpufed service show`"), body
    assert "/logs/" not in body["message"]  # not the log's path on the spoke's host
    # A public service's callers are anyone: they learn that it fails, not how.
    public = {**spec, "name": "open", "public": True}
    assert (await api.post("/v1/services", json=public)).status_code == 201
    anyone = await fed.client(None).get(f"/svc/{TEAM}/open/hello", timeout=120)
    assert anyone.status_code == 503
    assert anyone.json()["message"] == (
        f"service {TEAM}/open has no ready replica: its replicas keep failing; "
        "see `gpufed service show`"
    )


async def test_a_streamed_answer_reaches_the_caller_as_it_comes(
    fed: InProcessFederation,
) -> None:
    api = await start(fed)
    assert (await api.post("/v1/services", json=service("tokens", replicas=1))).status_code == 201
    await wait_service(api, "tokens", "ready", lambda s: s["ready"] == 1)
    token = {"Authorization": f"Bearer {fed.admin_token}"}
    async with fed.serve() as url, httpx.AsyncClient(base_url=url, headers=token) as caller:
        async with caller.stream("GET", f"/svc/{TEAM}/tokens/stream", timeout=30) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-type"] == "text/event-stream"
            chunks = answer.aiter_raw()
            # The replica holds the rest back until /release: an answer buffered whole on the
            # way would bring nothing here.
            assert await asyncio.wait_for(anext(chunks), 10) == b"data: token 1\n\n"
            assert (await show(api, "tokens"))["in_flight"] == 1
            assert (await caller.get(f"/svc/{TEAM}/tokens/release")).status_code == 200
            rest = b"".join([chunk async for chunk in chunks])
        assert rest == b"data: token 2\n\ndata: [DONE]\n\n"
        status = await show(api, "tokens")
        assert (status["in_flight"], status["requests"]) == (0, 2)

        # A caller who goes away mid-answer frees the replica's slot, and is not counted served.
        async with caller.stream("GET", f"/svc/{TEAM}/tokens/stream", timeout=30) as answer:
            assert await asyncio.wait_for(anext(answer.aiter_raw()), 10) == b"data: token 1\n\n"
        assert (await caller.get(f"/svc/{TEAM}/tokens/release")).status_code == 200
    await wait_service(api, "tokens", "the slot freed", lambda s: s["in_flight"] == 0)
    assert (await show(api, "tokens"))["requests"] == 3


async def test_a_stopping_hub_cuts_a_stream_after_its_drain_time(
    fed: InProcessFederation,
) -> None:
    api = await start(fed, drain_s=1)
    assert (await api.post("/v1/services", json=service("tokens", replicas=1))).status_code == 201
    await wait_service(api, "tokens", "ready", lambda s: s["ready"] == 1)
    token = {"Authorization": f"Bearer {fed.admin_token}"}
    async with (
        fed.serve() as url,
        httpx.AsyncClient(base_url=url, headers=token) as caller,
        caller.stream("GET", f"/svc/{TEAM}/tokens/stream", timeout=60) as answer,
    ):
        chunks = answer.aiter_raw()
        assert await asyncio.wait_for(anext(chunks), 10) == b"data: token 1\n\n"
        # The replica would hold the rest 30 s (until /release): the hub, told to stop, waits
        # its 1 s of drain for it, then cuts the stream instead of waiting it out.
        assert fed.http_server is not None
        fed.http_server.should_exit = True
        with pytest.raises(httpx.RemoteProtocolError):
            await asyncio.wait_for(anext(chunks), 10)
    status = await wait_service(api, "tokens", "the slot freed", lambda s: s["in_flight"] == 0)
    assert status["requests"] == 0  # cut, not served


async def test_an_upload_reaches_the_replica_as_it_comes(fed: InProcessFederation) -> None:
    api = await start(fed)
    assert (await api.post("/v1/services", json=service("uploads", replicas=1))).status_code == 201
    await wait_service(api, "uploads", "ready", lambda s: s["ready"] == 1)
    token = {"Authorization": f"Bearer {fed.admin_token}"}
    half = 1024 * 1024
    async with fed.serve() as url, httpx.AsyncClient(base_url=url, headers=token) as caller:

        async def first_half_arrived() -> bool:
            return int((await caller.get(f"/svc/{TEAM}/uploads/received")).text) >= half

        async def body(then: bytes | None) -> AsyncIterator[bytes]:
            yield b"x" * half
            # The rest only once the replica holds the first half: a gateway that gathered
            # the whole body before forwarding any would never let it arrive.
            await wait_until(first_half_arrived, 20, "the first half at the replica", 0.05)
            if then is None:
                raise ConnectionAbortedError("the caller gives up mid-upload")
            yield then

        # Over the API's 1 MB bound for its own bodies, and of the caller's type, not JSON.
        length = {"content-length": str(2 * half), "content-type": "audio/wav"}
        upload = caller.post(f"/svc/{TEAM}/uploads/up", content=body(b"y" * half), headers=length)
        answer = await asyncio.wait_for(upload, 30)
        assert (answer.status_code, answer.text) == (200, f"{2 * half} audio/wav")
        # Without a length (chunked), the same.
        answer = await asyncio.wait_for(
            caller.post(f"/svc/{TEAM}/uploads/up", content=body(b"z")), 30
        )
        assert (answer.status_code, answer.text) == (200, str(half + 1))

        # A caller who goes away mid-upload frees the replica's slot.
        broken = caller.post(f"/svc/{TEAM}/uploads/up", content=body(None), headers=length)
        with pytest.raises(ConnectionAbortedError):
            await asyncio.wait_for(broken, 30)
    await wait_service(api, "uploads", "the slot freed", lambda s: s["in_flight"] == 0)


async def test_a_websocket_reaches_a_replica_and_holds_its_slot(fed: InProcessFederation) -> None:
    api = await start(fed)
    assert (await api.post("/v1/services", json=service("live", replicas=1))).status_code == 201
    await wait_service(api, "live", "ready", lambda s: s["ready"] == 1)
    token = {"Authorization": f"Bearer {fed.admin_token}"}
    async with fed.serve() as url:
        ws_url = "ws" + url.removeprefix("http") + f"/svc/{TEAM}/live/ws"
        with pytest.raises(InvalidStatus) as refused:  # no token, no session
            async with connect(ws_url):
                pass
        assert refused.value.response.status_code == 403

        async with connect(ws_url, additional_headers=token, subprotocols=["chat.v1"]) as ws:
            assert ws.subprotocol == "chat.v1"  # the replica's choice, relayed
            await ws.send("hello")
            assert await asyncio.wait_for(ws.recv(), 10) == "echo hello"
            await ws.send(b"\x00\x01")
            assert await asyncio.wait_for(ws.recv(), 10) == b"\x00\x01"
            assert (await show(api, "live"))["in_flight"] == 1  # a session holds the slot
        status = await wait_service(api, "live", "the slot freed", lambda s: s["in_flight"] == 0)
        assert status["requests"] == 1

        # The replica closing as agreed ends the caller's session as agreed: served.
        async with connect(ws_url, additional_headers=token) as ws:
            await ws.send("bye")
            with pytest.raises(ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 10)
        # A replica that drops the connection: an abnormal close for the caller, not served.
        async with connect(ws_url, additional_headers=token) as ws:
            await ws.send("break")
            with pytest.raises(ConnectionClosedError) as broke:
                await asyncio.wait_for(ws.recv(), 10)
            assert broke.value.rcvd is not None and broke.value.rcvd.code == 1011
    status = await wait_service(api, "live", "both closed", lambda s: s["in_flight"] == 0)
    assert status["requests"] == 2


async def test_an_unhealthy_or_crashed_replica_is_replaced(fed: InProcessFederation) -> None:
    api = await start(fed)
    assert (await api.post("/v1/services", json=service("fragile", replicas=1))).status_code == 201
    first = await wait_service(api, "fragile", "ready", lambda s: s["ready"] == 1)
    sick_id = first["replicas"][0]["workload_id"]

    assert (await api.get(f"/svc/{TEAM}/fragile/sick")).status_code == 200
    second = await wait_service(
        api,
        "fragile",
        "a new replica ready",
        lambda s: s["ready"] == 1 and s["replicas"][0]["workload_id"] != sick_id,
    )
    assert (await fed.workload(sick_id))["phase"] == "cancelled"
    assert any(h["detail"] == f"{sick_id} unhealthy, replaced" for h in second["history"])

    crash_id = second["replicas"][0]["workload_id"]
    assert (await api.get(f"/svc/{TEAM}/fragile/exit")).status_code == 200
    await wait_service(
        api,
        "fragile",
        "the crashed replica replaced",
        lambda s: s["ready"] == 1 and s["replicas"][0]["workload_id"] != crash_id,
    )
    assert (await fed.workload(crash_id))["phase"] == "failed"
    answer = await api.get(f"/svc/{TEAM}/fragile/again")
    assert answer.status_code == 200


async def test_a_rolling_update_never_drops_below_the_ready_replicas(
    fed: InProcessFederation,
) -> None:
    api = await start(fed)
    spec = service("roll", replicas=2)
    assert (await api.post("/v1/services", json=spec)).status_code == 201
    await wait_service(api, "roll", "two ready", lambda s: s["ready"] == 2)

    spec["replica"]["env"] = {"REPLICA_VERSION": "v2"}
    updated = await api.put(f"/v1/services/{TEAM}/roll", json=spec)
    assert updated.status_code == 200, updated.text
    assert updated.json()["generation"] == 2

    ready_seen: list[int] = []
    answers: list[str] = []

    async def rolled() -> bool:
        status = await show(api, "roll")
        ready_seen.append(status["ready"])
        answer = await api.get(f"/svc/{TEAM}/roll/x", timeout=30)
        assert answer.status_code == 200
        answers.append(answer.text.split()[0])
        gens = [r["generation"] for r in status["replicas"]]
        return gens == [2, 2] and status["ready"] == 2

    await wait_until(rolled, 60, "the rollout to finish", every=0.1)
    assert min(ready_seen) >= 2
    assert answers[-1] == "v2"


async def test_services_are_team_scoped_and_audited(fed: InProcessFederation) -> None:
    api = await start(fed)
    other = fed.client(await fed.token("eve", "member", "vision"))
    refused = await other.post("/v1/services", json=service("llm"))
    assert refused.status_code == 403
    secret = {"env": {"HF_TOKEN": {"value": "hf_s3cr3t", "secret": True}}}
    made = await api.post("/v1/services", json=service("llm", replica=secret))
    assert made.status_code == 201
    assert made.json()["spec"]["replica"]["env"] == {"HF_TOKEN": "***"}
    assert "hf_s3cr3t" not in (await api.get("/v1/services")).text
    assert (await api.post("/v1/services", json=service("llm"))).status_code == 409
    assert (await other.get(f"/v1/services/{TEAM}/llm")).status_code == 403
    assert (await other.get(f"/svc/{TEAM}/llm/x")).status_code == 403
    assert (await fed.client(None).get(f"/svc/{TEAM}/llm/x")).status_code == 401
    assert [s["name"] for s in (await other.get("/v1/services")).json()] == []
    renamed = await api.put(f"/v1/services/{TEAM}/llm", json=service("other"))
    assert renamed.status_code == 422
    assert renamed.json()["field"] == "name"
    assert (await api.delete(f"/v1/services/{TEAM}/llm")).status_code == 202
    assert (await api.get(f"/v1/services/{TEAM}/llm")).status_code == 404
    audit = (await api.get("/v1/audit", params={"team": TEAM})).json()
    actions = {(a["action"], a["result"]) for a in audit}
    assert {("service.create", "ok"), ("service.delete", "ok"), ("service.create", "denied")} <= {
        (a, r) for a, r in actions
    }
    await other.aclose()


async def test_a_typo_in_a_service_spec_is_refused_not_ignored(fed: InProcessFederation) -> None:
    await fed.start_hub()
    assert fed.api is not None
    api = fed.api
    # Ignored, these asked for one replica on one GPU when four on eight were meant.
    typo = service("llm", max_replica=4, replica={"gpu": 8})
    refused = await api.post("/v1/services", json=typo)
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"] == (
        "unknown fields: max_replica (did you mean max_replicas?), "
        "replica.gpu (did you mean replica.gpus?)"
    )
    assert refused.json()["field"] == "max_replica"
    assert (await api.get("/v1/services")).json() == []  # nothing was created

    assert (await api.post("/v1/services", json=service("llm"))).status_code == 201
    bad_update = service("llm", autoscaling={"taget": 5})
    updated = await api.put(f"/v1/services/{TEAM}/llm", json=bad_update)
    assert updated.status_code == 422, updated.text
    assert updated.json()["field"] == "autoscaling.taget"
    assert "did you mean autoscaling.target?" in updated.json()["message"]
    assert (await show(api, "llm"))["generation"] == 1  # the service kept its spec

    # Beside a value that is no value, the typo is named with it, not once the value is fixed.
    both = service("llm", min_replicas=-1, maxreplicas=3)
    refused = await api.post("/v1/services", json=both)
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"] == (
        "unknown field: maxreplicas (did you mean max_replicas?); "
        "min_replicas: Input should be greater than or equal to 0"
    )
    assert refused.json()["field"] == "maxreplicas"
    updated = await api.put(
        f"/v1/services/{TEAM}/llm", json=service("llm", health={"pth": "/ok", "period_s": 0})
    )
    assert updated.status_code == 422, updated.text
    assert updated.json()["message"] == (
        "unknown field: health.pth (did you mean health.path?); "
        "health.period_s: Input should be greater than or equal to 0.05"
    )


async def test_a_refused_service_names_the_flag_the_user_typed(
    fed: InProcessFederation,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpufed service create` without `-- command`, or with --min 0 --max 0, is refused in
    the words of its flags, not only the spec's field names the user never typed."""
    await fed.start_hub()
    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        create = ["service", "create", "--name", "llm", "--team", TEAM]
        assert await asyncio.to_thread(main, create) == 1
        err = capsys.readouterr().err
        assert "replica: Field required (the replica's command: the program and its " in err, err
        assert await asyncio.to_thread(main, [*create, "--max", "0", "--", "true"]) == 1
        err = capsys.readouterr().err
        assert "max_replicas: " in err and "(--max) [invalid_workload]" in err, err
