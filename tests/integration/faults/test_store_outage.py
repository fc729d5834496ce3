"""An end the hub heard while its store refused writes is stored once the store is back.

The events of a batch whose save fails are not acked and come back; but the hub has already
moved their records, so the events come back as stale. Before, they were then acked with
nothing saved: the store kept the workload running, and a hub that took over or restarted
from it ran the finished job again (its spoke no longer had it: lost, queued, run twice).

A request the store could not serve is told so (503 `store_unavailable`, retryable), and a
submission under its Idempotency-Key is sent again by the CLI until the store is back. Before,
each was a 500 "the hub failed", which no client sends again.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from bus.client import Bus
from gpufed import client
from gpufed.cli import main
from gpufed.client import HubClient
from hub.store import Store
from schemas import Phase, SubmitReply, subjects
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


class Outage:
    """The store refuses every write (each checkout of its pool fails) while `refusing`."""

    def __init__(self, store: Store) -> None:
        self.refusing = True
        event.listen(store.engine, "checkout", self._refuse)

    def _refuse(self, *_: Any) -> None:
        if self.refusing:
            raise sqlite3.OperationalError("disk I/O error")


async def test_an_end_heard_while_the_store_refused_writes_is_stored_and_not_run_again(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    hub = await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"))
    await fed.wait_spokes(1)
    runs = tmp_path / "runs.log"
    wid = await fed.submit(
        name="once",
        team="drill",
        command=["sh", "-c", f"echo run >> {runs}; sleep 1"],
        gpus_per_node=1,
    )
    reader = Store(hub.store.url)  # its own connections: what a standby would read

    def stored() -> Phase | None:
        record = reader.get(wid)
        return record.phase if record is not None else None

    await wait_until(lambda: stored() == Phase.RUNNING, 20, "the start stored")

    # The store refuses the hub's writes (every checkout of its pool fails) while the job ends.
    outage = Outage(hub.store)
    await wait_until(
        lambda: (w := hub.workloads.get(wid)) is not None and w.phase == Phase.SUCCEEDED,
        20,
        "the hub to hear the end",
    )
    assert stored() == Phase.RUNNING  # the end's save failed: its events were not acked
    outage.refusing = False

    # The events come back (ack wait 5 s), find the record moved, and its save goes with them.
    await wait_until(lambda: stored() == Phase.SUCCEEDED, 30, "the end stored")

    # A hub started from the store has nothing to run again.
    await fed.stop("hub")
    await fed.start_hub()
    record = await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=10)
    assert record["phase"] == Phase.SUCCEEDED.value
    assert runs.read_text().splitlines() == ["run"]
    reader.close()


async def test_work_placed_by_a_cycle_whose_save_failed_is_placed_again_once_the_store_is_back(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    """A cycle that placed queued work and could not save it publishes nothing: its records
    must go back to the queue, not stay placed in memory, waiting for a command never sent
    (the spoke never had it to lose, so no sync requeued it) and holding devices no one used."""
    hub = await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"))
    await fed.wait_spokes(1)
    runs = tmp_path / "runs.log"
    first = await fed.submit(name="first", team="drill", command=["sleep", "2"], gpus_per_node=8)
    await fed.wait_phase(first, {Phase.RUNNING})
    waiting = await fed.submit(
        name="next", team="drill", command=["sh", "-c", f"echo run >> {runs}"], gpus_per_node=8
    )
    assert hub.workloads[waiting].phase == Phase.QUEUED

    outage = Outage(hub.store)
    # `first` ends: its devices are free in memory and every cycle plans `waiting` on them,
    # then fails to save.
    await wait_until(
        lambda: hub.workloads.get(first) is None or hub.workloads[first].phase.terminal,
        20,
        "the hub to hear the first job end",
    )
    await wait_until(lambda: hub.counters["cycle_save_failed"] >= 1, 10, "a cycle's save to fail")
    assert hub.workloads[waiting].phase == Phase.QUEUED  # not left placed in memory
    outage.refusing = False

    record = await fed.wait_phase(waiting, {Phase.SUCCEEDED}, timeout=20)
    assert record["phase"] == Phase.SUCCEEDED.value
    assert runs.read_text().splitlines() == ["run"]


async def test_requests_the_store_could_not_serve_are_told_to_come_back_and_the_cli_does(
    fed: InProcessFederation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = await fed.start_hub()
    spec = {"team": "drill", "command": ["sleep", "60"]}
    bus = Bus(fed.tool_settings())
    await bus.connect()

    async def over_nats(name: str, key: str | None = None) -> SubmitReply:
        headers = {subjects.IDEMPOTENCY_KEY: key} if key is not None else None
        payload = json.dumps({**spec, "name": name}).encode()
        msg = await bus.nc.request(subjects.SUBMIT, payload, 10, headers=headers)
        return SubmitReply.model_validate_json(msg.data)

    said: list[str] = []
    async with fed.serve() as url:
        api = httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {fed.admin_token}"}
        )
        hub_client = HubClient(url, token=fed.admin_token, say=said.append)
        try:
            assert (await api.get("/v1/workloads")).status_code == 200  # the token is known
            outage = Outage(hub.store)
            refused = [
                await api.post("/v1/workloads", json={**spec, "name": "plain"}),
                await api.post("/v1/workloads:batch", json={"workloads": [{**spec, "name": "b"}]}),
                await api.get("/v1/workloads/w0123456789abcdef0123456"),
            ]
            for response in refused:
                assert response.status_code == 503, response.text
                assert response.json()["code"] == "store_unavailable"
                assert response.json()["retryable"] is True
                assert response.headers["Retry-After"] == "1"
            health = (await api.get("/v1/health")).json()  # no store call: answered
            assert (health["ok"], health["store"]) == (True, "unavailable"), health
            assert health["store_unavailable_since"] is not None
            by_nats = [await over_nats("nats"), await over_nats("nats-keyed", "n-1")]
            for reply in by_nats:
                assert reply.error is not None, reply
                assert (reply.error.code, reply.error.retryable) == ("store_unavailable", True)

            # `gpufed submit` whose store does not come back in time names its key.
            monkeypatch.setattr(client, "KEYED_RESEND_S", 0.5)
            monkeypatch.setenv("GPUFED_API", url)
            monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
            argv = ["submit", "--name", "cli", "--team", "drill", "--", "sleep", "60"]
            assert await asyncio.to_thread(main, argv) == 1
            gave_up = capsys.readouterr().err
            assert "the hub's store is not answering" in gave_up, gave_up
            assert "`--idempotency-key " in gave_up, gave_up
            monkeypatch.setattr(client, "KEYED_RESEND_S", 30.0)

            # The CLI's client sends its keyed submission again until the store is back.
            keyed = asyncio.create_task(
                asyncio.to_thread(hub_client.submit, {**spec, "name": "k"}, "k-1")
            )
            await wait_until(lambda: bool(said), 10, "the client to say it sends it again")
            assert not keyed.done()
            outage.refusing = False
            record = await keyed
            listed = await api.get("/v1/workloads", params={"team": "drill"})
            health = (await api.get("/v1/health")).json()
            assert (health["store"], health["store_unavailable_since"]) == ("ok", None)
        finally:
            hub_client.close()
            await api.aclose()
            await bus.close()
    assert said == ["the hub's store is not answering; sending it again for up to 30 s"]
    # Counted for the operators' alert (GpufedStoreUnavailable): a failure per refused call.
    failed = hub.metrics.registry.get_sample_value("gpufed_store_unavailable_total")
    assert failed is not None and failed >= len(refused) + len(by_nats)
    # What was refused was not taken: only the keyed submission, once.
    assert [w["id"] for w in listed.json()] == [record["id"]]
    assert record["spec"]["name"] == "k"
