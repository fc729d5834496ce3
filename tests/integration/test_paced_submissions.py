"""Lone submissions wait for the next scheduling cycle, which saves them together.

While the hub's cycle loop runs (`HubState.paced`), a submission made alone is neither saved
nor answered until the cycle takes what waits (`Submissions.flush`); a batch, and every
submission while no cycle loop runs, is saved at once.
"""

from __future__ import annotations

import asyncio

from hub.core.policy import Policy
from hub.records import WorkloadRecord
from hub.settings import HubSettings
from hub.state import HubState
from hub.store import Store
from hub.submissions import Submissions
from schemas import WorkloadSpec


def _submissions(store: Store, paced: bool) -> tuple[HubState, Submissions]:
    state = HubState(HubSettings(), store, lambda: 100.0, Policy())
    state.paced = paced
    return state, Submissions(state)


def _record(submissions: Submissions, name: str) -> WorkloadRecord:
    spec = WorkloadSpec(name=name, team="a", command=["true"])
    return submissions.new_record(spec, submissions.queued_counts())


async def test_lone_submissions_wait_for_the_cycle_and_are_saved_by_it(store: Store) -> None:
    state, submissions = _submissions(store, paced=True)
    records = [_record(submissions, f"w{i}") for i in range(3)]
    waiting = [asyncio.create_task(submissions.commit([r], alone=True)) for r in records]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in waiting), "answered before the cycle saved them"
    assert state.wakeup.is_set(), "a waiting submission asks for a cycle"
    assert all(store.get(r.id) is None for r in records)
    assert not state.workloads

    await submissions.flush()  # what the cycle loop does before it plans

    assert all(task.done() and task.exception() is None for task in waiting)
    assert all(store.get(r.id) is not None for r in records)
    assert set(state.workloads) == {r.id for r in records}


async def test_a_batch_is_saved_at_once_even_while_paced(store: Store) -> None:
    state, submissions = _submissions(store, paced=True)
    records = [_record(submissions, f"b{i}") for i in range(3)]
    await asyncio.wait_for(submissions.commit(records), 10)
    assert all(store.get(r.id) is not None for r in records)
    assert set(state.workloads) == {r.id for r in records}


async def test_without_a_cycle_loop_a_lone_submission_is_saved_at_once(store: Store) -> None:
    state, submissions = _submissions(store, paced=False)
    record = _record(submissions, "alone")
    await asyncio.wait_for(submissions.commit([record], alone=True), 10)
    assert store.get(record.id) is not None and record.id in state.workloads
