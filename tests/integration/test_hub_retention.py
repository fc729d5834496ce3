"""Ended workloads leave the hub's store once kept their time (`hub.retention`); live ones and
the queue stay, whatever their age."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

KEEP_S = 3.0


async def test_ended_workloads_go_after_their_keep_and_live_ones_stay(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub(keep_ended_s=KEEP_S, sweep_ended_every_s=0.1)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    api = fed.api
    assert api is not None
    done = await fed.submit(name="done", team="vision", command=["true"])
    long = await fed.submit(name="long", team="vision", command=["sleep", "60"])
    await fed.wait_phase(long, {Phase.RUNNING})
    # Both GPUs: waits while `long` holds one.
    waiting = await fed.submit(name="waits", team="vision", gpus_per_node=2, command=["true"])
    ended = await fed.wait_phase(done, {Phase.SUCCEEDED, Phase.FAILED})
    assert ended["phase"] == "succeeded"

    async def gone(workload_id: str) -> bool:
        return (await api.get(f"/v1/workloads/{workload_id}")).status_code == 404

    await wait_until(lambda: gone(done), KEEP_S + 10, "the ended workload to leave the store")
    answer = (await api.get(f"/v1/workloads/{done}")).json()
    assert answer["message"] == f"no workload {done} (an ended workload is kept 3 s)"
    assert (await fed.workload(long))["phase"] == "running"
    assert (await fed.workload(waiting))["phase"] == "queued"
    listed = (await api.get("/v1/workloads")).json()
    assert {w["id"] for w in listed} == {long, waiting}

    # A workload cancelled in the queue has ended too: it goes once kept its time.
    assert (await api.delete(f"/v1/workloads/{waiting}")).status_code == 202
    assert (await fed.workload(waiting))["phase"] == "cancelled"
    await wait_until(lambda: gone(waiting), KEEP_S + 10, "the cancelled workload to leave")
    assert (await fed.workload(long))["phase"] == "running"
    exposition = (await api.get("/metrics")).text
    removed = [
        s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == "gpufed_workloads_removed_total"
    ]
    assert removed == [2.0]
