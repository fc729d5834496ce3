"""Each caller's token bucket: a burst at once, then a steady rate; callers apart."""

from __future__ import annotations

import pytest

from hub.core import ratelimit
from hub.core.ratelimit import RateLimits


def test_a_burst_goes_at_once_then_the_rate_and_the_wait_is_said() -> None:
    limits = RateLimits(rate_per_s=4.0, burst=3)
    assert [limits.take("mia", 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.take("mia", 100.0) == pytest.approx(0.25)  # one token refills in 1/4 s
    assert limits.take("olaf", 100.0) == 0.0  # another caller's bucket is full
    assert limits.take("mia", 100.1) == pytest.approx(0.15)  # refused: nothing taken
    assert limits.take("mia", 100.25) == 0.0
    assert limits.take("mia", 200.0) == 0.0  # idle for long: full again, never beyond
    assert [limits.take("mia", 200.0) for _ in range(3)][-1] > 0  # 3 = burst, not more


def test_idle_callers_are_forgotten_once_many_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit, "CALLERS_KEPT", 3)
    limits = RateLimits(rate_per_s=1.0, burst=2)
    for caller in ("a", "b", "c"):
        limits.take(caller, 0.0)
    limits.take("d", 10.0)  # a, b and c are full again by now: forgotten, not refused
    assert len(limits._buckets) == 1
    assert limits.take("d", 10.0) == 0.0 and limits.take("d", 10.0) > 0


def test_a_limit_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError):
        RateLimits(rate_per_s=0.0)
    with pytest.raises(ValueError):
        RateLimits(burst=0)
