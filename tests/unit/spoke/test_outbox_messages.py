"""The outbox's messages: events in order, as few messages as fit, each read back whole."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas import EventPhase, WorkloadEvent, parse_events
from schemas.events import MAX_EVENTS_BYTES, MAX_EVENTS_PER_MESSAGE
from spoke.outbox import messages_of


def _event(n: int, message: str = "") -> tuple[str, bytes]:
    event = WorkloadEvent(
        event_id=f"eu-1-w{n}-e1-running",
        spoke_id="eu-1",
        workload_id=f"w{n}",
        epoch=1,
        phase=EventPhase.RUNNING,
        message=message,
        at=1_700_000_000.0 + n,
    )
    return event.event_id, event.model_dump_json().encode()


@given(count=st.integers(min_value=1, max_value=300), long=st.booleans())
def test_messages_hold_every_event_once_in_order_within_the_limits(count: int, long: bool) -> None:
    events = [_event(n, "x" * 3000 if long else "") for n in range(count)]
    messages = messages_of(events)
    read = [e.event_id for _, payload in messages for e in parse_events(payload)]
    assert read == [event_id for event_id, _ in events]
    for msg_id, payload in messages:
        held = parse_events(payload)
        assert len(held) <= MAX_EVENTS_PER_MESSAGE
        assert len(held) == 1 or len(payload) <= MAX_EVENTS_BYTES
        first, last = held[0].event_id, held[-1].event_id
        assert msg_id == (first if len(held) == 1 else f"{first}..{last}")


def test_a_lone_event_is_sent_as_before_under_its_own_id() -> None:
    event_id, payload = _event(7)
    assert messages_of([(event_id, payload)]) == [(event_id, payload)]


def test_the_same_events_make_the_same_messages() -> None:
    events = [_event(n) for n in range(100)]
    assert messages_of(events) == messages_of(list(events))


@pytest.mark.parametrize("data", [b"[]", b"[1]", b'{"event_id": "x"}', b"[{}]", b"not json"])
def test_what_is_not_one_or_more_events_is_refused(data: bytes) -> None:
    with pytest.raises(ValidationError):
        parse_events(data)
