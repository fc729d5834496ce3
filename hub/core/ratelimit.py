"""Requests per caller: a token bucket each, so one caller cannot crowd out the others.

The API runs in the hub's process, beside the scheduling cycle: a script polling
`GET /v1/workloads` in a tight loop, or submitting one workload a request as fast as the hub
answers, takes the hub's time from every other team and from placement. Each caller (one
identity: a user and how it authenticated) may make `burst` requests at once and `rate_per_s`
a second after that; past that a request is refused with the wait after which one would be
taken. Admins are not limited (as Kubernetes exempts its cluster admins from API priority and
fairness): the platform team must be able to act while a tenant misbehaves.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

#: Requests a second a caller may make, sustained.
RATE_PER_S = 20.0
#: Requests a caller may make at once (a full bucket).
BURST = 200
#: Callers remembered at most; past that the idle ones (full buckets) are forgotten.
CALLERS_KEPT = 10_000


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class RateLimits:
    """The callers' buckets (see the module)."""

    def __init__(self, rate_per_s: float = RATE_PER_S, burst: int = BURST) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a rate limit takes a positive rate and a burst of at least 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._buckets: dict[Hashable, _Bucket] = {}

    def take(self, caller: Hashable, now: float) -> float:
        """Take one request for `caller` at `now`: 0.0 when it may go ahead, else how many
        seconds until it could (nothing is taken then)."""
        bucket = self._buckets.get(caller)
        if bucket is None:
            if len(self._buckets) >= CALLERS_KEPT:
                self._forget_idle(now)
            bucket = self._buckets[caller] = _Bucket(float(self.burst), now)
        else:
            elapsed = max(0.0, now - bucket.at)
            bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate_per_s)
            bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate_per_s

    def _forget_idle(self, now: float) -> None:
        full_after = self.burst / self.rate_per_s
        for caller, bucket in list(self._buckets.items()):
            if now - bucket.at >= full_after:
                del self._buckets[caller]
