"""How often the hub's per-batch info lines may be written.

A batch of submissions saved, of workloads placed, of workloads finished: at hundreds of
workloads a second each kind was dozens of lines a second, and a line cost the hub's event loop
about 50 µs (a tenth of its CPU per workload). Each kind now writes at most one info line a
second, and says how many items the lines it held back since its last one held; the store
keeps what those lines summarise (the audit log, every workload's history).
"""

from __future__ import annotations

#: Least time between two info lines of one kind.
EVERY_S = 1.0


class LineThrottle:
    """Lets one kind of info line through at most every `every_s` seconds."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self._at = float("-inf")
        self._held = 0

    def allow(self, now: float, items: int) -> int | None:
        """Whether a line of `items` items may be written at `now`: None to hold it back (its
        items are counted), else how many items the lines held back since the last one had."""
        if now - self._at < self.every_s:
            self._held += items
            return None
        held, self._held, self._at = self._held, 0, now
        return held
