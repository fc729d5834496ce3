"""Forged workload events are dropped: only the spoke holding the assignment may report on it."""

from __future__ import annotations

import time

from bus.client import Bus
from bus.natsserver import EmbeddedNats
from schemas import EventPhase, Phase, WorkloadEvent, subjects
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


def forged(spoke: str, workload: str, epoch: int, n: int, **extra: object) -> bytes:
    event = WorkloadEvent(
        event_id=f"forged-{n}",
        spoke_id=spoke,
        workload_id=workload,
        epoch=epoch,
        phase=EventPhase.SUCCEEDED,
        exit_code=0,
        at=time.time(),
    )
    return event.model_copy(update=extra).model_dump_json().encode()


async def test_events_from_the_wrong_spoke_subject_or_epoch_change_nothing(
    fed: InProcessFederation, nats_server: EmbeddedNats
) -> None:
    hub = await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.start_spoke("eu-2", "eu", nodes("eu-2", 1, 1, "A100"))
    await fed.wait_spokes(2)
    running = await fed.submit(
        name="real", team="vision", gpu_model="H100", command=["sleep", "30"]
    )
    record = await fed.wait_phase(running, {Phase.RUNNING})
    epoch = record["epoch"]
    never = await fed.submit(name="waits", team="vision", gpu_model="B200", command=["true"])

    bus = Bus(fed.tool_settings())
    await bus.connect()
    try:
        # eu-2, on its own subject, claims eu-1's job finished.
        await bus.publish_durable(subjects.events("eu-2"), forged("eu-2", running, epoch, 1), "f1")
        # eu-2 pretends to be eu-1.
        await bus.publish_durable(subjects.events("eu-2"), forged("eu-1", running, epoch, 2), "f2")
        # An epoch-0 event for a workload that was never placed.
        await bus.publish_durable(subjects.events("eu-1"), forged("eu-1", never, 0, 3), "f3")
        # An over-long reason (five of these grew one record to 4.5 MB) is refused outright.
        long = forged("eu-1", running, epoch, 4, reason="x" * 900_000)
        await bus.publish_durable(subjects.events("eu-1"), long, "f4")
        await wait_until(lambda: hub.counters["events_refused"] == 3, 10, "3 refused events")
        await wait_until(lambda: hub.counters["malformed"] >= 1, 10, "the long reason refused")
    finally:
        await bus.close()
    assert hub.counters["events_refused_wrong_spoke"] == 1
    assert hub.counters["events_refused_subject_mismatch"] == 1
    assert hub.counters["events_refused_never_placed"] == 1
    assert (await fed.workload(running))["phase"] == "running"
    assert (await fed.workload(running))["spoke_id"] == "eu-1"
    assert (await fed.workload(never))["phase"] == "queued"
    # The real spoke's own event still counts.
    await fed.api.delete(f"/v1/workloads/{running}")  # type: ignore[union-attr]
    assert (await fed.wait_phase(running, {Phase.CANCELLED}))["phase"] == "cancelled"
