"""Whether a spoke's workload event may change the hub's record (origin checks).

Pure. Like Kubernetes' NodeRestriction (a kubelet may only update pods bound to its node): an
event counts only when it arrived on the events subject of the spoke it names, that spoke holds
the workload's current (live) attempt, and the event is for that attempt's epoch. Anything else
is dropped by the hub, counted and logged under the reason returned here.
"""

from __future__ import annotations

from enum import StrEnum


class EventRefusal(StrEnum):
    SUBJECT_MISMATCH = "subject_mismatch"  # published on another spoke's subject
    UNKNOWN_WORKLOAD = "unknown_workload"  # no such workload, or it already ended
    STALE_EPOCH = "stale_epoch"  # from an attempt that has ended (the usual, benign case)
    NEVER_PLACED = "never_placed"  # epoch 0: no assignment was ever made
    NOT_PLACED = "not_placed"  # an epoch the workload was never placed under
    WRONG_SPOKE = "wrong_spoke"  # another spoke holds (or held) that attempt


def refuse_event(
    *,
    subject_spoke: str | None,
    event_spoke: str,
    event_epoch: int,
    known: bool,
    latest_epoch: int,
    attempt_spoke: str | None,
    attempt_live: bool,
) -> EventRefusal | None:
    """Why an event must be dropped, or None when it may be applied.

    `subject_spoke` is the spoke id in the subject the event came on. `known` says whether the
    hub tracks the workload (not ended); `latest_epoch` is its latest attempt's epoch;
    `attempt_spoke` is the spoke of its attempt under the event's epoch (None: there is no
    such attempt) and `attempt_live` whether that attempt is still going.
    """
    if subject_spoke != event_spoke:
        return EventRefusal.SUBJECT_MISMATCH
    if not known:
        return EventRefusal.UNKNOWN_WORKLOAD
    if event_epoch <= 0:
        return EventRefusal.NEVER_PLACED
    if attempt_spoke is None:
        return EventRefusal.NOT_PLACED if event_epoch > latest_epoch else EventRefusal.STALE_EPOCH
    if attempt_spoke != event_spoke:
        return EventRefusal.WRONG_SPOKE
    if not attempt_live or event_epoch != latest_epoch:
        return EventRefusal.STALE_EPOCH
    return None


#: Refusals that no honest spoke produces: logged as warnings (the others are routine).
SUSPICIOUS = frozenset(
    {
        EventRefusal.SUBJECT_MISMATCH,
        EventRefusal.NEVER_PLACED,
        EventRefusal.NOT_PLACED,
        EventRefusal.WRONG_SPOKE,
    }
)
