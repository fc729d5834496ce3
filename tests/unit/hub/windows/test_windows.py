"""Time windows: which window is in force when, what it changes, when the policy next changes."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.policy import Quota
from hub.core.windows import active_window, next_change, policy_at, shadowed
from hub.policyfile import PolicyError, load_policy, policy_from_dict, policy_to_dict

BERLIN = ZoneInfo("Europe/Berlin")

DAY_AND_NIGHT = """
priority_classes:
  - {name: production, value: 1000, preemptible: false, may_borrow: false}
  - {name: training, value: 500}
  - {name: dev, value: 300}
teams:
  - name: serving
    quotas: {H100: {guaranteed: 2, limit: 8}}
  - name: research
    quotas: {H100: {guaranteed: 6}, A100: {guaranteed: 4}}
windows:
  - name: workday
    timezone: Europe/Berlin
    days: weekdays
    start: 08:00
    end: 20:00
    priority_classes: {dev: {value: 600}}
    teams:
      serving: {quotas: {H100: {guaranteed: 6, limit: 8}}}
      research: {quotas: {H100: {guaranteed: 2}}, weight: 3}
  - name: late
    timezone: Europe/Berlin
    days: [fri]
    start: "22:00"
    end: "02:00"
    teams: {research: {may_burst: true}}
"""


def at(year: int, month: int, day: int, hour: int, minute: int = 0, second: int = 0) -> float:
    """An instant given in Berlin wall-clock time."""
    return datetime(year, month, day, hour, minute, second, tzinfo=BERLIN).timestamp()


def window_name(text: str, instant: float) -> str | None:
    window = active_window(load_policy(text), instant)
    return window.name if window is not None else None


@pytest.mark.parametrize(
    ("instant", "expected"),
    [
        (at(2026, 11, 30, 7, 59, 59), None),  # Monday, just before
        (at(2026, 11, 30, 8, 0, 0), "workday"),  # start is inclusive
        (at(2026, 11, 30, 19, 59, 59), "workday"),
        (at(2026, 11, 30, 20, 0, 0), None),  # end is exclusive
        (at(2026, 12, 5, 12, 0), None),  # Saturday
        (at(2026, 12, 4, 23, 0), "late"),  # Friday night
        (at(2026, 12, 5, 1, 59), "late"),  # past midnight, started Friday
        (at(2026, 12, 5, 2, 0), None),
        (at(2026, 12, 1, 1, 0), None),  # Tuesday 01:00: no window started Monday night
        # Wall-clock hours hold across daylight saving: summer and winter, 08:00 local.
        (at(2026, 7, 6, 8, 0), "workday"),
        (at(2026, 3, 30, 8, 0), "workday"),  # the Monday after the spring change
    ],
)
def test_window_in_force_by_wall_clock_time(instant: float, expected: str | None) -> None:
    assert window_name(DAY_AND_NIGHT, instant) == expected


def test_policy_at_applies_the_window_and_leaves_the_rest() -> None:
    policy = load_policy(DAY_AND_NIGHT)
    day = policy_at(policy, at(2026, 11, 30, 9))
    assert day.window == "workday" and day.windows == ()
    assert day.team("serving").quotas["H100"] == Quota(6, 8)
    research = day.team("research")
    # Model by model: the window's H100 entry replaces the policy's, A100 stays.
    assert research.quotas == {"H100": Quota(2, None), "A100": Quota(4, None)}
    assert research.weight == 3
    assert day.priority("dev") == 600 and day.priority("training") == 500
    night = policy_at(policy, at(2026, 11, 30, 21))
    assert night.window is None
    assert night.team("serving").quotas["H100"] == Quota(2, 8)
    assert night.priority("dev") == 300


def test_next_change_is_the_next_boundary_in_the_zone() -> None:
    policy = load_policy(DAY_AND_NIGHT)
    assert next_change(policy, at(2026, 11, 30, 7)) == at(2026, 11, 30, 8)
    assert next_change(policy, at(2026, 11, 30, 8)) == at(2026, 11, 30, 20)
    # Friday 20:00 ends the workday; 22:00 starts the late window; Saturday 02:00 ends it;
    # then nothing until Monday 08:00.
    assert next_change(policy, at(2026, 12, 4, 20)) == at(2026, 12, 4, 22)
    assert next_change(policy, at(2026, 12, 4, 23)) == at(2026, 12, 5, 2)
    assert next_change(policy, at(2026, 12, 5, 2)) == at(2026, 12, 7, 8)
    assert next_change(load_policy("teams: []"), at(2026, 12, 5, 2)) is None


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1.7e9, max_value=1.9e9))
def test_nothing_changes_before_next_change(instant: float) -> None:
    """Property: the window in force stays the same from `now` until just before next_change,
    and next_change is never more than a week away."""
    policy = load_policy(DAY_AND_NIGHT)
    change = next_change(policy, instant)
    assert change is not None and instant < change <= instant + 7 * 86400
    before = active_window(policy, instant)
    for probe in (instant + (change - instant) * f for f in (0.25, 0.5, 0.75)):
        assert active_window(policy, probe) == before
    assert active_window(policy, change - 1e-3) == before


def test_round_trip_through_dict_form() -> None:
    policy = load_policy(DAY_AND_NIGHT)
    assert policy_from_dict(policy_to_dict(policy)) == policy
    assert policy_to_dict(policy)["windows"][0]["start"] == "08:00"


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ("{name: w, timezone: Europe/Berln}", "windows[w].timezone: unknown time zone"),
        ("{name: w, start: '25:00'}", "windows[w].start: expected a time HH:MM"),
        ("{name: w, days: [mon, funday]}", "windows[w].days[1]: expected mon..sun"),
        ("{name: w, start: '08:00', end: '08:00'}", "start and end are the same"),
        ("{name: w, teams: {nobody: {weight: 2}}}", "windows[w].teams[nobody]: unknown team"),
        (
            "{name: w, priority_classes: {production: {preemptible: true}}}",
            "windows[w]: priority_classes[production].preemptible: production work is never",
        ),
        (
            "{name: w, teams: {serving: {quotas: {H100: {guaranteed: 9, limit: 8}}}}}",
            "windows[w]: teams[serving].quotas[H100].limit: 8 is below the guaranteed 9",
        ),
        ("{name: w, frobnicate: 1}", "frobnicate"),
    ],
)
def test_bad_windows_are_refused_naming_the_field(window: str, message: str) -> None:
    text = (
        "teams: [{name: serving, quotas: {H100: {guaranteed: 2, limit: 8}}}]\n"
        f"windows: [{window}]\n"
    )
    with pytest.raises(PolicyError) as error:
        load_policy(text)
    assert message in str(error.value)


def test_first_window_listed_wins_where_windows_overlap() -> None:
    text = """
