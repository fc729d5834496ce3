"""Time windows: the policy in force at an instant, and when it next changes.

A `Window` (see `hub.core.policy`) changes priority classes, teams, departments and the default
team on a weekly schedule in a named time zone, e.g. weekdays 08:00-20:00 Europe/Berlin:
inference and dev guarantees up. Everything here is a pure function of the policy and `now`
(seconds since the epoch): the hub and the replay simulator call the same functions.

- `policy_at(policy, now)`: the policy with the first window in force at `now` applied (and no
  windows left), which is what placement decides with.
- `next_change(policy, now)`: the next instant after `now` at which a window starts or ends,
  so the hub can run a cycle there and reclaim under the new guarantees.
- `check_windows(policy)`: what is wrong with the windows (unknown names, a window that would
  make the policy invalid while in force).
- `shadowed(policy, now)`: windows in force at once, where the one listed later does not apply
  (allowed, as the first wins, but seldom what was meant: `gpufed policy set` warns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import date, datetime, time, timedelta

from hub.core.policy import (
    ClassChange,
    Policy,
    PriorityClass,
    Quota,
    Team,
    TeamChange,
    Window,
    check_policy,
)

DAY_S = 86400


def active_window(policy: Policy, now: float) -> Window | None:
    """The first window of `policy` in force at `now`, or None."""
    for window in policy.windows:
        if in_force(window, now):
            return window
    return None


def in_force(window: Window, now: float) -> bool:
    """Whether `window` is in force at `now` (start inclusive, end exclusive)."""
    local = datetime.fromtimestamp(now, window.zone)
    second = local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6
    today, yesterday = local.weekday(), (local.weekday() - 1) % 7
    if window.start_s < window.end_s:
        return today in window.days and window.start_s <= second < window.end_s
    # Past midnight: from start today, or until end if it started yesterday.
    return (today in window.days and second >= window.start_s) or (
        yesterday in window.days and second < window.end_s
    )


def policy_at(policy: Policy, now: float) -> Policy:
    """The policy in force at `now`: the active window's changes applied, no windows left."""
    if not policy.windows:
        return policy
    return apply_window(policy, active_window(policy, now))


def apply_window(policy: Policy, window: Window | None) -> Policy:
    """`policy` with `window`'s changes applied (None: none), without windows.

    Same input, same output: the hub may cache the result per window.
    """
    if window is None:
        return replace(policy, windows=(), window=None)
    return replace(
        policy,
        classes=tuple(_class(c, window.classes.get(c.name)) for c in policy.classes),
        teams=tuple(_team(t, window.teams.get(t.name)) for t in policy.teams),
        departments=tuple(
            replace(d, quotas=_merged(d.quotas, window.departments.get(d.name, {})))
            for d in policy.departments
        ),
        default_team=_team(policy.default_team, window.default_team),
        windows=(),
        window=window.name,
    )


def next_change(policy: Policy, now: float) -> float | None:
    """The first instant after `now` at which a window of `policy` starts or ends; None if none.

    Not every such instant changes the policy (a window may end where another begins); a
    caller that re-plans there simply finds nothing new.
    """
    best: float | None = None
    for window in policy.windows:
        for boundary in _boundaries(window, now):
            if boundary > now and (best is None or boundary < best):
                best = boundary
    return best


def shadowed(policy: Policy, now: float) -> list[tuple[str, str, float, bool]]:
    """(first, later, since, never) for every two windows in force at once in the week from
    `now`: `later` is listed after `first`, so it does not apply there from `since` (the first
    such instant); `never` when `later` applies nowhere in that week. The schedule repeats
    weekly, so a week (and a day for windows past midnight) shows every overlap."""
    found: dict[tuple[str, str], float] = {}
    applies: set[str] = set()
    moment: float | None = now
    while moment is not None and moment <= now + 8 * DAY_S:
        live = [w.name for w in policy.windows if in_force(w, moment)]
        applies.update(live[:1])
        for later in live[1:]:
            found.setdefault((live[0], later), moment)
        moment = next_change(policy, moment)
    return [(first, later, since, later not in applies) for (first, later), since in found.items()]


