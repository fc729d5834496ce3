"""Least attained service (ordering `las`): who gets borrowed GPUs, and what stays protected."""

from __future__ import annotations

from dataclasses import replace

from hub.core.lifecycle import Attempt
from hub.core.model import Plan, RunningWorkload, Snapshot, Workload
from hub.core.ordering import level_of, pending_level, served
from hub.core.policy import Ordering, Policy, Quota, Team, check_policy
from tests.unit.hub.core.builders import (
    checked_plan,
    fleet,
    node,
    pending,
    placed,
    running,
    spoke,
    victims,
)

NOW = 100_000.0
LAS = Ordering(mode="las", thresholds_gpu_s=(3600.0,))
POLICY = Policy(
    teams=(
        Team("vision", quotas={"H100": Quota(8)}),
        Team("nlp", quotas={"H100": Quota(0)}),
        Team("speech", quotas={"H100": Quota(0)}),
    ),
    ordering=LAS,
)
TWO_NODES = fleet(spoke("s1", node("n1"), node("n2")))


def run(
    *queue: Workload,
    active: tuple[RunningWorkload, ...] = (),
    policy: Policy = POLICY,
    base: Snapshot = TWO_NODES,
) -> Plan:
    return checked_plan(base, queue, active, policy, NOW)


def long_and_short(team: str = "nlp") -> tuple[RunningWorkload, ...]:
    """Team `team` borrows both nodes: one job has run for hours, one for a minute."""
    return (
        running("long", "s1", {"n1": range(8)}, started=NOW - 7200, team=team),
        running("short", "s1", {"n2": range(8)}, started=NOW - 60, team=team),
    )


def test_fresh_work_takes_borrowed_gpus_from_work_that_ran_long() -> None:
    result = run(pending("w", team="speech", gpus=8), active=long_and_short())
    assert victims(result) == ["long"]
    (preemption,) = result.preemptions
    assert preemption.for_workload == "w"
    assert "least attained service" in preemption.reason


def test_fifo_ordering_takes_nothing() -> None:
    fifo = replace(POLICY, ordering=Ordering())
    result = run(pending("w", team="speech", gpus=8), active=long_and_short(), policy=fifo)
    assert result.preemptions == ()


def test_work_below_the_threshold_is_not_taken() -> None:
    active = (
        running("a", "s1", {"n1": range(8)}, started=NOW - 60, team="nlp"),
        running("b", "s1", {"n2": range(8)}, started=NOW - 60, team="nlp"),
    )
    assert run(pending("w", team="speech", gpus=8), active=active).preemptions == ()


def test_a_team_keeps_its_guarantee() -> None:
    # vision is guaranteed 8 GPUs: its long job within them is never taken, even for fresh work.
    active = (
        running("mine", "s1", {"n1": range(8)}, started=0.0, team="vision"),
        running("other", "s1", {"n2": range(8)}, started=NOW - 60, team="nlp"),
    )
    assert run(pending("w", team="speech", gpus=8), active=active).preemptions == ()


def test_work_that_already_ran_long_does_not_take_from_its_peers() -> None:
    resumed = replace(pending("w", team="speech", gpus=8), attained_gpu_s=8 * 3600.0)
    resumed = replace(resumed, submitted_at=NOW - 3600)  # has not waited long enough yet
    assert run(resumed, active=long_and_short()).preemptions == ()


def test_wide_gangs_are_exempt() -> None:
    base = fleet(spoke("s1", *(node(f"n{i}") for i in range(5))))
    gang = running(
        "gang",
        "s1",
        {f"n{i}": range(8) for i in range(4)},
        started=0.0,
        team="nlp",
    )
    result = run(pending("w", team="speech", gpus=8), active=(gang,), base=base)
    assert "w" in placed(result)  # n4 is free
    busy = (*[gang], running("x", "s1", {"n4": range(8)}, started=NOW - 10, team="nlp"))
    assert run(pending("w", team="speech", gpus=8), active=busy, base=base).preemptions == ()


def test_higher_priority_work_is_never_taken_for_lower() -> None:
    active = (
        running("long", "s1", {"n1": range(8)}, started=0.0, team="nlp", cls="training"),
        running("also", "s1", {"n2": range(8)}, started=0.0, team="nlp", cls="training"),
    )
    result = run(pending("w", team="speech", gpus=8, cls="batch"), active=active)
    assert result.preemptions == ()


