"""Times typed on the command line read one way in every command (usage, policy show --at,
replay --start): a time without an offset is UTC whatever the machine's zone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gpufed.when import parse_duration, parse_when

NOON = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()


@pytest.fixture(autouse=True)
def _new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "America/New_York")  # a machine whose zone is not UTC
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        ("now", NOON),
        ("2h", NOON - 7200),
        ("7d", NOON - 7 * 86400),
        (str(NOON - 60), NOON - 60),
        ("2026-12-01T09:00", NOON - 3 * 3600),
        ("2026-12-01", NOON - 12 * 3600),
        ("2026-12-01T09:00-05:00", NOON + 2 * 3600),
    ],
)
def test_each_form_and_a_time_without_offset_is_utc(text: str, instant: float) -> None:
    assert parse_when(text, NOON) == instant


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tomorrow morning", "cannot read the time 'tomorrow morning'"),
        ("1e20", "not between the years 2 and 9998"),
        ("nan", "not between the years 2 and 9998"),
    ],
)
def test_what_cannot_be_a_time_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_when(text, NOON)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("86400", 86400.0), ("90m", 5400.0), ("12h", 43200.0), ("30d", 2592000.0), ("1.5w", 907200.0)],
)
def test_a_length_of_time_is_seconds_or_an_age_form(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5", "-2h", "0d", "soon", "", "nan", "inf", "1e999"])
def test_a_length_of_time_that_is_not_more_than_zero_is_refused_in_words(text: str) -> None:
    with pytest.raises(ValueError, match=r"give seconds more than 0, or 90m, 12h, 30d, 1w"):
        parse_duration(text)