def check_windows(policy: Policy) -> list[str]:
    """Every problem with `policy.windows`, each as "windows[name]...: what is wrong"."""
    problems: list[str] = []
    seen: set[str] = set()
    classes = {c.name for c in policy.classes}
    teams = {t.name for t in policy.teams}
    departments = {d.name for d in policy.departments}
    for window in policy.windows:
        where = f"windows[{window.name}]"
        if window.name in seen:
            problems.append(f"{where}: defined more than once")
        seen.add(window.name)
        if not window.days:
            problems.append(f"{where}.days: at least one day is needed")
        if not 0 <= window.start_s < DAY_S or not 0 < window.end_s <= DAY_S:
            problems.append(f"{where}: start must be in 00:00-23:59 and end in 00:01-24:00")
        elif window.start_s == window.end_s:
            problems.append(f"{where}: start and end are the same (use 00:00-24:00 for all day)")
        problems += _unknown(f"{where}.priority_classes", window.classes, classes, "class")
        problems += _unknown(f"{where}.teams", window.teams, teams, "team")
        problems += _unknown(f"{where}.departments", window.departments, departments, "department")
        problems += [f"{where}: {p}" for p in check_policy(apply_window(policy, window))]
    return problems


def _class(cls: PriorityClass, change: ClassChange | None) -> PriorityClass:
    if change is None:
        return cls
    return PriorityClass(
        cls.name,
        cls.value if change.value is None else change.value,
        cls.preemptible if change.preemptible is None else change.preemptible,
        cls.may_borrow if change.may_borrow is None else change.may_borrow,
    )


def _team(team: Team, change: TeamChange | None) -> Team:
    if change is None:
        return team
    return replace(
        team,
        quotas=_merged(team.quotas, change.quotas),
        weight=team.weight if change.weight is None else change.weight,
        may_burst=team.may_burst if change.may_burst is None else change.may_burst,
    )


def _merged(quotas: Mapping[str, Quota], changes: Mapping[str, Quota]) -> Mapping[str, Quota]:
    """Quotas model by model: a model the window lists replaces the policy's entry."""
    if not changes:
        return quotas
    return {**quotas, **changes}


def _boundaries(window: Window, now: float) -> list[float]:
    """Instants around `now` (the day before to a week after) where `window` may start or end.

    A wall-clock time maps to one instant per UTC offset, so both readings are listed (in the
    hour skipped or repeated by a daylight-saving change only one of them is real); so are the
    changes of offset themselves, where wall-clock time jumps over or back across a boundary.
    Listing an instant that changes nothing is harmless.
    """
    zone = window.zone
    today = datetime.fromtimestamp(now, zone).date()
    found: list[float] = []
    for offset in range(-1, 9):
        day = today + timedelta(days=offset)
        found += _offset_changes(window, day)
        if day.weekday() not in window.days:
            continue
        found += _instants(window, day, window.start_s)
        end_day = day if window.start_s < window.end_s else day + timedelta(days=1)
        found += _instants(window, end_day, window.end_s)
    return found


def _instants(window: Window, day: date, second: int) -> list[float]:
    """The instants of wall-clock `second` after midnight of `day` in the window's zone."""
    if second >= DAY_S:
        day, second = day + timedelta(days=1), second - DAY_S
    wall = datetime.combine(day, time(second // 3600, second % 3600 // 60, second % 60))
    first = wall.replace(tzinfo=window.zone).timestamp()
    second_reading = wall.replace(tzinfo=window.zone, fold=1).timestamp()
    return [first] if first == second_reading else [first, second_reading]


def _offset_changes(window: Window, day: date) -> list[float]:
    """The instant the zone's UTC offset changes on `day`, if it does (to the millisecond)."""
    zone = window.zone
    lo = datetime.combine(day, time(), zone).timestamp()
    hi = lo + DAY_S
    before = datetime.fromtimestamp(lo, zone).utcoffset()
    if datetime.fromtimestamp(hi, zone).utcoffset() == before:
        return []
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return [hi]


def _unknown(where: str, changes: Mapping[str, object], known: set[str], what: str) -> list[str]:
    return [f"{where}[{name}]: unknown {what} {name!r}" for name in changes if name not in known]
