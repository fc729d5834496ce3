"""Bad input never crashes the hub, never loops, and is answered naming the field."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bus.client import Bus
from gpufed.cli import main
from schemas import Phase, SubmitReply, subjects
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

GOOD = {"name": "ok", "team": "vision", "command": ["true"]}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"gpus_per_node": 1000}, "gpus_per_node"),
        ({"nodes": -1}, "nodes"),
        ({"name": "Not_A_DNS_Label"}, "name"),
        ({"team": ""}, "team"),
        ({"command": []}, "command"),
        ({"command": ["x" * 70_000]}, "command"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"env": {f"K{i}": "v" for i in range(200)}}, "env"),
        ({"gpu_fraction": 1.5}, "gpu_fraction"),
        ({"priority_class": "vip"}, "priority_class"),
        ({"gpus": 8}, "gpus"),  # unknown: refused, not run on one GPU
        ({"affinity": {"required_region": ["eu"]}}, "affinity.required_region"),
    ],
)
async def test_rest_refuses_bad_workloads_naming_the_field(
    fed: InProcessFederation, change: dict[str, object], field: str
) -> None:
    await fed.start_hub()
    assert fed.api is not None
    response = await fed.api.post("/v1/workloads", json={**GOOD, **change})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field
    assert body["code"] == "invalid_workload" and body["message"]
    assert body["retryable"] is False  # the request must change before it can succeed
    listed = await fed.api.get("/v1/workloads")
    assert listed.json() == []  # nothing was stored


async def test_every_problem_of_a_spec_is_named_at_once(fed: InProcessFederation) -> None:
    """A spec with three mistakes is refused naming the three, not the first of them (and a
    count of the rest): one fix and one resubmission, not three."""
    await fed.start_hub()
    assert fed.api is not None
    bad = {**GOOD, "gpus_per_node": 0, "restart_policy": "sometimes", "max_restarts": -1}
    response = await fed.api.post("/v1/workloads", json=bad)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == "gpus_per_node"  # the first, for programs
    assert body["message"] == (
        "gpus_per_node: Input should be greater than or equal to 1; "
        "restart_policy: Input should be 'never' or 'on_failure'; "
        "max_restarts: Input should be greater than or equal to 0"
    )
    batch = await fed.api.post("/v1/workloads:batch", json=[bad])
    assert batch.json()["results"][0]["error"]["message"] == body["message"]
    # A typo beside a bad value: both at once, the typo first (it was named only once the
    # value was fixed), over REST, in a batch and over NATS.
    typo = {**GOOD, "gpu": 2, "nodes": 0}
    expected = (
        "unknown field: gpu (did you mean gpus_per_node?); "
        "nodes: Input should be greater than or equal to 1"
    )
    both = (await fed.api.post("/v1/workloads", json=typo)).json()
    assert (both["field"], both["message"]) == ("gpu", expected)
    batch = await fed.api.post("/v1/workloads:batch", json=[typo])
    assert batch.json()["results"][0]["error"]["message"] == expected
    bus = Bus(fed.tool_settings())
    await bus.connect()
    try:
        answer = await bus.nc.request(subjects.SUBMIT, json.dumps(typo).encode(), 5)
    finally:
        await bus.close()
    error = SubmitReply.model_validate_json(answer.data).error
    assert error is not None and error.message == expected
    # A list's every item bad: the items named, not also the list as empty.
    only = await fed.api.post("/v1/workloads", json={**GOOD, "command": [True]})
    assert only.json()["message"] == (
        "command.0: must be text, not true (YAML reads unquoted yes, no, on, off, true and "
        "false as booleans: quote it)"
    )


async def test_an_unknown_field_is_refused_with_the_nearest_known_one(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    assert fed.api is not None
    response = await fed.api.post("/v1/workloads", json={**GOOD, "gpus": 8, "max_runtime": 60})
    assert response.status_code == 422, response.text
    assert response.json()["message"] == (
        "unknown fields: gpus (did you mean gpus_per_node?), "
        "max_runtime (did you mean max_runtime_s?)"
    )
    batch = await fed.api.post("/v1/workloads:batch", json=[GOOD, {**GOOD, "gpu": 2}])
    results = batch.json()["results"]
    assert results[0]["ok"] and not results[1]["ok"]
    assert results[1]["error"]["field"] == "gpu"


async def test_rest_refuses_fraction_of_a_gang_and_non_json(fed: InProcessFederation) -> None:
    await fed.start_hub()
    assert fed.api is not None
    response = await fed.api.post("/v1/workloads", json={**GOOD, "gpu_fraction": 0.5, "nodes": 2})
    assert response.status_code == 422
    assert "gpu_fraction" in response.json()["message"]
    response = await fed.api.post("/v1/workloads", content=b"{oops")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_json"
    response = await fed.api.get("/v1/workloads", params={"phase": "sleeping"})
    assert response.status_code == 422
    assert response.json()["field"] == "phase"


async def test_nats_submit_answers_errors_naming_the_field(fed: InProcessFederation) -> None:
    await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()
    bad = await bus.nc.request(subjects.SUBMIT, json.dumps({**GOOD, "nodes": 0}).encode(), 5)
    reply = SubmitReply.model_validate_json(bad.data)
    assert not reply.ok and reply.error is not None
    assert reply.error.field == "nodes"
    garbage = await bus.nc.request(subjects.SUBMIT, b"\xff\xfe", 5)
    assert not SubmitReply.model_validate_json(garbage.data).ok
    good = await bus.nc.request(subjects.SUBMIT, json.dumps(GOOD).encode(), 5)
    reply = SubmitReply.model_validate_json(good.data)
    assert reply.ok and reply.workload_id
    await bus.close()


async def test_malformed_messages_are_counted_acked_and_survived(fed: InProcessFederation) -> None:
    hub = await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()
    await bus.publish(subjects.capacity("eu-9"), b"not json")
    await bus.publish(subjects.capacity("eu-9"), json.dumps({"spoke_id": "eu-9"}).encode())
    await bus.publish_durable(subjects.events("eu-9"), b"\x00\x01", "bad-event-1")
    await bus.publish_durable(subjects.events("eu-9"), b'{"phase": "exploded"}', "bad-event-2")
    await wait_until(lambda: hub.counters["malformed"] == 4)

    # The hub counts a bad event, then acks it with its batch: the ack reaches the server a
    # moment after the count, and it must arrive, once, before any redelivery.
    async def acked() -> bool:
        info = await bus.js.consumer_info(subjects.EVENTS_STREAM, subjects.HUB_EVENTS_CONSUMER)
        assert info.num_redelivered == 0, "a malformed event came back instead of being acked"
        return info.num_ack_pending == 0

    await wait_until(acked, what="the hub to ack both malformed events")
    # The hub still works.
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    wid = await fed.submit(**GOOD)
    assert (await fed.wait_phase(wid, {Phase.SUCCEEDED}))["phase"] == "succeeded"
    await bus.close()


async def test_workload_that_fits_nowhere_stays_queued_with_a_reason(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"))
    await fed.wait_spokes(1)
    wrong_model = await fed.submit(**{**GOOD, "name": "b200", "gpu_model": "B200"})
    too_big = await fed.submit(**{**GOOD, "name": "huge", "gpus_per_node": 8, "nodes": 3})
    for wid, needle in ((wrong_model, "B200"), (too_big, "3")):
        await until_reason(fed, wid)
        record = await fed.workload(wid)
        assert record["phase"] == "queued"
        assert record["reason"]
        assert needle in record["message"]


async def test_a_gpu_model_typed_in_another_case_runs_on_the_fleets(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"))
    await fed.wait_spokes(1)
    # `h100` is the H100 the spoke reports; `b200`, which no spoke has, stays as typed.
    wid = await fed.submit(**{**GOOD, "name": "lower", "gpu_models": ["b200", "h100"]})
    record = await fed.wait_phase(wid, {Phase.SUCCEEDED, Phase.FAILED})
    assert (record["phase"], record["spoke_id"]) == ("succeeded", "eu-1")
    assert record["spec"]["gpu_models"] == ["b200", "H100"]


async def test_queued_work_asking_for_a_model_in_another_case_runs_once_a_spoke_has_it(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "A100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(**{**GOOD, "name": "lower", "gpu_models": ["h100"]})
    await until_reason(fed, wid)  # no H100 anywhere yet: it waits, as typed
    assert (await fed.workload(wid))["spec"]["gpu_models"] == ["h100"]

    await fed.start_spoke("eu-2", "eu", nodes("eu-2", 1, 8, "H100"))  # a spoke that has them
    record = await fed.wait_phase(wid, {Phase.SUCCEEDED, Phase.FAILED})
    assert (record["phase"], record["spoke_id"]) == ("succeeded", "eu-2")
    assert record["spec"]["gpu_models"] == ["H100"]


async def until_reason(fed: InProcessFederation, wid: str) -> None:
    async def has_reason() -> bool:
        return bool((await fed.workload(wid))["reason"])

    await wait_until(has_reason, 5, f"{wid} to say why it waits")


async def test_a_bad_request_that_is_no_workload_is_not_called_one(
    fed: InProcessFederation,
) -> None:
    # A client that branches on `code` must not read a token's bad ttl, or a bad query
    # parameter, as a bad workload spec.
    await fed.start_hub()
    assert fed.api is not None
    token = await fed.api.post("/v1/tokens", json={"user": "bob", "role": "admin", "ttl_s": -5})
    assert token.status_code == 422
    assert (token.json()["code"], token.json()["field"]) == ("invalid_request", "ttl_s")
    listed = await fed.api.get("/v1/workloads", params={"limit": "many"})
    assert listed.status_code == 422
    assert (listed.json()["code"], listed.json()["field"]) == ("invalid_request", "limit")
    phase = await fed.api.get("/v1/workloads", params={"phase": "sleeping"})
    assert (phase.json()["code"], phase.json()["field"]) == ("invalid_request", "phase")
    teamless = await fed.api.post("/v1/tokens", json={"user": "bob", "role": "member"})
    assert teamless.status_code == 422
    assert (teamless.json()["code"], teamless.json()["field"]) == ("invalid_request", "team")
    spec = await fed.api.post("/v1/workloads", json={**GOOD, "nodes": 0})
    assert (spec.json()["code"], spec.json()["field"]) == ("invalid_workload", "nodes")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"name": "Hello_1"},
            "name: must be lower-case letters, digits and '-', starting and ending with a "
            "letter or digit (not 'Hello_1')",
        ),
        (
            {"gpu_models": ["h100 sxm"]},
            "gpu_models.0: must be letters, digits, '_', '.' and '-', starting with a letter "
            "or digit (such as H100) (not 'h100 sxm')",
        ),
    ],
)
async def test_a_name_that_breaks_the_rules_is_refused_in_words_not_a_pattern(
    fed: InProcessFederation, change: dict[str, object], message: str
) -> None:
    await fed.start_hub()
    assert fed.api is not None
    response = await fed.api.post("/v1/workloads", json={**GOOD, **change})
    assert response.status_code == 422 and response.json()["message"] == message
    batch = await fed.api.post("/v1/workloads:batch", json=[{**GOOD, **change}])
    assert batch.json()["results"][0]["error"]["message"] == message


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/usage", {"since": "nan"}, "since"),
        ("/v1/usage", {"until": "inf"}, "until"),
        ("/v1/usage", {"since": "2000", "until": "1000"}, "until"),
        ("/v1/usage/series", {"since": "nan"}, "since"),
        ("/v1/usage/series", {"since": "-1e300"}, "since"),
        ("/v1/usage/series", {"step": "nan"}, "step"),
    ],
)
async def test_a_usage_window_that_means_nothing_is_refused_naming_the_field(
    fed: InProcessFederation, path: str, params: dict[str, str], field: str
) -> None:
    await fed.start_hub()
    assert fed.api is not None
    response = await fed.api.get(path, params=params)
    assert response.status_code == 422, response.text
    assert (response.json()["code"], response.json()["field"]) == ("invalid_request", field)


async def test_gpufed_usage_says_when_until_comes_before_since(
    fed: InProcessFederation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await fed.start_hub()
    async with fed.serve() as url:  # `gpufed usage` as a user types it
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["usage", "--since", "1h", "--until", "2h"])
    captured = capsys.readouterr()
    assert code == 1 and "TOTAL" not in captured.out  # no table of zeros
    assert "is before since" in captured.err


async def test_a_spec_file_with_a_yaml_boolean_is_refused_saying_to_quote_it(
    fed: InProcessFederation,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """YAML reads an unquoted `yes` (or on, off, true, no) as a boolean: the refusal says to
    quote it, and says nothing about an empty command that follows from it."""
    await fed.start_hub()
    spec = tmp_path / "train.yaml"
    spec.write_text(
        "name: train\nteam: vision\nnodes: 0\ncommand: [python, train.py, --resume, yes]\n"
    )
    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["submit", "-f", str(spec)])
    err = capsys.readouterr().err
    assert code != 0
    assert "nodes: Input should be greater than or equal to 1" in err
    assert "command.3: must be text, not true (YAML reads unquoted" in err and "quote" in err
    assert "at least 1 item" not in err
