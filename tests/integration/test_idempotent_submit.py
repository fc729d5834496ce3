"""A submission sent again under its Idempotency-Key is taken once: a client that got no answer
sends it again without running the work twice.

A real hub on a real nats-server, its REST API in-process (and over real HTTP for the CLI's
client); no spoke joins, so what is taken stays queued until cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.client import Bus
from bus.ports import free_port
from gpufed import client
from gpufed.cli import main
from gpufed.client import HubClient
from schemas import Phase, SubmitReply, subjects
from tests.integration.fed import InProcessFederation, nodes

SPEC = {"name": "train", "team": "vision", "command": ["sleep", "60"]}


async def _named(fed: InProcessFederation, name: str) -> list[dict[str, Any]]:
    assert fed.api is not None
    response = await fed.api.get("/v1/workloads", params={"team": "vision"})
    assert response.status_code == 200, response.text
    return [w for w in response.json() if w["spec"]["name"] == name]


async def _post(client: httpx.AsyncClient, key: str, **spec: Any) -> httpx.Response:
    return await client.post(
        "/v1/workloads", json={**SPEC, **spec}, headers={"Idempotency-Key": key}
    )


async def test_sent_again_under_its_key_it_is_the_same_workload(fed: InProcessFederation) -> None:
    await fed.start_hub()
    member = fed.client(await fed.token("mia", "member", "vision"))
    try:
        first = await _post(member, "k-1")
        again = await _post(member, "k-1")
        assert first.status_code == 201, first.text
        assert "Idempotent-Replayed" not in first.headers
        assert again.status_code == 200, again.text
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["id"] == first.json()["id"]
        assert len(await _named(fed, "train")) == 1
        # Another key, or the same key from another member of the team, is another submission.
        other_key = await _post(member, "k-2")
        colleague = fed.client(await fed.token("max", "member", "vision"))
        try:
            same_key_other_user = await _post(colleague, "k-1")
        finally:
            await colleague.aclose()
        ids = {first.json()["id"], other_key.json()["id"], same_key_other_user.json()["id"]}
        assert (other_key.status_code, same_key_other_user.status_code) == (201, 201)
        assert len(ids) == 3
        assert len(await _named(fed, "train")) == 3
    finally:
        await member.aclose()


async def test_the_same_key_with_another_spec_is_refused(fed: InProcessFederation) -> None:
    await fed.start_hub()
    assert fed.api is not None
    first = await _post(fed.api, "k-1")
    changed = await _post(fed.api, "k-1", command=["sleep", "61"])
    assert changed.status_code == 422, changed.text
    body = changed.json()
    assert body["code"] == "idempotency_key_reused"
    assert first.json()["id"] in body["message"]
    assert body["field"] == "Idempotency-Key"
    # The fleet's spelling of a model is the same spec: `h100` is taken as the first `H100`.
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.wait_spokes(1)
    model = await _post(fed.api, "k-2", gpu_models=["H100"])
    lower = await _post(fed.api, "k-2", gpu_models=["h100"])
    assert (model.status_code, lower.status_code) == (201, 200), lower.text
    for bad in ("has space", "x" * 129, ""):
        refused = await _post(fed.api, bad)
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "invalid_request"
    assert len(await _named(fed, "train")) == 2


async def test_sent_many_times_at_once_it_is_taken_once(fed: InProcessFederation) -> None:
    await fed.start_hub()
    assert fed.api is not None
    api = fed.api
    answers = await asyncio.gather(*(_post(api, "burst") for _ in range(8)))
    assert sorted(a.status_code for a in answers) == [200] * 7 + [201]
    assert len({a.json()["id"] for a in answers}) == 1
    assert len(await _named(fed, "train")) == 1


async def test_the_key_holds_across_a_restart_and_after_the_workload_ended(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    assert fed.api is not None
    secret = {"env": {"TOKEN": {"value": "s3cret", "secret": True}}}  # the same spec, unmasked
    wid = (await _post(fed.api, "k-1", **secret)).json()["id"]
    await fed.stop("hub")
    await fed.api.aclose()
    await fed.start_hub()  # the same store: what the first hub took is found there
    assert fed.api is not None
    after_restart = await _post(fed.api, "k-1", **secret)
    assert (after_restart.status_code, after_restart.json()["id"]) == (200, wid)
    cancelled = await fed.api.delete(f"/v1/workloads/{wid}")
    assert cancelled.status_code == 202, cancelled.text
    await fed.wait_phase(wid, {Phase.CANCELLED})
    after_end = await _post(fed.api, "k-1", **secret)
    assert after_end.status_code == 200, after_end.text
    assert (after_end.json()["id"], after_end.json()["phase"]) == (wid, "cancelled")


async def test_over_nats_a_submission_under_its_key_is_taken_once(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()

    async def send(key: str | None, **spec: Any) -> SubmitReply:
        headers = {subjects.IDEMPOTENCY_KEY: key} if key is not None else None
        payload = json.dumps({**SPEC, **spec}).encode()
        msg = await bus.nc.request(subjects.SUBMIT, payload, 10, headers=headers)
        return SubmitReply.model_validate_json(msg.data)

    try:
        at_once = await asyncio.gather(*(send("n-1") for _ in range(4)))
        again = await send("n-1")
        other_spec = await send("n-1", command=["sleep", "61"])
        unkeyed = await send(None)
    finally:
        await bus.close()
    assert all(r.ok for r in [*at_once, again, unkeyed])
    assert len({r.workload_id for r in [*at_once, again]}) == 1
    assert other_spec.error is not None and other_spec.error.code == "idempotency_key_reused"
    taken = await _named(fed, "train")
    assert sorted(w["id"] for w in taken) == sorted({again.workload_id, unkeyed.workload_id})
    # The one taken is audited once, as every submission over NATS is.
    assert fed.api is not None
    entries = (await fed.api.get("/v1/audit", params={"action": "submit"})).json()
    assert [e["result"] for e in entries if e["target"] == again.workload_id] == ["ok"]


class _LosesFirstAnswer:
    """A loopback TCP proxy in front of the hub's API that relays every request, and drops the
    first connection that brings an answer back before that answer reaches the client: the
    hub did the work, the client never heard."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.lost = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> _LosesFirstAnswer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for handler in self._handlers:  # each ends once cancelled: none outlives the proxy
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def requests() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        forward = asyncio.create_task(requests())
        try:
            while data := await up_reader.read(65536):
                if self.lost == 0:  # the hub answered: the client never hears it
                    self.lost += 1
                    writer.transport.abort()
                    return
                writer.write(data)
                await writer.drain()
        finally:
            forward.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await forward
            up_writer.close()
            writer.close()


