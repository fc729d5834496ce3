"""max_queued: the count a submission is checked against is skipped while it cannot matter,
and must then give the same answer as counting every workload; a batch's own items count."""

from __future__ import annotations

from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from hub import transitions
from hub.core.policy import Policy, Team
from hub.errors import TooMany
from hub.ports import Store
from hub.records import WorkloadRecord
from hub.settings import HubSettings
from hub.state import HubState
from hub.submissions import Submissions
from schemas import Assignment, Phase, WorkloadSpec

TEAMS = ("a", "b", "c")


def _state(policy: Policy, workloads: list[tuple[str, bool]]) -> HubState:
    # The store is never touched by the checks under test: nothing is committed here.
    state = HubState(HubSettings(), cast(Store, None), lambda: 100.0, policy)
    for i, (team, placed) in enumerate(workloads):
        record = WorkloadRecord(
            id=f"w{i}", spec=WorkloadSpec(name="w", team=team, command=["true"]), submitted_at=0
        )
        if placed:
            transitions.place(record, "s1", (Assignment(node="n0", devices=(0,)),), 1.0)
        state.workloads[record.id] = record
    return state


@settings(max_examples=200, deadline=None)
@given(
    workloads=st.lists(st.tuples(st.sampled_from(TEAMS), st.booleans()), max_size=30),
    caps=st.lists(st.integers(min_value=0, max_value=12), min_size=3, max_size=3),
    team=st.sampled_from(TEAMS),
)
def test_a_submission_is_refused_exactly_when_its_team_has_reached_its_cap(
    workloads: list[tuple[str, bool]], caps: list[int], team: str
) -> None:
    policy = Policy(
        teams=tuple(Team(name=t, max_queued=c) for t, c in zip(TEAMS, caps, strict=True))
    )
    state = _state(policy, workloads)
    submissions = Submissions(state)
    queued = sum(
        1 for w in state.workloads.values() if w.spec.team == team and w.phase == Phase.QUEUED
    )
    spec = WorkloadSpec(name="new", team=team, command=["true"])
    cap = caps[TEAMS.index(team)]
    try:
        record = submissions.new_record(spec, submissions.queued_counts())
    except TooMany:
        assert queued >= cap
    else:
        assert queued < cap
        assert record.spec.team == team and record.id not in state.workloads


@settings(max_examples=200, deadline=None)
@given(
    workloads=st.lists(st.tuples(st.sampled_from(TEAMS), st.booleans()), max_size=30),
    caps=st.lists(st.integers(min_value=0, max_value=12), min_size=3, max_size=3),
    batch=st.lists(st.sampled_from(TEAMS), max_size=30),
)
def test_a_batch_takes_of_each_team_only_what_its_cap_leaves(
    workloads: list[tuple[str, bool]], caps: list[int], batch: list[str]
) -> None:
    policy = Policy(
        teams=tuple(Team(name=t, max_queued=c) for t, c in zip(TEAMS, caps, strict=True))
    )
    state = _state(policy, workloads)
    room = {
        team: cap
        - sum(
            1 for w in state.workloads.values() if w.spec.team == team and w.phase == Phase.QUEUED
        )
        for team, cap in zip(TEAMS, caps, strict=True)
    }
    specs = [WorkloadSpec(name="new", team=team, command=["true"]) for team in batch]
    results, records, _ = Submissions(state).accept(specs, "mia", None)
    expected = []
    for team in batch:  # in the batch's order: the first items fill what the cap leaves
        expected.append(room[team] > 0)
        room[team] -= 1
    assert [isinstance(r, WorkloadRecord) for r in results] == expected
    assert all(isinstance(r, TooMany) for r in results if not isinstance(r, WorkloadRecord))
    assert len(records) == sum(expected)
