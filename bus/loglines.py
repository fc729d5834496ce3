"""How often a line that comes again and again may be written.

The hub's per-batch info lines: a batch of submissions saved, of workloads placed, of
workloads finished: at hundreds of workloads a second each kind was dozens of lines a second,
and a line cost the hub's event loop about 50 µs (a tenth of its CPU per workload). Each kind
writes at most one info line a second, and says how many items the lines it held back since
its last one held; the store keeps what those lines summarise (the audit log, every
workload's history).

A warning that repeats (the NATS client retrying a refused or unreachable server twice a
second, for ever) is written the first time each text comes, then at most every 30 s with how
many were held back (`RepeatedLines`).
"""

from __future__ import annotations

#: Least time between two info lines of one kind.
EVERY_S = 1.0
#: Least time between two warnings of the same text.
REPEAT_EVERY_S = 30.0
#: Texts remembered at once (a stream of ever new texts must not grow memory).
_MAX_TEXTS = 64


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

    @property
    def held(self) -> int:
        """Items held back since the last line let through."""
        return self._held


class RepeatedLines:
    """Warnings that may come again and again: each text let through the first time, then at
    most every `every_s`."""

    def __init__(self, every_s: float = REPEAT_EVERY_S) -> None:
        self.every_s = every_s
        self._lines: dict[str, LineThrottle] = {}

    def allow(self, text: str, now: float) -> int | None:
        """None to hold a warning of `text` back, else how many of that text were held back."""
        lines = self._lines.get(text)
        if lines is None:
            if len(self._lines) >= _MAX_TEXTS:
                self._lines.clear()
            lines = self._lines[text] = LineThrottle(self.every_s)
        return lines.allow(now, 1)

    @property
    def held(self) -> int:
        """Warnings held back, of every text, since each text's last one let through."""
        return sum(lines.held for lines in self._lines.values())
