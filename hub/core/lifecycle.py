"""The workload lifecycle as data: phases, the events that move them, and every attempt.

A workload is `queued` until placed; each placement opens an `Attempt` under a new epoch (the
fence: commands and events of another epoch change nothing). An attempt ends once, with an
`EndReason`; the reason says which phase the workload ends in and whether the end may be
retried, in which case the workload is queued again and its next placement is a new attempt.
Attempts are kept, never overwritten (as Armada keeps a JobRun per run of a Job).

`TRANSITIONS` is the whole table; `advance` refuses anything it does not list, so a hub bug
shows up as `IllegalTransition` instead of a silently inconsistent workload. The hub
(`hub.transitions`) and the replay simulator both move workloads with these functions.

Pure: values in, new values out; no clock (`now` is passed in), no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum, StrEnum

from schemas import Assignment, EventPhase, Phase


class Event(StrEnum):
    """What moves a workload from one phase to another."""

    PLACE = "place"  # the hub assigned it to a spoke: a new attempt
    START = "start"  # the spoke reports it running
    REQUEUE = "requeue"  # its attempt ended and may be retried
    SUCCEED = "succeed"  # its attempt ended successfully
    FAIL = "fail"  # its attempt ended and may not (or may no more) be retried
    CANCEL = "cancel"  # cancelled: while queued, or its attempt was stopped for the user


_Q, _P, _R = Phase.QUEUED, Phase.PLACED, Phase.RUNNING

#: (phase, event) → phase. A pair not listed is an illegal transition; terminal phases have none.
TRANSITIONS: Mapping[tuple[Phase, Event], Phase] = {
    (_Q, Event.PLACE): _P,
    (_Q, Event.CANCEL): Phase.CANCELLED,
    (_P, Event.START): _R,
    **{(phase, Event.REQUEUE): _Q for phase in (_P, _R)},
    **{(phase, Event.SUCCEED): Phase.SUCCEEDED for phase in (_P, _R)},
    **{(phase, Event.FAIL): Phase.FAILED for phase in (_P, _R)},
    **{(phase, Event.CANCEL): Phase.CANCELLED for phase in (_P, _R)},
}


class Retry(Enum):
    """Whether an attempt that ended this way may be retried."""

    NEVER = "never"  # the end is final
    FREE = "free"  # always queued again, no restart counted: not the workload's doing
    RESTART = "restart"  # queued again while restarts remain; counts one
    ON_FAILURE = "on_failure"  # as RESTART, only under restart_policy on_failure


class EndReason(StrEnum):
    """Why an attempt ended (also the workload's `reason` when that end was final)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the workload exited non-zero or its runtime reported a failure
    CANCELLED = "cancelled"  # stopped for the user
    PREEMPTED = "preempted"  # stopped to make room for other work
    REJECTED = "rejected"  # the spoke could not start it
    SPOKE_LOST = "spoke_lost"  # its spoke's lease expired
    LOST_ON_SPOKE = "lost_on_spoke"  # its spoke applied the placement but no longer has it
    IDLE_CULLED = "idle_culled"  # a session left idle (GPUs and port) past the policy's time
    MAX_LIFETIME = "max_lifetime"  # a session past the policy's maximum lifetime
    IDLE_RECLAIMED = "idle_reclaimed"  # its GPUs sat idle past the policy's reclaim time

    @property
    def phase(self) -> Phase:
        """The phase the workload goes to when this end is not retried (queued: always is)."""
        return _ENDS[self][0]

    @property
    def retry(self) -> Retry:
        """Whether an attempt that ended this way may be retried."""
        return _ENDS[self][1]


_ENDS: Mapping[EndReason, tuple[Phase, Retry]] = {
    EndReason.SUCCEEDED: (Phase.SUCCEEDED, Retry.NEVER),
    EndReason.FAILED: (Phase.FAILED, Retry.ON_FAILURE),
    EndReason.CANCELLED: (Phase.CANCELLED, Retry.NEVER),
    EndReason.PREEMPTED: (Phase.QUEUED, Retry.FREE),
    EndReason.REJECTED: (Phase.FAILED, Retry.RESTART),
    EndReason.SPOKE_LOST: (Phase.FAILED, Retry.ON_FAILURE),
    EndReason.LOST_ON_SPOKE: (Phase.QUEUED, Retry.FREE),
    EndReason.IDLE_CULLED: (Phase.CANCELLED, Retry.NEVER),
    EndReason.MAX_LIFETIME: (Phase.CANCELLED, Retry.NEVER),
    EndReason.IDLE_RECLAIMED: (Phase.CANCELLED, Retry.NEVER),
}

#: The end a spoke's event reports (a `running` event is a start, not an end).
REPORTED_ENDS: Mapping[EventPhase, EndReason] = {
    EventPhase.SUCCEEDED: EndReason.SUCCEEDED,
    EventPhase.FAILED: EndReason.FAILED,
    EventPhase.CANCELLED: EndReason.CANCELLED,
    EventPhase.PREEMPTED: EndReason.PREEMPTED,
    EventPhase.REJECTED: EndReason.REJECTED,
}

#: Why a spoke refuses a placement for its own state, not the workload's: `fenced` (it has not
#: heard the hub for fence_after, so it starts no movable work) and `draining` (it is going away).
SPOKE_REFUSALS = frozenset({"fenced", "draining"})


def reported_end(phase: EventPhase, reason: str | None) -> EndReason:
    """The end a spoke's event reports. A refusal for the spoke's own state ends the attempt
    as `preempted` (queued again, no restart counted), as the same spoke reports the work it
    stops for that state: counted as `rejected`, a spoke briefly deaf to the hub's acks burnt a
    workload's restarts in a row of refusals and failed it."""
    if phase == EventPhase.REJECTED and reason in SPOKE_REFUSALS:
        return EndReason.PREEMPTED
    return REPORTED_ENDS[phase]


_FINAL_EVENT: Mapping[Phase, Event] = {
    Phase.SUCCEEDED: Event.SUCCEED,
    Phase.FAILED: Event.FAIL,
    Phase.CANCELLED: Event.CANCEL,
}


class IllegalTransition(ValueError):
    """The event does not apply to the workload as it is (a bug in the caller)."""


class Verdict(Enum):
    """What ending an attempt does to the workload."""

    REQUEUE = "requeue"
    FINAL = "final"  # the reason never retries, or the workload forbids it
    EXHAUSTED = "exhausted"  # it would retry, but no restarts remain


@dataclass(frozen=True, slots=True)
class RetryRules:
    """What the workload allows: its restart policy and budget, and whether it was cancelled."""

    on_failure: bool = False
    max_restarts: int = 0
    cancel_requested: bool = False


@dataclass(frozen=True, slots=True)
class Attempt:
    """One placement of a workload on a spoke, from placed to ended; keyed by its epoch."""

    epoch: int
    spoke_id: str
    assignments: tuple[Assignment, ...]
    placed_at: float
    started_at: float | None = None
    ended_at: float | None = None
    end_reason: EndReason | None = None
    exit_code: int | None = None
    preempting: bool = False  # a Preempt went out for it
    preempted_for: str | None = None  # the pending workload it is being stopped for
    command_seq: int | None = None  # the Place command's sequence on the command stream
    endpoint: str | None = None  # a session's or service's URL, as its spoke reported it

    @property
    def live(self) -> bool:
        """Not ended yet: it holds (or is about to hold) devices on its spoke."""
        return self.ended_at is None


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """Where a workload stands: its phase, every attempt (oldest first), restarts counted."""

    phase: Phase = Phase.QUEUED
    attempts: tuple[Attempt, ...] = ()
    restarts: int = 0

    @property
    def live(self) -> Attempt | None:
        """The attempt not ended yet, if any (only the latest can be)."""
        return live_attempt(self.attempts)

    @property
    def epoch(self) -> int:
        """The latest attempt's epoch; 0 before the first placement."""
        return self.attempts[-1].epoch if self.attempts else 0


def live_attempt(attempts: tuple[Attempt, ...]) -> Attempt | None:
    """Of `attempts` (oldest first), the one not ended yet, if any: only the latest can be."""
    if attempts and attempts[-1].live:
        return attempts[-1]
    return None


def ran_s(attempts: tuple[Attempt, ...], now: float) -> float | None:
    """Seconds `attempts` ran, added up: each from its start to its end, or to `now` while it
    runs. None while none has started."""
    runs = [
        (now if a.ended_at is None else a.ended_at) - a.started_at
        for a in attempts
        if a.started_at is not None
    ]
    return sum(runs) if runs else None


def waited_s(
    submitted_at: float, attempts: tuple[Attempt, ...], finished_at: float | None, now: float
) -> float:
    """Seconds a workload waited for GPUs, added up: from its submission to its end (`now`
    while it lives), less what its attempts ran. A preempted workload waits again; a placed
    one waits until it starts."""
    until = now if finished_at is None else finished_at
    return max(0.0, until - submitted_at - (ran_s(attempts, now) or 0.0))


def advance(phase: Phase, event: Event) -> Phase:
    """The phase `event` leads to from `phase`; raises IllegalTransition if none."""
    try:
        return TRANSITIONS[(phase, event)]
    except KeyError:
        raise IllegalTransition(f"{event.value} is not possible while {phase.value}") from None


def allows(phase: Phase, event: Event) -> bool:
    """Whether `event` applies in `phase`."""
    return (phase, event) in TRANSITIONS


def place(
    lc: Lifecycle, spoke_id: str, assignments: tuple[Assignment, ...], now: float
) -> Lifecycle:
    """Open a new attempt on `spoke_id` under the next epoch."""
    phase = advance(lc.phase, Event.PLACE)
    attempt = Attempt(lc.epoch + 1, spoke_id, assignments, placed_at=now)
    return Lifecycle(phase, (*lc.attempts, attempt), lc.restarts)


def start(lc: Lifecycle, epoch: int, now: float, endpoint: str | None = None) -> Lifecycle:
    """The live attempt of `epoch` started running (reached at `endpoint`, if it has one)."""
    a = _live(lc, epoch)
    phase = advance(lc.phase, Event.START)
    # Spelled out, here and below: dataclasses.replace looks the fields up on every call,
    # and the hub moves every workload through these at hundreds a second (a unit test checks
    # that each move keeps every field it does not set).
    started = Attempt(
        a.epoch, a.spoke_id, a.assignments, a.placed_at, now, a.ended_at, a.end_reason,
        a.exit_code, a.preempting, a.preempted_for, a.command_seq, endpoint,
    )  # fmt: skip
    return _with_live(lc, started, phase)


def mark_preempting(lc: Lifecycle, epoch: int, for_workload: str | None) -> Lifecycle:
    """A Preempt went out for the live attempt of `epoch` (the phase does not change)."""
    a = _live(lc, epoch)
    marked = Attempt(
        a.epoch, a.spoke_id, a.assignments, a.placed_at, a.started_at, a.ended_at, a.end_reason,
        a.exit_code, True, for_workload, a.command_seq, a.endpoint,
    )  # fmt: skip
    return _with_live(lc, marked)


def note_command_seq(lc: Lifecycle, epoch: int, seq: int) -> Lifecycle:
    """Record the command stream sequence of the live attempt's Place."""
    a = _live(lc, epoch)
    noted = Attempt(
        a.epoch, a.spoke_id, a.assignments, a.placed_at, a.started_at, a.ended_at, a.end_reason,
        a.exit_code, a.preempting, a.preempted_for, seq, a.endpoint,
    )  # fmt: skip
    return _with_live(lc, noted)


def verdict(reason: EndReason, restarts: int, rules: RetryRules) -> Verdict:
    """Whether an attempt ending for `reason` is retried, given the workload's rules."""
    retry = reason.retry
    if retry is Retry.NEVER or rules.cancel_requested:
        return Verdict.FINAL
    if retry is Retry.FREE:
        return Verdict.REQUEUE
    if retry is Retry.ON_FAILURE and not rules.on_failure:
        return Verdict.FINAL
    return Verdict.REQUEUE if restarts < rules.max_restarts else Verdict.EXHAUSTED


def end(
    lc: Lifecycle,
    epoch: int,
    reason: EndReason,
    now: float,
    rules: RetryRules,
    exit_code: int | None = None,
) -> Lifecycle:
    """End the live attempt of `epoch` for `reason`: queued again, or in its final phase.

    A cancelled workload is never retried; one whose end would have been requeued for free
    (preempted, lost on its spoke) ends cancelled.
    """
    a = _live(lc, epoch)
    ended = Attempt(
        a.epoch, a.spoke_id, a.assignments, a.placed_at, a.started_at, now, reason,
        exit_code, a.preempting, a.preempted_for, a.command_seq, a.endpoint,
    )  # fmt: skip
    outcome = verdict(reason, lc.restarts, rules)
    restarts = lc.restarts
    if outcome is Verdict.REQUEUE:
        phase = advance(lc.phase, Event.REQUEUE)
        if reason.retry is not Retry.FREE:
            restarts += 1
    else:
        final = reason.phase if reason.phase.terminal else Phase.CANCELLED
        phase = advance(lc.phase, _FINAL_EVENT[final])
    return _with_live(lc, ended, phase, restarts)


def cancel_queued(lc: Lifecycle) -> Lifecycle:
    """Cancel a workload that holds nothing (no live attempt)."""
    if lc.live is not None:
        raise IllegalTransition("a workload with a live attempt is cancelled through its spoke")
    return replace(lc, phase=advance(lc.phase, Event.CANCEL))


def freed_for(ended: Attempt) -> str | None:
    """The pending workload an ended attempt stopped for, whose devices it just gave back.

    None unless the attempt was being preempted and its spoke reported the end (a lost spoke
    frees nothing anyone can use).
    """
    if ended.live or not ended.preempting:
        return None
    if ended.end_reason in (EndReason.SPOKE_LOST, EndReason.LOST_ON_SPOKE):
        return None
    return ended.preempted_for


def _live(lc: Lifecycle, epoch: int) -> Attempt:
    live = lc.live
    if live is None or live.epoch != epoch:
        raise IllegalTransition(f"no live attempt of epoch {epoch} (phase {lc.phase.value})")
    return live


def _with_live(
    lc: Lifecycle, attempt: Attempt, phase: Phase | None = None, restarts: int | None = None
) -> Lifecycle:
    """`lc` with `attempt` in place of its latest one (and a new phase or restart count)."""
    return Lifecycle(
        lc.phase if phase is None else phase,
        (*lc.attempts[:-1], attempt),
        lc.restarts if restarts is None else restarts,
    )