teams: [{name: a, quotas: {H100: {guaranteed: 1}}}]
windows:
  - {name: first, start: "00:00", end: "12:00", teams: {a: {quotas: {H100: {guaranteed: 3}}}}}
  - {name: second, teams: {a: {quotas: {H100: {guaranteed: 5}}}}}
"""
    policy = load_policy(text)
    morning = datetime(2026, 11, 30, 9, tzinfo=UTC).timestamp()
    evening = datetime(2026, 11, 30, 15, tzinfo=UTC).timestamp()
    assert policy_at(policy, morning).team("a").quotas["H100"].guaranteed == 3
    assert policy_at(policy, evening).team("a").quotas["H100"].guaranteed == 5


DST_WINDOW = """
windows:
  - {name: small-hours, timezone: Europe/Berlin, start: "02:15", end: "02:45"}
"""


@pytest.mark.parametrize(
    "day",
    [
        datetime(2026, 3, 29, tzinfo=BERLIN),  # 02:00 -> 03:00: the window's hour never happens
        datetime(2026, 10, 25, tzinfo=BERLIN),  # 03:00 -> 02:00: it happens twice
    ],
)
def test_next_change_holds_across_daylight_saving_changes(day: datetime) -> None:
    """Every minute of the change day: the window in force stays the same until next_change."""
    policy = load_policy(DST_WINDOW)
    start = day.timestamp()
    for minute in range(0, 24 * 60, 1):
        instant = start + minute * 60.0 + 7.0
        change = next_change(policy, instant)
        assert change is not None
        before = active_window(policy, instant)
        step = instant
        while step < change - 1.0:
            assert active_window(policy, step) == before, (minute, step)
            step += 60.0
        assert active_window(policy, change - 1e-3) == before


OVERLAPPING = """
teams: [{name: serving}]
windows:
  - {name: workday, timezone: Europe/Berlin, days: weekdays, start: "08:00", end: "20:00"}
  - {name: evening, timezone: Europe/Berlin, days: daily, start: "18:00", end: "23:00"}
  - {name: always, timezone: UTC, start: "00:00", end: "24:00"}
  - {name: weekend, timezone: UTC, days: weekends, start: "10:00", end: "12:00"}
"""


def test_windows_in_force_at_once_are_found_with_the_first_instant_and_the_never_applying() -> None:
    sunday_noon = at(2026, 12, 6, 12)
    assert shadowed(load_policy(DAY_AND_NIGHT), sunday_noon) == []
    found = {
        (a, b): (since, never)
        for a, b, since, never in shadowed(load_policy(OVERLAPPING), sunday_noon)
    }
    assert found == {
        # Monday 18:00 Berlin: the first weekday evening (Sunday's evening is evening's alone)
        ("workday", "evening"): (at(2026, 12, 7, 18), False),
        ("evening", "always"): (sunday_noon + 6 * 3600, False),
        ("workday", "always"): (at(2026, 12, 7, 8), False),
        ("always", "weekend"): (sunday_noon, True),  # Sunday 10:00-12:00 UTC, in force now
    }
