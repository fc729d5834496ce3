"""A clock a test moves by hand, for code that takes `clock: Callable[[], float]`."""

from __future__ import annotations


class FakeClock:
    """Starts at `start` (seconds since the epoch) and moves only when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
