"""Refused actions, alike ones counted past the first few: what bounds the audit log.

Every refused action is audited (`hub.audit`), and any valid token can ask for refusals as
fast as the hub answers: a script hammering another team's workload, a loop retrying a cancel
that is not found. Of refusals alike (one caller, one action, one team, one result: the key),
the first `listed` in each window of `window_s` are kept one by one; the rest of the window
are held and counted, and summed up in one entry once the window ends (`due`), with a few
of their targets named. Nothing is dropped uncounted: at a stop, `flush` gives what is held.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: Refusals alike kept one by one per window.
LISTED = 10
#: The window, in seconds, from the first refusal of a key.
WINDOW_S = 60.0
#: Targets a summary names (the rest are counted).
TARGETS_NAMED = 5

T = TypeVar("T")


@dataclass
class Held(Generic[T]):
    """The refusals of one window past its first `listed`: the first of them (for the
    summary's who and what), their count, the last one's time and the targets seen."""

    first: T
    count: int
    last_at: float
    targets: list[str] = field(default_factory=list)
    other_targets: int = 0

    def add(self, target: str, now: float) -> None:
        self.count += 1
        self.last_at = now
        if not target or target in self.targets:
            return
        if len(self.targets) < TARGETS_NAMED:
            self.targets.append(target)
        else:
            self.other_targets += 1  # a target seen twice past the named ones counts twice

    def describe(self, result: str, window_s: float) -> str:
        """`12 more denied alike within 60 s of the first, not listed one by one (targets:
        a, b and 3 others)`."""
        text = (
            f"{self.count} more {result} alike within {window_s:g} s of the first, "
            "not listed one by one"
        )
        if self.targets:
            named = ", ".join(self.targets)
            if self.other_targets:
                named += f" and {self.other_targets} other(s)"
            text += f" (targets: {named})"
        return text


@dataclass
class _Window(Generic[T]):
    ends_at: float
    listed: int = 0
    held: Held[T] | None = None


class RefusalThrottle(Generic[T]):
    """Which refusals to keep one by one, and the summaries of the rest (see the module)."""

    def __init__(self, listed: int = LISTED, window_s: float = WINDOW_S) -> None:
        if listed < 1 or window_s <= 0:
            raise ValueError("a refusal throttle lists at least one refusal per window")
        self.listed = listed
        self.window_s = window_s
        self._windows: dict[Hashable, _Window[T]] = {}
        self._ended: list[Held[T]] = []  # windows a later refusal of their key closed

    def admit(self, key: Hashable, item: T, target: str, now: float) -> bool:
        """Whether to keep `item` (a refusal with this `key`) one by one; if not, it is
        counted in its window's summary."""
        window = self._windows.get(key)
        if window is None or now >= window.ends_at:
            if window is not None and window.held is not None:
                self._ended.append(window.held)
            window = self._windows[key] = _Window(now + self.window_s)
        if window.listed < self.listed:
            window.listed += 1
            return True
        if window.held is None:
            window.held = Held(item, 0, now)
        window.held.add(target, now)
        return False

    def next_due(self) -> float | None:
        """When the earliest window ends (None: none open): when `due` next has work."""
        if self._ended:
            return float("-inf")
        return min((w.ends_at for w in self._windows.values()), default=None)

    def due(self, now: float) -> list[Held[T]]:
        """The summaries of the windows ended by `now` (each once); ended windows are
        forgotten."""
        out, self._ended = self._ended, []
        for key, window in list(self._windows.items()):
            if now >= window.ends_at:
                del self._windows[key]
                if window.held is not None:
                    out.append(window.held)
        return out

    def flush(self) -> list[Held[T]]:
        """Every summary held, windows ended or not (at a stop)."""
        out, self._ended = self._ended, []
        out.extend(w.held for w in self._windows.values() if w.held is not None)
        self._windows.clear()
        return out
