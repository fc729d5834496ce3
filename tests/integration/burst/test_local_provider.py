"""LocalProvider against real processes: idempotent launch, restart, pid checks, terminate."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from burst.errors import PermanentBurstError
from burst.ports import LaunchRequest
from burst.providers.local import STATE_FILE, LocalProvider
from bus import lifeline
from bus.natsserver import EmbeddedNats
from schemas.burst import InstanceState, Market
from tests.integration.burst.hub_role import REGION, process_gone, sim_catalog
from tests.support.wait import wait_until

CATALOG = sim_catalog(("sim.a100x4", "A100", 4, 8.0))


def request(burst_id: str, instance_type: str = "sim.a100x4") -> LaunchRequest:
    return LaunchRequest(
        burst_id=burst_id,
        instance_type=instance_type,
        region=REGION,
        market=Market.SPOT,
        team="ml",
        price_per_hour=8.0,
        gpu_model="A100",
        gpu_count=4,
        spoke_creds=None,
    )


@pytest.fixture
async def provider(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[LocalProvider]:
    made = LocalProvider(tmp_path / "burst", nats_server.url, CATALOG, stop_grace_s=5.0)
    try:
        yield made
    finally:
        state = tmp_path / "burst" / STATE_FILE
        if state.exists():
            await made.terminate(list(json.loads(state.read_text())["instances"]))
        made.close()


def pid(info_id: str) -> int:
    return int(info_id.removeprefix("pid-"))


async def test_launch_is_idempotent_and_survives_a_provider_restart(
    provider: LocalProvider, tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    first = await provider.launch(request("b-1"))
    again = await provider.launch(request("b-1"))
    assert first.state is InstanceState.RUNNING
    assert again.provider_instance_id == first.provider_instance_id  # nothing new started
    inventory = (tmp_path / "burst" / "inventories" / "b-1.yaml").read_text()
    assert "A100" in inventory and "gpu_count: 4" in inventory

    restarted = LocalProvider(tmp_path / "burst", nats_server.url, CATALOG, stop_grace_s=5.0)
    [found] = await restarted.describe(["b-1", "unknown"])
    assert (found.burst_id, found.state) == ("b-1", InstanceState.RUNNING)
    assert (await restarted.launch(request("b-1"))).provider_instance_id == (
        first.provider_instance_id
    )

    assert await restarted.terminate(["unknown"]) == []
    stopped = await restarted.terminate(["b-1"])
    assert [i.burst_id for i in stopped] == ["b-1"]
    assert process_gone(pid(first.provider_instance_id), "b-1")
    [gone] = await provider.describe(["b-1"])
    assert gone.state is InstanceState.TERMINATED
    # A terminated id stays used: launching it again starts nothing.
    assert (await provider.launch(request("b-1"))).state is InstanceState.TERMINATED
    assert await provider.terminate(["b-1"]) == []


async def test_a_reused_pid_is_not_taken_for_the_instance(
    provider: LocalProvider, tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    await provider.launch(request("b-2"))
    # A provider without the child's handle (a new process) goes by /proc alone.
    restarted = LocalProvider(tmp_path / "burst", nats_server.url, CATALOG, stop_grace_s=5.0)
    stranger = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(30)"
    )
    try:
        state = tmp_path / "burst" / STATE_FILE
        data = json.loads(state.read_text())
        real_pid = data["instances"]["b-2"]["pid"]
        data["instances"]["b-2"]["pid"] = stranger.pid  # as if the pid had been reused
        state.write_text(json.dumps(data))
        [info] = await restarted.describe(["b-2"])
        assert info.state is InstanceState.TERMINATED
        assert await restarted.terminate(["b-2"]) == []
        assert stranger.returncode is None  # never signalled
        data["instances"]["b-2"]["pid"] = real_pid
        state.write_text(json.dumps(data))
    finally:
        stranger.kill()
        await stranger.wait()


async def test_unknown_instance_type_is_a_permanent_error(provider: LocalProvider) -> None:
    with pytest.raises(PermanentBurstError, match="not in the catalog"):
        await provider.launch(request("b-3", instance_type="p5.48xlarge"))
    assert await provider.describe(["b-3"]) == []


async def test_sweep_stops_only_unknown_processes_past_the_grace(
    provider: LocalProvider,
) -> None:
    kept = await provider.launch(request("b-known"))
    orphan = await provider.launch(request("b-orphan"))
    assert orphan.launched_at is not None
    young = await provider.sweep_orphans(["b-known"], orphan.launched_at + 1, grace_s=60)
    assert young == []
    swept = await provider.sweep_orphans(["b-known"], orphan.launched_at + 61, grace_s=60)
    assert [i.burst_id for i in swept] == ["b-orphan"]
    assert process_gone(pid(orphan.provider_instance_id), "b-orphan")
    assert not process_gone(pid(kept.provider_instance_id), "b-known")


async def test_a_cloud_spoke_ends_with_the_lifeline_of_gpufed_up(
    provider: LocalProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller handed `gpufed up`'s lifeline hands it to each cloud spoke: once `gpufed up`
    is gone (killed outright: the write end closes with it), the spoke stops, though it
    outlives the controller itself. One started without it runs on."""
    read_end, write_end = os.pipe()
    try:
        monkeypatch.setenv(lifeline.ENV, str(read_end))
        tied = await provider.launch(request("b-tied"))
        monkeypatch.delenv(lifeline.ENV)
        free = await provider.launch(request("b-free"))
        os.close(write_end)
        write_end = -1
        await wait_until(
            lambda: process_gone(pid(tied.provider_instance_id), "b-tied"), 30, "b-tied gone"
        )
        log = (tmp_path / "burst" / "logs" / "b-tied.log").read_text()
        assert "lifeline_ended" in log and "gpufed up" in log
        await asyncio.sleep(1.0)  # what ended the other would have ended this one by now
        assert not process_gone(pid(free.provider_instance_id), "b-free")
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
