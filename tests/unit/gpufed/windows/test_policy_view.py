"""`gpufed policy show --at TIME`: the policy the hub will use then, and until when."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufed.policy_view import policy_in_force
from gpufed.when import parse_when
from hub.policyfile import load_policy, policy_to_dict

POLICY = policy_to_dict(
    load_policy(
        """
teams: [{name: serving, quotas: {H100: {guaranteed: 2}}}]
windows:
  - name: workday
    timezone: America/New_York
    days: weekdays
    start: "09:00"
    end: "17:00"
    teams: {serving: {quotas: {H100: {guaranteed: 6}}}}
"""
    )
)


def test_show_at_a_time_inside_the_window() -> None:
    shown = policy_in_force(POLICY, parse_when("2026-12-01T10:00-05:00", 0.0))
    assert shown["teams"][0]["quotas"]["H100"]["guaranteed"] == 6
    assert shown["in_force"] == {
        "at": "2026-12-01T15:00:00+00:00",
        "window": "workday",
        "until": "2026-12-01T22:00:00+00:00",
    }
    assert "windows" not in shown


def test_show_at_night_and_naive_times_are_utc() -> None:
    shown = policy_in_force(POLICY, parse_when("2026-12-01T03:00", 0.0))
    assert shown["teams"][0]["quotas"]["H100"]["guaranteed"] == 2
    assert shown["in_force"]["window"] is None
    assert shown["in_force"]["until"] == "2026-12-01T14:00:00+00:00"


def test_now_and_epoch_seconds() -> None:
    noon = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()
    assert parse_when("now", noon) == noon
    assert parse_when(str(noon), 0.0) == noon


def test_bad_time_says_what_to_give() -> None:
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_when("tomorrow morning", 0.0)


@pytest.mark.parametrize("text", ["1e20", "inf", "-inf", "nan", "99999999999999"])
def test_a_number_no_calendar_can_name_is_refused_with_the_range(text: str) -> None:
    # `gpufed policy show --at 1e20` used to end in an OverflowError traceback.
    with pytest.raises(ValueError, match="between the years 2 and 9998"):
        policy_in_force(POLICY, parse_when(text, 0.0))


def test_until_skips_a_daylight_saving_shift_that_changes_nothing() -> None:
    # Sunday 2026-03-08 01:30 EST, half an hour before New York's clocks jump: the next change
    # is Monday's 09:00 EDT, not the jump (it used to print 2026-03-08T07:00:00.000xxx+00:00).
    shown = policy_in_force(POLICY, parse_when("2026-03-08T01:30-05:00", 0.0))
    assert shown["in_force"]["until"] == "2026-03-09T13:00:00+00:00"


def test_a_window_in_force_all_week_is_in_force_until_further_notice() -> None:
    always = policy_to_dict(
        load_policy("windows: [{name: always, days: daily, start: '00:00', end: '24:00'}]")
    )
    shown = policy_in_force(always, parse_when("2026-12-01T10:00", 0.0))
    assert shown["in_force"]["window"] == "always"
    assert shown["in_force"]["until"] is None
