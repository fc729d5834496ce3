"""The restart schedule of `gpufed up`: doubles per crash in a row, stops at the cap, resets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufed.backoff import Backoff, crashes_in_a_row, restart_delay
from gpufed.up import RESTART_BACKOFF


def test_gpufed_up_waits_half_a_second_doubling_to_ten() -> None:
    delays = [restart_delay(RESTART_BACKOFF, n) for n in range(1, 9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


@given(st.integers(min_value=1, max_value=10_000))
def test_never_gives_up_and_never_waits_past_the_cap(crashes: int) -> None:
    delay = restart_delay(RESTART_BACKOFF, crashes)
    assert RESTART_BACKOFF.base_s <= delay <= RESTART_BACKOFF.cap_s


@given(st.integers(min_value=1, max_value=200))
def test_one_more_crash_never_waits_less(crashes: int) -> None:
    backoff = Backoff(base_s=0.1, cap_s=30.0)
    assert restart_delay(backoff, crashes + 1) >= restart_delay(backoff, crashes)


@pytest.mark.parametrize(
    ("previous", "up_for_s", "expected"),
    [
        (0, 0.0, 1),  # first crash
        (3, 5.0, 4),  # died again soon: one more in a row
        (7, 59.9, 8),
        (7, 60.0, 1),  # stayed up a minute: counted afresh
        (7, 3600.0, 1),
    ],
)
def test_crashes_in_a_row_reset_after_a_piece_stayed_up(
    previous: int, up_for_s: float, expected: int
) -> None:
    assert crashes_in_a_row(RESTART_BACKOFF, previous, up_for_s) == expected


def test_a_piece_that_stayed_up_restarts_after_the_shortest_wait_again() -> None:
    crashes = 0
    for _ in range(10):
        crashes = crashes_in_a_row(RESTART_BACKOFF, crashes, up_for_s=1.0)
    assert restart_delay(RESTART_BACKOFF, crashes) == RESTART_BACKOFF.cap_s
    crashes = crashes_in_a_row(RESTART_BACKOFF, crashes, up_for_s=120.0)
    assert restart_delay(RESTART_BACKOFF, crashes) == RESTART_BACKOFF.base_s


@pytest.mark.parametrize("bad", [{"base_s": 0}, {"base_s": 5, "cap_s": 1}, {"reset_after_s": -1}])
def test_a_schedule_that_makes_no_sense_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="base_s"):
        Backoff(**bad)


def test_zero_crashes_has_no_delay_to_ask_for() -> None:
    with pytest.raises(ValueError, match="crashes"):
        restart_delay(RESTART_BACKOFF, 0)
