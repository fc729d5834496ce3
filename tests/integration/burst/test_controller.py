"""The burst controller against a real nats-server and real local cloud spokes.

The test plays the hub's role (tests/integration/burst/hub_role.py): it answers the state
request, publishes demand and reads the instance events from the stream.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from burst.ports import LaunchRequest
from bus.natsserver import EmbeddedNats
from schemas.burst import InstanceState, Market
from schemas.capacity import SpokeKind
from tests.integration.burst.harness import Harness, fast_settings
from tests.integration.burst.hub_role import (
    REGION,
    HubRole,
    pid_of,
    process_gone,
    sim_catalog,
)
from tests.support.wait import wait_until

REQUESTED = InstanceState.REQUESTED
RUNNING = InstanceState.RUNNING
TERMINATING = InstanceState.TERMINATING
TERMINATED = InstanceState.TERMINATED
FAILED = InstanceState.FAILED

#: One L4 for $1/h, or four for $3.60/h.
CATALOG = sim_catalog(("sim.l4x1", "L4", 1, 1.0), ("sim.l4x4", "L4", 4, 3.6))


@pytest.fixture
async def harness(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[Harness]:
    h = Harness(tmp_path, nats_server.url)
    try:
        yield h
    finally:
        await h.close()


def launched_pid(hub: HubRole, burst_id: str) -> int:
    """The pid of an instance's spoke process, from the event carrying the provider's details."""
    event = next(e for e in hub.events if e.burst_id == burst_id and e.provider_instance_id)
    return pid_of(event)


async def test_old_demand_starts_a_cloud_spoke_that_joins_and_is_released_when_idle(
    harness: Harness, tmp_path: Path
) -> None:
    settings = fast_settings(tmp_path, harness.nats_url)
    hub = await harness.hub()
    since = time.time()
    hub.demand(team="ml", gpu_model="L4", workload_ids=("w1",))
    await harness.start(settings, CATALOG)

    await wait_until(lambda: bool(hub.burst_ids()), 10, "a launch")
    [burst_id] = hub.burst_ids()
    requested = hub.first(burst_id, REQUESTED)
    assert requested.at - since >= settings.burst_after_s  # young demand waits for on-prem
    assert (requested.instance_type, requested.team, requested.market) == (
        "sim.l4x1",
        "ml",
        Market.ON_DEMAND,
    )
    assert requested.workload_ids == ("w1",)
    assert requested.spoke_id == burst_id

    await wait_until(lambda: burst_id in hub.reports, 15, "the cloud spoke's capacity report")
    report = hub.reports[burst_id][0]
    assert report.kind is SpokeKind.CLOUD
    assert report.labels["instance-type"] == "sim.l4x1"
    assert report.labels["burst-team"] == "ml"
    assert report.price_per_gpu_hour == pytest.approx(1.0)
    assert [(n.gpu_model, n.gpu_count) for n in report.nodes] == [("L4", 1)]

    await wait_until(lambda: RUNNING in hub.states(burst_id), 10, "the instance to go running")
    hub.clear_demand()  # the hub placed w1; the spoke stays idle (nothing really runs there)

    await wait_until(lambda: TERMINATED in hub.states(burst_id), 15, "idle release")
    assert hub.states(burst_id) == [REQUESTED, RUNNING, TERMINATING, TERMINATED]
    terminating = hub.first(burst_id, TERMINATING)
    assert terminating.reason.startswith("idle")
    # Idle counts from the spoke's first (empty) report at the earliest.
    assert terminating.at - report.sent_at >= settings.idle_ttl_s
    assert process_gone(launched_pid(hub, burst_id), burst_id)
    assert hub.burst_ids() == [burst_id]


async def test_restarted_controllers_neither_launch_again_nor_leak_the_instance(
    harness: Harness, tmp_path: Path
) -> None:
    settings = fast_settings(tmp_path, harness.nats_url)
    hub = await harness.hub()
    hub.demand(team="ml", gpu_model="L4", workload_ids=("w1",))
    first = await harness.start(settings, CATALOG)
    await wait_until(lambda: bool(hub.burst_ids()), 10, "a launch")
    await harness.stop(first)  # mid-way: the instance is still booting
    [burst_id] = hub.burst_ids()
    pid = launched_pid(hub, burst_id)

    second = await harness.start(settings, CATALOG)  # a fresh provider, as in a new process
    await wait_until(lambda: RUNNING in hub.states(burst_id), 15, "the instance to go running")
    rounds = second.rounds
    # The demand is still pending (the hub has not placed it yet): rounds go by, no launch.
    await wait_until(lambda: second.rounds >= rounds + 10, 10, "ten planning rounds")
    assert hub.burst_ids() == [burst_id]
    assert not process_gone(pid, burst_id)

    await harness.stop(second)
    hub.clear_demand()
    await harness.start(settings, CATALOG)
    await wait_until(lambda: TERMINATED in hub.states(burst_id), 15, "idle release")
    assert hub.states(burst_id) == [REQUESTED, RUNNING, TERMINATING, TERMINATED]
    assert process_gone(pid, burst_id)
    assert hub.burst_ids() == [burst_id]


async def test_dollar_cap_stops_launches(harness: Harness, tmp_path: Path) -> None:
    settings = fast_settings(tmp_path, harness.nats_url, max_dollars_per_hour=1.5)
    hub = await harness.hub()
    # Two 1-GPU jobs; only the 1-GPU type fits the $1.50/h cap, once.
    hub.demand(team="ml", gpu_model="L4", workload_ids=("w1", "w2"), count=2)
    controller = await harness.start(settings, CATALOG)
    await wait_until(lambda: bool(hub.burst_ids()), 10, "a launch")
    [burst_id] = hub.burst_ids()
    await wait_until(lambda: RUNNING in hub.states(burst_id), 15, "the instance to go running")
    rounds = controller.rounds
    await wait_until(lambda: controller.rounds >= rounds + 10, 10, "ten planning rounds")
    assert hub.burst_ids() == [burst_id]  # w2 is still pending, but the cap holds
    assert hub.first(burst_id, REQUESTED).price_per_hour == 1.0

    controller.policy = replace(controller.policy, max_dollars_per_hour=2.5)
    await wait_until(lambda: len(hub.burst_ids()) == 2, 10, "a launch once the cap allows it")


async def test_failed_launch_is_recorded_and_the_next_offer_is_tried(
    harness: Harness, tmp_path: Path
) -> None:
    settings = fast_settings(tmp_path, harness.nats_url)
    hub = await harness.hub()
    hub.demand(team="ml", gpu_model="L4", workload_ids=("w1",))
    catalog = sim_catalog(("sim.cheap", "L4", 1, 1.0), ("sim.dear", "L4", 1, 1.5))
    provider_knows = sim_catalog(("sim.dear", "L4", 1, 1.5))  # the cheap type cannot start
    await harness.start(settings, catalog, provider_catalog=provider_knows)

    await wait_until(lambda: len(hub.burst_ids()) == 2, 10, "a second launch")
    failed, retried = hub.burst_ids()
    assert hub.states(failed) == [REQUESTED, FAILED]
    assert hub.first(failed, REQUESTED).instance_type == "sim.cheap"
    assert "not in the catalog" in hub.first(failed, FAILED).reason
    assert hub.first(retried, REQUESTED).instance_type == "sim.dear"
    await wait_until(lambda: RUNNING in hub.states(retried), 15, "the dear one to go running")


async def test_an_instance_that_dies_is_recorded_gone_and_replaced(
    harness: Harness, tmp_path: Path
) -> None:
    settings = fast_settings(tmp_path, harness.nats_url)
    hub = await harness.hub()
    hub.demand(team="ml", gpu_model="L4", workload_ids=("w1",))
    await harness.start(settings, CATALOG)
    await wait_until(lambda: bool(hub.burst_ids()), 10, "a launch")
    [burst_id] = hub.burst_ids()
    await wait_until(lambda: RUNNING in hub.states(burst_id), 15, "the instance to go running")

    os.kill(launched_pid(hub, burst_id), signal.SIGKILL)  # the cloud reclaimed the machine

    await wait_until(lambda: TERMINATED in hub.states(burst_id), 10, "the loss to be recorded")
    assert "crashed or reclaimed" in hub.latest[burst_id].reason
    await wait_until(lambda: len(hub.burst_ids()) == 2, 10, "a replacement for w1")


async def test_waits_for_the_hub_then_sweeps_processes_no_record_knows(
    harness: Harness, tmp_path: Path
) -> None:
    settings = fast_settings(tmp_path, harness.nats_url, orphan_grace_s=0.5)
    orphan = LaunchRequest(
        burst_id="burst-orphan-1",
        instance_type="sim.l4x1",
        region=REGION,
        market=Market.ON_DEMAND,
        team="ml",
        price_per_hour=1.0,
        gpu_model="L4",
        gpu_count=1,
        spoke_creds=None,
    )
    info = await harness.provider(settings, CATALOG).launch(orphan)  # e.g. left by a crash
    pid = int(info.provider_instance_id.removeprefix("pid-"))
    hub = await harness.hub(answer_state=False)

    controller = await harness.start(settings, CATALOG, wait_ready=False)
    await wait_until(lambda: hub.state_requests >= 2, 10, "state requests")
    assert not controller.ready.is_set()  # nothing happens before the hub's record is known
    assert not process_gone(pid, orphan.burst_id)

    hub.answer_state = True
    await asyncio.wait_for(controller.ready.wait(), 10)
    await wait_until(lambda: process_gone(pid, orphan.burst_id), 15, "the orphan to be stopped")
    assert hub.burst_ids() == []
