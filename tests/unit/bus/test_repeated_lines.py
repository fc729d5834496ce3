"""A warning that comes again and again (a client retrying a refused server twice a second)
is written the first time each text comes, then at most every 30 s, with what it held back."""

from __future__ import annotations

from bus.loglines import RepeatedLines


def test_each_text_once_then_every_period_with_the_count_held_back() -> None:
    lines = RepeatedLines(every_s=30.0)
    assert lines.allow("Authorization Violation", 0.0) == 0
    assert lines.allow("Connection reset by peer", 0.4) == 0  # another text: its own first
    assert lines.allow("Authorization Violation", 0.5) is None
    assert lines.allow("Authorization Violation", 1.0) is None
    assert lines.allow("Connection reset by peer", 1.1) is None
    assert lines.held == 3
    assert lines.allow("Authorization Violation", 30.0) == 2  # 30 s on: said, with the 2
    assert lines.held == 1
