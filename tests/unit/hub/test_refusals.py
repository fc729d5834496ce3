"""The refusal throttle: alike refusals past the first few of a window are counted, not lost."""

from __future__ import annotations

import pytest

from hub.core.refusals import TARGETS_NAMED, RefusalThrottle


def test_the_first_few_of_a_window_pass_and_the_rest_are_summed_once_it_ends() -> None:
    throttle = RefusalThrottle[str](listed=3, window_s=60.0)
    kept = [throttle.admit("mia cancel", f"r{i}", f"w{i % 2}", 100.0 + i) for i in range(10)]
    assert kept == [True] * 3 + [False] * 7
    assert throttle.next_due() == 160.0
    assert throttle.due(159.9) == []  # the window has not ended
    (held,) = throttle.due(160.0)
    assert (held.first, held.count, held.last_at) == ("r3", 7, 109.0)
    assert held.targets == ["w1", "w0"]
    assert held.describe("denied", 60.0) == (
        "7 more denied alike within 60 s of the first, not listed one by one (targets: w1, w0)"
    )
    assert throttle.due(200.0) == [] and throttle.next_due() is None  # summed once, forgotten
    assert throttle.admit("mia cancel", "again", "w0", 300.0)  # a new window lists again


def test_keys_are_counted_apart() -> None:
    throttle = RefusalThrottle[str](listed=1, window_s=10.0)
    assert throttle.admit("a", "a1", "", 0.0) and throttle.admit("b", "b1", "", 0.0)
    assert not throttle.admit("a", "a2", "", 1.0)
    assert [h.first for h in throttle.due(10.0)] == ["a2"]


def test_a_window_a_later_refusal_closes_is_still_summed() -> None:
    throttle = RefusalThrottle[str](listed=1, window_s=10.0)
    throttle.admit("k", "1", "", 0.0)
    throttle.admit("k", "2", "", 5.0)
    assert throttle.admit("k", "3", "", 11.0)  # the next window, before any `due`
    assert throttle.next_due() == float("-inf")
    assert [(h.first, h.count) for h in throttle.due(11.0)] == [("2", 1)]


def test_many_targets_are_named_up_to_a_few_and_counted() -> None:
    throttle = RefusalThrottle[str](listed=1, window_s=10.0)
    for i in range(TARGETS_NAMED + 4):
        throttle.admit("k", str(i), f"w{i}", 0.0)
    (held,) = throttle.flush()  # at a stop: every window's, ended or not
    assert held.count == TARGETS_NAMED + 3
    assert held.describe("not_found", 10.0).endswith("(targets: w1, w2, w3, w4, w5 and 3 other(s))")
    assert throttle.flush() == []


def test_a_throttle_must_list_something() -> None:
    with pytest.raises(ValueError):
        RefusalThrottle[str](listed=0)
