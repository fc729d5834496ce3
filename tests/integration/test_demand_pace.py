"""The demand burst hears: worked out at most every 0.5 s while work waits (less often when it
costs more than a twentieth of the hub's CPU), at once when the queue empties, and sent again
at least every 2 s (against a real nats-server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import cast

from bus.client import Bus, BusSettings
from bus.natsserver import EmbeddedNats
from hub.core.model import Plan, Reason, Unplaced, Workload
from hub.core.policy import Policy, Team
from hub.ports import Store
from hub.publishing import DEMAND_AT_MOST_EVERY_S, DEMAND_CPU_SHARE, DEMAND_EVERY_S, Publisher
from hub.settings import HubSettings
from hub.state import HubState
from schemas import WorkloadSpec
from schemas.burst import BURST_DEMAND, DemandReport
from tests.support.wait import wait_until


def _waiting(count: int) -> tuple[Plan, list[Workload]]:
    pending = [
        Workload(f"w{i}", WorkloadSpec(name="t", team="ml", command=["true"]), submitted_at=0.0)
        for i in range(count)
    ]
    unplaced = tuple(Unplaced(w.id, Reason.NO_SPOKES, "no spoke") for w in pending)
    return Plan(unplaced=unplaced), pending


@contextlib.asynccontextmanager
async def _publisher(
    nats_server: EmbeddedNats, cpu_clock: Callable[[], float]
) -> AsyncIterator[tuple[Publisher, list[DemandReport]]]:
    """A hub's publisher on the server, and the demand reports burst hears from it."""
    policy = Policy(teams=(Team(name="ml", may_burst=True),))
    # The store is never touched by demand.
    state = HubState(HubSettings(), cast(Store, None), lambda: 0.0, policy)
    bus = Bus(BusSettings(url=nats_server.url, name="hub"))
    await bus.connect()
    heard: list[DemandReport] = []

    async def on_demand(msg: object) -> None:
        heard.append(DemandReport.model_validate_json(msg.data))  # type: ignore[attr-defined]

    await bus.nc.subscribe(BURST_DEMAND, cb=on_demand)
    await bus.nc.flush()
    try:
        yield Publisher(state, bus, cpu_clock), heard
    finally:
        await bus.close()


async def test_demand_follows_the_queue_at_most_every_half_second(
    nats_server: EmbeddedNats,
) -> None:
    # Working the demand out costs no CPU here: its pace is the 0.5 s floor's alone.
    async with _publisher(nats_server, lambda: 0.0) as (publisher, heard):
        await publisher.publish_demand(*_waiting(2), now=100.0)
        await wait_until(lambda: len(heard) == 1, 10, "the first demand")
        assert heard[0].items[0].count == 2

        # More waits a moment later: not worked out again yet.
        await publisher.publish_demand(*_waiting(3), now=100.0 + DEMAND_AT_MOST_EVERY_S / 2)
        # Half a second on, it is.
        await publisher.publish_demand(*_waiting(3), now=100.0 + DEMAND_AT_MOST_EVERY_S)
        await wait_until(lambda: len(heard) == 2, 10, "the second demand")
        assert heard[1].items[0].count == 3

        # The queue empties: burst hears it at once, however soon.
        await publisher.publish_demand(Plan(), (), now=100.0 + DEMAND_AT_MOST_EVERY_S + 0.01)
        await wait_until(lambda: len(heard) == 3, 10, "the empty demand")
        assert heard[2].items == ()
        await asyncio.sleep(0.2)
        assert len(heard) == 3, "nothing more was sent"

        # Cycles while nothing waits send nothing, until the 2 s heartbeat.
        emptied = 100.0 + DEMAND_AT_MOST_EVERY_S + 0.01
        await publisher.publish_demand(Plan(), (), now=emptied + DEMAND_EVERY_S / 2)
        await asyncio.sleep(0.2)
        assert len(heard) == 3, "an unchanged empty demand waits for the heartbeat"
        await publisher.publish_demand(Plan(), (), now=emptied + DEMAND_EVERY_S)
        await wait_until(lambda: len(heard) == 4, 10, "the heartbeat")
        assert heard[3].items == () and heard[3].seq > heard[2].seq


async def test_a_costly_demand_is_worked_out_less_often(nats_server: EmbeddedNats) -> None:
    """A report that took 0.06 s of the hub's CPU waits 0.06 / DEMAND_CPU_SHARE = 1.2 s for
    the next, not 0.5 s; one that costs more than 0.1 s waits the 2 s heartbeat at most."""
    cost = [0.06]
    cpu = [0.0]

    def cpu_clock() -> float:  # read before and after: each report costs cost[0] of CPU
        cpu[0] += cost[0]
        return cpu[0]

    gap = cost[0] / DEMAND_CPU_SHARE
    async with _publisher(nats_server, cpu_clock) as (publisher, heard):
        await publisher.publish_demand(*_waiting(2), now=100.0)
        await wait_until(lambda: len(heard) == 1, 10, "the first demand")
        await publisher.publish_demand(*_waiting(3), now=100.0 + DEMAND_AT_MOST_EVERY_S)
        await publisher.publish_demand(*_waiting(3), now=100.0 + gap - 0.01)
        await asyncio.sleep(0.2)
        assert len(heard) == 1, "worked out again before its cost allowed"
        cost[0] = 1.0
        await publisher.publish_demand(*_waiting(3), now=100.0 + gap)
        await wait_until(lambda: len(heard) == 2, 10, "the second demand")
        assert heard[1].items[0].count == 3
        # 1 s of CPU would ask for 20 s: burst still hears the queue every 2 s.
        await publisher.publish_demand(*_waiting(4), now=100.0 + gap + DEMAND_EVERY_S)
        await wait_until(lambda: len(heard) == 3, 10, "the third demand")
        assert heard[2].items[0].count == 4
