"""The workload lifecycle: its table, its end reasons, and invariants under random events."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core import lifecycle
from hub.core.lifecycle import (
    TRANSITIONS,
    EndReason,
    Event,
    IllegalTransition,
    Lifecycle,
    Retry,
    RetryRules,
    Verdict,
)
from schemas import Assignment, EventPhase, Phase

DEVICES = (Assignment(node="n0", devices=(0,)),)


def placed(spoke: str = "s1", at: float = 1.0) -> Lifecycle:
    return lifecycle.place(Lifecycle(), spoke, DEVICES, at)


# --- the table ---


def test_terminal_phases_have_no_way_out() -> None:
    for phase in Phase:
        if phase.terminal:
            assert not [e for e in Event if lifecycle.allows(phase, e)]


def test_every_phase_but_queued_is_reached_only_through_the_table() -> None:
    reached = set(TRANSITIONS.values())
    assert reached == set(Phase)


@pytest.mark.parametrize(
    ("phase", "event"),
    [
        (Phase.QUEUED, Event.START),
        (Phase.QUEUED, Event.SUCCEED),
        (Phase.RUNNING, Event.PLACE),
        (Phase.RUNNING, Event.START),
        (Phase.SUCCEEDED, Event.CANCEL),
        (Phase.FAILED, Event.PLACE),
    ],
)
def test_an_illegal_transition_raises(phase: Phase, event: Event) -> None:
    with pytest.raises(IllegalTransition, match=event.value):
        lifecycle.advance(phase, event)


def test_placing_a_placed_workload_raises() -> None:
    with pytest.raises(IllegalTransition):
        lifecycle.place(placed(), "s2", DEVICES, 2.0)


def test_an_event_of_another_epoch_raises() -> None:
    lc = placed()
    with pytest.raises(IllegalTransition, match="epoch 7"):
        lifecycle.start(lc, 7, 2.0)


# --- end reasons ---


@pytest.mark.parametrize(
    ("reason", "phase", "retry"),
    [
        (EndReason.SUCCEEDED, Phase.SUCCEEDED, Retry.NEVER),
        (EndReason.CANCELLED, Phase.CANCELLED, Retry.NEVER),
        (EndReason.FAILED, Phase.FAILED, Retry.ON_FAILURE),
        (EndReason.SPOKE_LOST, Phase.FAILED, Retry.ON_FAILURE),
        (EndReason.REJECTED, Phase.FAILED, Retry.RESTART),
        (EndReason.PREEMPTED, Phase.QUEUED, Retry.FREE),
        (EndReason.LOST_ON_SPOKE, Phase.QUEUED, Retry.FREE),
    ],
)
def test_each_end_reason_knows_its_phase_and_whether_it_retries(
    reason: EndReason, phase: Phase, retry: Retry
) -> None:
    assert (reason.phase, reason.retry) == (phase, retry)


@pytest.mark.parametrize(
    ("reason", "rules", "restarts", "expected"),
    [
        (EndReason.FAILED, RetryRules(), 0, Verdict.FINAL),
        (EndReason.FAILED, RetryRules(on_failure=True, max_restarts=2), 1, Verdict.REQUEUE),
        (EndReason.FAILED, RetryRules(on_failure=True, max_restarts=2), 2, Verdict.EXHAUSTED),
        (EndReason.REJECTED, RetryRules(max_restarts=1), 0, Verdict.REQUEUE),
        (EndReason.REJECTED, RetryRules(max_restarts=1), 1, Verdict.EXHAUSTED),
        (EndReason.PREEMPTED, RetryRules(), 99, Verdict.REQUEUE),
        (EndReason.PREEMPTED, RetryRules(cancel_requested=True), 0, Verdict.FINAL),
        (EndReason.FAILED, RetryRules(True, 3, cancel_requested=True), 0, Verdict.FINAL),
        (EndReason.SUCCEEDED, RetryRules(on_failure=True, max_restarts=3), 0, Verdict.FINAL),
    ],
)
def test_verdict(reason: EndReason, rules: RetryRules, restarts: int, expected: Verdict) -> None:
    assert lifecycle.verdict(reason, restarts, rules) is expected


def test_a_failure_under_on_failure_requeues_counts_a_restart_and_keeps_the_attempt() -> None:
    lc = lifecycle.start(placed(), 1, 2.0)
    rules = RetryRules(on_failure=True, max_restarts=1)

    lc = lifecycle.end(lc, 1, EndReason.FAILED, 3.0, rules, exit_code=1)

    assert (lc.phase, lc.restarts, lc.live) == (Phase.QUEUED, 1, None)
    (attempt,) = lc.attempts
    assert (attempt.epoch, attempt.started_at, attempt.ended_at) == (1, 2.0, 3.0)
    assert (attempt.end_reason, attempt.exit_code) == (EndReason.FAILED, 1)
    again = lifecycle.place(lc, "s2", DEVICES, 4.0)
    assert [a.epoch for a in again.attempts] == [1, 2]
    assert again.live is not None and again.live.spoke_id == "s2"


def test_preempted_work_is_requeued_for_free_and_cancelled_work_is_not() -> None:
    lc = lifecycle.mark_preempting(placed(), 1, "w-big")
    requeued = lifecycle.end(lc, 1, EndReason.PREEMPTED, 2.0, RetryRules())
    cancelled = lifecycle.end(lc, 1, EndReason.PREEMPTED, 2.0, RetryRules(cancel_requested=True))

    assert (requeued.phase, requeued.restarts) == (Phase.QUEUED, 0)
    assert lifecycle.freed_for(requeued.attempts[-1]) == "w-big"
    assert cancelled.phase == Phase.CANCELLED


def test_a_lost_spoke_frees_nothing_for_the_claimant() -> None:
    lc = lifecycle.mark_preempting(placed(), 1, "w-big")
    lost = lifecycle.end(lc, 1, EndReason.SPOKE_LOST, 2.0, RetryRules())
    assert lifecycle.freed_for(lost.attempts[-1]) is None


def test_a_workload_with_a_live_attempt_is_not_cancelled_directly() -> None:
    with pytest.raises(IllegalTransition):
        lifecycle.cancel_queued(placed())
    assert lifecycle.cancel_queued(Lifecycle()).phase == Phase.CANCELLED


# --- invariants under random event sequences ---


@dataclass(frozen=True)
class Step:
    kind: str
    spoke: str = "s1"
    reason: EndReason = EndReason.SUCCEEDED
    epoch_offset: int = 0  # events of a stale or future epoch


steps = st.one_of(
    st.builds(Step, st.just("place"), spoke=st.sampled_from(["s1", "s2", "s3"])),
    st.builds(Step, st.just("start"), epoch_offset=st.sampled_from([0, 0, 0, -1, 1])),
    st.builds(
        Step,
        st.just("end"),
        reason=st.sampled_from(list(EndReason)),
        epoch_offset=st.sampled_from([0, 0, 0, -1]),
    ),
    st.builds(Step, st.just("preempt")),
    st.builds(Step, st.just("cancel")),
)
rules_st = st.builds(
    RetryRules,
    on_failure=st.booleans(),
    max_restarts=st.integers(0, 3),
    cancel_requested=st.booleans(),
)


def apply(lc: Lifecycle, step: Step, now: float, rules: RetryRules) -> Lifecycle:
    epoch = lc.epoch + step.epoch_offset
    if step.kind == "place":
        return lifecycle.place(lc, step.spoke, DEVICES, now)
    if step.kind == "start":
        return lifecycle.start(lc, epoch, now)
    if step.kind == "end":
        return lifecycle.end(lc, epoch, step.reason, now, rules)
    if step.kind == "preempt":
        return lifecycle.mark_preempting(lc, epoch, "w-other")
    return lifecycle.cancel_queued(lc)


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, max_size=40), rules_st)
def test_random_event_sequences_keep_the_invariants(seq: list[Step], rules: RetryRules) -> None:
    lc = Lifecycle()
    for n, step in enumerate(seq):
        before = lc
        try:
            lc = apply(lc, step, float(n), rules)
        except IllegalTransition:
            assert lc == before  # a refused event changes nothing
            continue
        # Terminal phases absorb: nothing moved a workload out of one.
        assert not before.phase.terminal
        attempts = lc.attempts
        # At most one live attempt, and only the latest; it exists exactly while active.
        assert all(not a.live for a in attempts[:-1])
        assert (lc.live is not None) == lc.phase.active
        # Epochs only grow.
        epochs = [a.epoch for a in attempts]
        assert epochs == sorted(set(epochs))
        assert lc.epoch >= before.epoch
        # Every attempt ends once: an ended attempt is never changed again.
        for old, new in zip(before.attempts, attempts, strict=False):
            if not old.live:
                assert new == old
        assert all((a.ended_at is None) == (a.end_reason is None) for a in attempts)
        assert lc.restarts <= max(rules.max_restarts, 0)
    if lc.phase.terminal:
        assert all(not a.live for a in lc.attempts)
        for step in (Step("place"), Step("start"), Step("end"), Step("cancel")):
            with pytest.raises(IllegalTransition):
                apply(lc, step, 99.0, rules)


def test_a_refusal_for_the_spokes_own_state_is_requeued_free_and_any_other_counts() -> None:
    for reason in ("fenced", "draining"):
        assert lifecycle.reported_end(EventPhase.REJECTED, reason) is EndReason.PREEMPTED
    assert lifecycle.reported_end(EventPhase.REJECTED, "bad_assignment") is EndReason.REJECTED
    assert lifecycle.reported_end(EventPhase.PREEMPTED, "fenced") is EndReason.PREEMPTED
    assert lifecycle.reported_end(EventPhase.FAILED, None) is EndReason.FAILED


def test_each_move_of_an_attempt_keeps_every_field_it_does_not_set() -> None:
    """The moves spell out the Attempt they make (for speed): a field added to Attempt and
    left out of one of them would be reset to its default on every such move."""
    fields = dataclasses.fields(lifecycle.Attempt)
    assert {f.name for f in fields if f.default is dataclasses.MISSING} == {
        "epoch", "spoke_id", "assignments", "placed_at"
    }  # fmt: skip
    # Every field away from its default, so a move that drops one shows.
    odd: dict[str, object] = {"epoch": 1, "spoke_id": "s1", "assignments": DEVICES}
    odd |= {"placed_at": 1.0, "ended_at": None, "end_reason": None}  # live: moves apply
    samples = {float: 1.5, str: "x", int: 7, bool: True}
    for f in fields:
        if f.name not in odd:
            kind = next(t for t in samples if t.__name__ in str(f.type))
            odd[f.name] = samples[kind]
    live = lifecycle.Attempt(**odd)  # type: ignore[arg-type]
    lc = Lifecycle(Phase.PLACED, (live,), 0)
    moves = {
        "start": (lifecycle.start(lc, 1, 9.0, "http://x"), {"started_at", "endpoint"}),
        "preempt": (lifecycle.mark_preempting(lc, 1, "w2"), {"preempting", "preempted_for"}),
        "seq": (lifecycle.note_command_seq(lc, 1, 99), {"command_seq"}),
        "end": (
            lifecycle.end(lc, 1, EndReason.FAILED, 9.0, RetryRules(), 3),
            {"ended_at", "end_reason", "exit_code"},
        ),
    }
    for name, (moved, changed) in moves.items():
        after = moved.attempts[-1]
        kept = {f.name for f in fields} - changed
        assert {k: getattr(after, k) for k in kept} == {k: odd[k] for k in kept}, name


# --- what a workload waited and ran, added up ---

RULES = RetryRules(on_failure=True, max_restarts=3)


def test_wait_and_run_add_up_every_attempt() -> None:
    # Submitted at 0, placed at 2, ran 3-10, preempted; placed at 14, ran 15-20, succeeded.
    lc = placed(at=2.0)
    lc = lifecycle.start(lc, lc.epoch, 3.0)
    lc = lifecycle.end(lc, lc.epoch, EndReason.PREEMPTED, 10.0, RULES)
    assert lc.phase == Phase.QUEUED
    assert lifecycle.ran_s(lc.attempts, 12.0) == 7.0
    assert lifecycle.waited_s(0.0, lc.attempts, None, 12.0) == 5.0  # 0-3, then 10-12
    lc = lifecycle.place(lc, "s2", DEVICES, 14.0)
    lc = lifecycle.start(lc, lc.epoch, 15.0)
    assert lifecycle.ran_s(lc.attempts, 18.0) == 10.0  # the running one until now
    lc = lifecycle.end(lc, lc.epoch, EndReason.SUCCEEDED, 20.0, RULES, 0)
    assert lifecycle.ran_s(lc.attempts, 99.0) == 12.0
    assert lifecycle.waited_s(0.0, lc.attempts, 20.0, 99.0) == 8.0  # 0-3, then 10-15


def test_work_that_never_started_ran_nothing_and_waited_until_its_end() -> None:
    lc = placed(at=2.0)  # placed, not started: still waiting
    assert lifecycle.ran_s(lc.attempts, 5.0) is None
    assert lifecycle.waited_s(1.0, lc.attempts, None, 5.0) == 4.0
    assert lifecycle.waited_s(1.0, (), 3.5, 99.0) == 2.5  # cancelled in the queue at 3.5
