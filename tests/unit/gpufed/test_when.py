"""Times typed on the command line read one way in every command (usage, policy show --at,
replay --start): a time without an offset is UTC whatever the machine's zone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gpufed.when import parse_when

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
