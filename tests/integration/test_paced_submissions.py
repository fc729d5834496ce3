"""Lone submissions go with the next scheduling cycle, which saves them with its decisions.

While the hub's cycle loop runs (`HubState.paced`), a submission made alone is neither saved
nor answered until a cycle takes what waits (`Submissions.take`), plans it and commits it in
its own transaction; a batch, and every submission while no cycle loop runs, is saved at once.
A cycle that fails before its save keeps none of them and tells each submitter why.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from sqlalchemy import text

from bus.client import Bus
from hub.core.policy import Policy
from hub.cycle import Cycle
from hub.leases import Leases
from hub.publishing import Publisher
from hub.records import WorkloadRecord
from hub.settings import HubSettings
from hub.state import HubState
from hub.store import Store
from hub.submissions import Submissions
from schemas import Phase, WorkloadSpec


def _hub(store: Store, paced: bool) -> tuple[HubState, Submissions, Cycle]:
    state = HubState(HubSettings(), store, lambda: 100.0, Policy())
    state.paced = paced
    # No spoke has reported: nothing is placed, so nothing is published on the bus.
    cycle = Cycle(state, Leases(15.0, 120.0), Publisher(state, cast(Bus, None)))
    return state, Submissions(state), cycle


def _record(submissions: Submissions, name: str) -> WorkloadRecord:
    spec = WorkloadSpec(name=name, team="a", command=["true"])
    return submissions.new_record(spec, submissions.queued_counts())


async def test_lone_submissions_wait_for_the_cycle_that_saves_them(store: Store) -> None:
    state, submissions, cycle = _hub(store, paced=True)
    records = [_record(submissions, f"w{i}") for i in range(3)]
    waiting = [asyncio.create_task(submissions.commit([r], alone=True)) for r in records]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in waiting), "answered before a cycle saved them"
    assert state.wakeup.is_set(), "a waiting submission asks for a cycle"
    assert all(store.get(r.id) is None for r in records)
    assert not state.workloads

    await cycle.run(submissions.take())

    await asyncio.wait_for(asyncio.gather(*waiting), 10)
    for r in records:
        stored = store.get(r.id)
        assert stored is not None and stored.phase == Phase.QUEUED
        assert stored.reason, "saved with the reason the cycle gave it"
    assert set(state.workloads) == {r.id for r in records}
    assert submissions.take() is None, "each is taken once"


async def test_a_cycle_that_fails_to_save_keeps_none_and_tells_each_submitter(
    store: Store,
) -> None:
    state, submissions, cycle = _hub(store, paced=True)
    records = [_record(submissions, f"f{i}") for i in range(2)]
    waiting = [asyncio.create_task(submissions.commit([r], alone=True)) for r in records]
    await asyncio.sleep(0)
    with store.engine.begin() as connection:  # the store refuses the next workload write
        connection.execute(text("DROP TABLE workloads"))

    with pytest.raises(Exception):  # noqa: B017  (the driver's own error, whatever it is)
        await cycle.run(submissions.take())

    for task in waiting:
        with pytest.raises(Exception):  # noqa: B017
            await asyncio.wait_for(task, 10)
    assert not state.workloads, "never kept: the client was told it failed"


async def test_a_batch_is_saved_at_once_even_while_paced(store: Store) -> None:
    state, submissions, _ = _hub(store, paced=True)
    records = [_record(submissions, f"b{i}") for i in range(3)]
    await asyncio.wait_for(submissions.commit(records), 10)
    assert all(store.get(r.id) is not None for r in records)
    assert set(state.workloads) == {r.id for r in records}


async def test_without_a_cycle_loop_a_lone_submission_is_saved_at_once(store: Store) -> None:
    state, submissions, _ = _hub(store, paced=False)
    record = _record(submissions, "alone")
    await asyncio.wait_for(submissions.commit([record], alone=True), 10)
    assert store.get(record.id) is not None and record.id in state.workloads


async def test_what_waits_when_the_cycle_loop_stops_is_saved_without_it(store: Store) -> None:
    state, submissions, _ = _hub(store, paced=True)
    record = _record(submissions, "late")
    waiting = asyncio.create_task(submissions.commit([record], alone=True))
    await asyncio.sleep(0)
    state.paced = False
    submissions.release()  # what the cycle loop does as it stops
    await asyncio.wait_for(waiting, 10)
    assert store.get(record.id) is not None and record.id in state.workloads
