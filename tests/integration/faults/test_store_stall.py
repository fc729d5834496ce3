"""A store that stalls (PostgreSQL failing over, a lock held, a disk gone slow) costs no spoke
its lease: the hub goes on acknowledging capacity reports, so no spoke fences its work.

Before, the report handler wrote a spoke's record (on joining, then every 10 s) before it
acknowledged the report, on the store's one thread behind every other write; and NATS hands a
subscription's messages over one at a time. One stalled write held every spoke's acks: past
fence_after, each spoke stopped its movable work (the hub, deaf to them too, then declared
them lost). A stall of the store became an outage of the fleet.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import event

import hub.spokerecords
from hub.store import Store
from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

#: The hub's lease here; the store stalls for longer than this.
LOST_AFTER_S = 4.0


class Stall:
    """Every checkout of the store's pool waits until `release` (at most a minute)."""

    def __init__(self, store: Store) -> None:
        self.released = threading.Event()
        self.waiting = 0
        event.listen(store.engine, "checkout", self._wait)

    def _wait(self, *_: Any) -> None:
        self.waiting += 1
        self.released.wait(timeout=60)


async def test_a_stalled_store_costs_no_spoke_its_lease(
    fed: InProcessFederation, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The record of each spoke is written every second here (10 s otherwise), so a few seconds
    # of stall are sure to meet one.
    monkeypatch.setattr(hub.spokerecords, "PERSIST_EVERY_S", 1.0)
    hub_service = await fed.start_hub(suspect_after_s=2.0, lost_after_s=LOST_AFTER_S)
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"), heartbeat_s=0.2)
    await fed.wait_spokes(1)
    wid = await fed.submit(
        name="movable", team="drill", command=["sleep", "300"], restart_policy="on_failure"
    )
    await fed.wait_phase(wid, {Phase.RUNNING})
    stall = Stall(hub_service.store)
    try:
        await wait_until(lambda: stall.waiting >= 1, 10, "a store call to stall")
        stalled_at = time.time()
        # The store answers nothing for longer than the lease; the spoke reports on.
        await wait_until(
            lambda: hub_service.reports["eu-1"].sent_at > stalled_at + LOST_AFTER_S + 1,
            15,
            "a report heard past the lease",
        )
        fenced = spoke.counters["fenced"]
        still_running = wid in spoke.runtime.running()
        lost_at = hub_service.spokes["eu-1"].lost_at
    finally:
        stall.released.set()
    assert (fenced, still_running, lost_at) == (0, True, None)
    record = await fed.workload(wid)
    assert (record["phase"], record["spoke_id"], record["epoch"]) == ("running", "eu-1", 1)