async def test_the_cli_client_sends_again_an_answer_it_lost_and_the_work_is_taken_once(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    async with fed.serve() as url, _LosesFirstAnswer(int(url.rsplit(":", 1)[1])) as lossy:
        client = HubClient(f"http://127.0.0.1:{lossy.port}", token=fed.admin_token)
        try:
            record = await asyncio.to_thread(client.submit, dict(SPEC), "cli-key-1")
        finally:
            client.close()
    assert lossy.lost == 1
    taken = await _named(fed, "train")
    assert [w["id"] for w in taken] == [record["id"]]


async def test_the_cli_waits_for_a_hub_that_comes_back_and_names_its_key_when_none_does(
    fed: InProcessFederation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await fed.start_hub()
    port = free_port()
    monkeypatch.setenv("GPUFED_API", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
    argv = ["submit", "--name", "train", "--team", "vision", "--", "sleep", "60"]
    # No hub answers for a second (a hub `gpufed up` starts again): the CLI waits for it.
    submitting = asyncio.create_task(asyncio.to_thread(main, argv))
    await asyncio.sleep(1.0)
    assert not submitting.done()
    async with fed.serve(port):
        assert await submitting == 0
    [taken] = await _named(fed, "train")
    said = capsys.readouterr()
    assert said.out == f"{taken['id']}\n"
    assert "sending it again for up to 30 s" in said.err  # it says why it waits
    # None comes back: the error names the key that takes it at most once when sent again.
    monkeypatch.setattr(client, "KEYED_RESEND_S", 0.5)
    assert await asyncio.to_thread(main, [*argv[:3], "--team", "vision", "--", "true"]) == 1
    gave_up = capsys.readouterr().err
    key = gave_up.split("`--idempotency-key ", 1)[1].split("`", 1)[0]
    assert "cannot reach the hub" in gave_up and "It may have been taken" in gave_up, gave_up
    monkeypatch.setattr(client, "KEYED_RESEND_S", 30.0)
    again = [*argv[:3], "--team", "vision", "--idempotency-key", key, "--", "true"]
    async with fed.serve(port):
        assert await asyncio.to_thread(main, again) == 0
        first = capsys.readouterr().out
        assert await asyncio.to_thread(main, again) == 0
        assert capsys.readouterr().out == first
    assert len(await _named(fed, "train")) == 2


async def test_ctrl_c_while_the_cli_waits_for_a_hub_names_the_key(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFED_API": f"http://127.0.0.1:{free_port()}", "GPUFED_TOKEN": "t"}
    # `gpufed submit ...` taking Ctrl-C's SIGINT as from a terminal (a test run started in the
    # background may have inherited it ignored, and Python then takes none).
    cli = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        " sys.argv = ['gpufed', *sys.argv[1:]]; runpy.run_module('gpufed', run_name='__main__')"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-c", cli, "submit", "--name", "x", "--team", "vision", "--", "true"),
        env=env,
        cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    first = await asyncio.wait_for(proc.stderr.readline(), 20)
    assert b"sending it again for up to 30 s" in first, first
    proc.send_signal(signal.SIGINT)
    rest = await asyncio.wait_for(proc.stderr.read(), 20)
    assert await proc.wait() == 130
    assert b"gpufed: stopped. It may have been taken" in rest and b"Traceback" not in rest, rest
    assert b"--idempotency-key " in rest
