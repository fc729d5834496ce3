"""Origin checks of workload events: only the spoke holding the live attempt is heard."""

from __future__ import annotations

import pytest

from hub.core.fencing import SUSPICIOUS, EventRefusal, refuse_event

pytestmark = pytest.mark.security

# The workload's latest attempt is epoch 3 on eu-1, still live.
HELD = {"known": True, "latest_epoch": 3, "attempt_spoke": "eu-1", "attempt_live": True}


@pytest.mark.parametrize(
    ("subject", "spoke", "epoch", "record", "expected"),
    [
        ("eu-1", "eu-1", 3, HELD, None),
        ("eu-2", "eu-2", 3, {**HELD, "attempt_spoke": "eu-1"}, EventRefusal.WRONG_SPOKE),
        ("eu-2", "eu-1", 3, HELD, EventRefusal.SUBJECT_MISMATCH),
        (None, "eu-1", 3, HELD, EventRefusal.SUBJECT_MISMATCH),
        ("eu-1", "eu-1", 0, HELD, EventRefusal.NEVER_PLACED),
        ("eu-1", "eu-1", 9, {**HELD, "attempt_spoke": None}, EventRefusal.NOT_PLACED),
        ("eu-1", "eu-1", 2, {**HELD, "attempt_spoke": None}, EventRefusal.STALE_EPOCH),
        ("eu-1", "eu-1", 3, {**HELD, "attempt_live": False}, EventRefusal.STALE_EPOCH),
        ("eu-1", "eu-1", 2, {**HELD, "latest_epoch": 3}, EventRefusal.STALE_EPOCH),
        ("eu-1", "eu-1", 3, {**HELD, "known": False}, EventRefusal.UNKNOWN_WORKLOAD),
    ],
)
def test_refuse_event(
    subject: str | None,
    spoke: str,
    epoch: int,
    record: dict[str, object],
    expected: EventRefusal | None,
) -> None:
    got = refuse_event(subject_spoke=subject, event_spoke=spoke, event_epoch=epoch, **record)  # type: ignore[arg-type]
    assert got == expected


def test_only_what_no_honest_spoke_sends_is_suspicious() -> None:
    assert EventRefusal.STALE_EPOCH not in SUSPICIOUS
    assert EventRefusal.UNKNOWN_WORKLOAD not in SUSPICIOUS
    assert EventRefusal.WRONG_SPOKE in SUSPICIOUS
