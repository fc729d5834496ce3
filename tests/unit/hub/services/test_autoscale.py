"""The autoscaling decision: load to replicas within min/max, slow down, zero and wake."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hub.core.autoscale import Load, Recommendation, ScaleReason, decide_replicas
from schemas.services import Autoscaling, ScaleMetric

RPS = Autoscaling(target=10, scale_down_delay_s=30, scale_to_zero_after_s=60)


def _decide(load: Load, lo: int = 1, hi: int = 5, history=(), now: float = 1000.0):  # type: ignore[no-untyped-def]
    return decide_replicas(RPS, lo, hi, load, tuple(history), now, created_at=0.0)


def test_replicas_follow_requests_per_second_per_replica() -> None:
    assert _decide(Load(rps=25, last_request_at=999)).replicas == 3
    assert _decide(Load(rps=30, last_request_at=999)).replicas == 3


def test_the_count_stays_within_min_and_max() -> None:
    hot = _decide(Load(rps=500, last_request_at=999))
    assert (hot.replicas, hot.reason) == (5, ScaleReason.MAX)
    cold = _decide(Load(rps=0, last_request_at=999), lo=2)
    assert (cold.replicas, cold.reason) == (2, ScaleReason.MIN)


def test_scaling_down_waits_for_the_delay() -> None:
    history = [Recommendation(990.0, 4)]
    held = _decide(Load(rps=5, last_request_at=999), history=history, now=1000)
    assert (held.replicas, held.reason) == (4, ScaleReason.STABILISING)
    later = _decide(Load(rps=5, last_request_at=1029), history=held.history, now=1021)
    assert later.replicas == 1


def test_scaling_up_is_immediate() -> None:
    history = [Recommendation(999.0, 1)]
    assert _decide(Load(rps=41, last_request_at=999), history=history).replicas == 5


def test_an_idle_service_without_minimum_goes_to_zero_and_a_waiting_request_wakes_it() -> None:
    busy = _decide(Load(rps=0, last_request_at=950), lo=0)
    assert (busy.replicas, busy.reason) == (1, ScaleReason.UNTIL_IDLE)  # not "min_replicas"
    idle = _decide(Load(rps=0, last_request_at=900), lo=0)
    assert (idle.replicas, idle.reason) == (0, ScaleReason.IDLE)
    woken = _decide(Load(rps=0, waiting=1, in_flight=1, last_request_at=1000), lo=0)
    assert (woken.replicas, woken.reason) == (1, ScaleReason.WAKE)


def test_a_new_service_waits_the_idle_time_before_zero() -> None:
    fresh = decide_replicas(RPS, 0, 3, Load(), (), now=30.0, created_at=0.0)
    assert fresh.replicas == 1


def test_queue_metric_counts_requests_in_flight() -> None:
    queue = Autoscaling(metric=ScaleMetric.QUEUE, target=2)
    decision = decide_replicas(queue, 1, 8, Load(in_flight=7, last_request_at=9), (), 10.0, 0.0)
    assert decision.replicas == 4


@given(
    lo=st.integers(0, 10),
    extra=st.integers(0, 10),
    rps=st.floats(0, 1000),
    in_flight=st.integers(0, 100),
    waiting=st.integers(0, 5),
    past=st.lists(st.tuples(st.floats(0, 100), st.integers(0, 30)), max_size=5),
    last=st.one_of(st.none(), st.floats(0, 100)),
)
def test_decisions_stay_within_bounds_and_wake_when_asked(
    lo: int,
    extra: int,
    rps: float,
    in_flight: int,
    waiting: int,
    past: list[tuple[float, int]],
    last: float | None,
) -> None:
    hi = max(1, lo + extra)
    load = Load(rps=rps, in_flight=in_flight + waiting, waiting=waiting, last_request_at=last)
    history = tuple(Recommendation(at, n) for at, n in sorted(past))
    decision = decide_replicas(RPS, lo, hi, load, history, 100.0, 0.0)
    assert lo <= decision.replicas <= hi
    if waiting:
        assert decision.replicas >= 1
    again = decide_replicas(RPS, lo, hi, load, history, 100.0, 0.0)
    assert again == decision  # same input, same decision