def test_a_fresh_workload_waits_its_patience_before_borrowed_work_is_stopped() -> None:
    patient = replace(POLICY, ordering=replace(LAS, patience_s=600.0))
    young = pending("w", at=NOW - 599, team="speech", gpus=8)
    result = run(young, active=long_and_short(), policy=patient)
    assert result.preemptions == ()
    assert result.unplaced[0].reason == "insufficient_free"  # it waits like any other
    due = pending("w", at=NOW - 600, team="speech", gpus=8)
    assert victims(run(due, active=long_and_short(), policy=patient)) == ["long"]


def test_patience_never_delays_reclaiming_a_guarantee() -> None:
    patient = replace(POLICY, ordering=replace(LAS, patience_s=3600.0))
    mine = pending("mine", at=NOW, team="vision", gpus=8)  # vision is guaranteed 8
    result = run(mine, active=long_and_short(), policy=patient)
    assert victims(result) == ["short"]  # reclaim takes the newest borrowed work
    assert "reclaimed" in result.preemptions[0].reason


def test_a_patient_workload_does_not_stop_an_older_one_of_its_team_taking_gpus() -> None:
    # The young training job comes first in the queue and may take nothing yet; the old batch
    # job behind it has waited long enough and takes the long batch job's GPUs.
    patient = replace(POLICY, ordering=replace(LAS, patience_s=600.0))
    active = (
        running("long", "s1", {"n1": range(8)}, started=NOW - 7200, team="nlp", cls="batch"),
        running("long2", "s1", {"n2": range(8)}, started=NOW - 7200, team="nlp", cls="batch"),
    )
    young = pending("young", at=NOW - 10, team="speech", gpus=8)
    old = pending("old", at=NOW - 1200, team="speech", gpus=8, cls="batch")
    result = run(young, old, active=active, policy=patient)
    assert [p.for_workload for p in result.preemptions] == ["old"]


def test_work_stopped_once_is_not_stopped_again_with_resumed_min_run_s() -> None:
    once = replace(POLICY, ordering=replace(LAS, resumed_min_run_s=1e9))
    resumed = (
        replace(long_and_short()[0], attained_gpu_s=8 * 3600.0),  # ran before, was stopped
        long_and_short()[1],
    )
    fresh = pending("w", team="speech", gpus=8)
    assert run(fresh, active=resumed, policy=once).preemptions == ()
    assert victims(run(fresh, active=resumed)) == ["long"]  # without the knob: again
    assert victims(run(fresh, active=long_and_short(), policy=once)) == ["long"]  # first time


def test_queue_goes_by_level_then_age() -> None:
    # One free node: the fresh workload goes first although the other was submitted earlier.
    base = fleet(spoke("s1", node("n1")))
    ran = replace(pending("old", at=NOW - 1000, team="nlp", gpus=8), attained_gpu_s=8 * 900.0)
    fresh = pending("new", at=NOW - 10, team="nlp", gpus=8)
    assert "new" in placed(run(ran, fresh, base=base))
    fifo = replace(POLICY, ordering=Ordering())
    assert "old" in placed(run(ran, fresh, base=base, policy=fifo))


def test_a_starved_workload_goes_back_to_level_zero() -> None:
    w = replace(pending("w", at=0.0, gpus=1), attained_gpu_s=7200.0)  # ran 2 h of 1 GPU
    assert pending_level(w, LAS, now=7200.0 + 8 * 7200.0 - 1) == 1
    assert pending_level(w, LAS, now=7200.0 + 8 * 7200.0) == 0
    assert pending_level(w, Ordering(), now=0.0) == 0


def test_levels_and_service() -> None:
    three = Ordering(mode="las", thresholds_gpu_s=(3250.0, 7200.0, 18000.0))
    assert [level_of(s, three) for s in (0, 3249, 3250, 7200, 10**9)] == [0, 0, 1, 2, 3]
    attempts = (
        Attempt(
            epoch=1, spoke_id="s", assignments=(), placed_at=0.0, started_at=10.0, ended_at=110.0
        ),
        Attempt(epoch=2, spoke_id="s", assignments=(), placed_at=200.0, started_at=None),
        Attempt(epoch=3, spoke_id="s", assignments=(), placed_at=300.0, started_at=310.0),
    )
    assert served(attempts, 4) == 400.0  # only the attempt that ran and ended


def test_bad_ordering_is_reported() -> None:
    bad = Policy(ordering=Ordering(mode="sjf", thresholds_gpu_s=(7200.0, 3600.0)))
    problems = check_policy(bad)
    assert any(p.startswith("ordering.mode") for p in problems)
    assert any(p.startswith("ordering.thresholds_gpu_s") for p in problems)
    impatient = Policy(ordering=Ordering(mode="las", patience_s=-1.0))
    assert any(p.startswith("ordering.patience_s") for p in check_policy(impatient))
