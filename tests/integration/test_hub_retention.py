"""Ended workloads leave the hub's store once kept their time (`hub.retention`); live ones and
the queue stay, whatever their age."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufed.cli import main
from hub.core.policy import Policy
from hub.records import WorkloadRecord
from hub.retention import remove_ended
from hub.settings import HubSettings
from hub.state import HubState
from hub.store import Store
from schemas import Phase
from tests.integration.databases import workload
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

KEEP_S = 3.0
DAY = 86400.0


async def test_ended_workloads_go_after_their_keep_and_live_ones_stay(
    fed: InProcessFederation,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
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
    # Usage reaches back as far as workloads are kept: the removed run is no longer counted,
    # and the report says from when it counts.
    usage = (await api.get("/v1/usage")).json()
    assert usage["totals"]["attempts"] == 1  # `long`'s run
    assert time.time() - KEEP_S - 5 < usage["kept_since"] <= time.time() - KEEP_S
    listed = (await api.get("/v1/workloads")).json()
    assert {w["id"] for w in listed} == {long, waiting}

    async with fed.serve() as url:  # `gpufed usage` as a user types it
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["usage", "--since", "1h"]) == 0
    err = capsys.readouterr().err
    assert "runs of workloads that ended before" in err and "are not counted" in err

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


async def test_usage_on_a_hub_that_removed_nothing_warns_of_nothing_missing(
    fed: InProcessFederation,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `gpufed usage` counts from the start unless told: on a new hub it said runs that ended
    # 90 days before were not counted, "the hub no longer keeps them", when it had removed
    # nothing.
    await fed.start_hub(sweep_ended_every_s=0.1)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(name="done", team="vision", command=["true"])
    await fed.wait_phase(wid, {Phase.SUCCEEDED})
    assert fed.api is not None
    assert (await fed.api.get("/v1/usage")).json()["kept_since"] is None
    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["usage"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "vision" in out


async def test_a_sweep_removes_every_due_workload_in_batches_and_counts_them(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'hub.db'}")
    state = HubState(HubSettings(keep_ended_s=DAY), store, lambda: 100 * DAY, Policy())
    try:
        due = [_ended(f"old-{n}", finished_at=50 * DAY) for n in range(450)]
        kept = _ended("recent", finished_at=99.5 * DAY)
        live = workload("live", phase=Phase.RUNNING, spoke="s1")
        store.save([*due, kept, live])
        assert store.removed_before() is None

        assert await remove_ended(state, batch=200, pause_s=0) == 450  # 200, 200, then 50
        assert {w.id for w in store.find()} == {"recent", "live"}
        assert state.metrics.registry.get_sample_value("gpufed_workloads_removed_total") == 450
        assert store.removed_before() == 99 * DAY  # runs that ended before it may be gone
        assert await remove_ended(state, batch=200, pause_s=0) == 0
        assert store.removed_before() == 99 * DAY
    finally:
        store.close()


def _ended(workload_id: str, finished_at: float) -> WorkloadRecord:
    record = workload(workload_id, phase=Phase.SUCCEEDED, at=finished_at - 60, spoke="s1")
    record.finished_at = finished_at
    return record
