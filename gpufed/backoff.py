"""When to start again a piece that died: exponential back-off with a short cap.

As Kubernetes' CrashLoopBackOff: the first restart waits `base_s`, each crash in a row doubles
the wait up to `cap_s`, and a piece that stayed up `reset_after_s` starts the count afresh.
It never gives up. Pure functions: the supervisor passes the clock's readings in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.5
    cap_s: float = 10.0
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s or self.reset_after_s < 0:
            raise ValueError(f"want 0 < base_s <= cap_s and reset_after_s >= 0: {self}")


def crashes_in_a_row(backoff: Backoff, previous: int, up_for_s: float) -> int:
    """The crash count after a piece died having run `up_for_s` since its last start."""
    return 1 if up_for_s >= backoff.reset_after_s else previous + 1


def restart_delay(backoff: Backoff, crashes: int) -> float:
    """Seconds to wait before the next start after `crashes` (>= 1) crashes in a row."""
    if crashes < 1:
        raise ValueError(f"crashes must be >= 1, got {crashes}")
    # Doubling stops at the cap; bounding the exponent keeps 2**n finite however long it runs.
    steps = min(crashes - 1, 64)
    return min(backoff.cap_s, backoff.base_s * 2.0**steps)
