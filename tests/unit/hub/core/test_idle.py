"""hub.core.idle: when a session is culled or stopped, and idle GPUs flagged or reclaimed."""

from __future__ import annotations

import pytest

from hub.core.idle import (
    Activity,
    IdleRules,
    SessionRules,
    Watched,
    decide,
    describe_duration,
    flagged,
    track,
)
from hub.core.lifecycle import EndReason, Retry
from schemas import Phase, WorkloadKind

NOW = 100_000.0
SESSION, JOB = WorkloadKind.SESSION, WorkloadKind.JOB


def watched(
    kind: WorkloadKind = SESSION,
    cls: str = "dev",
    ran_s: float = 3600.0,
    gpu_idle_s: float | None = None,
    quiet_s: float | None = None,
    preemptible: bool = True,
) -> Watched:
    activity = Activity(
        None if gpu_idle_s is None else NOW - gpu_idle_s,
        None if quiet_s is None else NOW - quiet_s,
    )
    return Watched("w", kind, cls, NOW - ran_s, activity, preemptible)


CULL = SessionRules(idle_after_s=1800.0, max_lifetime_s=12 * 3600.0)
RECLAIM = IdleRules(reclaim_after_s=3600.0, reclaim_classes=("dev",))


@pytest.mark.parametrize(
    ("w", "sessions", "idle", "expected"),
    [
        # culled only when both the GPUs and the port have been idle long enough
        (watched(gpu_idle_s=1800, quiet_s=1800), CULL, IdleRules(), EndReason.IDLE_CULLED),
        (watched(gpu_idle_s=1800, quiet_s=1799), CULL, IdleRules(), None),
        (watched(gpu_idle_s=1799, quiet_s=9999), CULL, IdleRules(), None),
        (watched(gpu_idle_s=None, quiet_s=9999), CULL, IdleRules(), None),  # GPUs busy
        (watched(gpu_idle_s=9999, quiet_s=None), CULL, IdleRules(), None),  # port unknown
        (watched(gpu_idle_s=9999, quiet_s=9999), SessionRules(), IdleRules(), None),  # off
        (watched(JOB, gpu_idle_s=9999, quiet_s=9999), CULL, IdleRules(), None),  # not a session
        # the maximum lifetime, however busy
        (watched(ran_s=12 * 3600), CULL, IdleRules(), EndReason.MAX_LIFETIME),
        (watched(ran_s=12 * 3600 - 1), CULL, IdleRules(), None),
        (watched(JOB, ran_s=99 * 3600), CULL, IdleRules(), None),
        # reclaim: sessions and the listed classes, never production
        (watched(JOB, "dev", gpu_idle_s=3600), SessionRules(), RECLAIM, EndReason.IDLE_RECLAIMED),
        (watched(JOB, "dev", gpu_idle_s=3599), SessionRules(), RECLAIM, None),
        (watched(JOB, "training", gpu_idle_s=9999), SessionRules(), RECLAIM, None),
        (watched(SESSION, "training", gpu_idle_s=3600), SessionRules(), RECLAIM,
         EndReason.IDLE_RECLAIMED),
        (watched(JOB, "dev", gpu_idle_s=9999), SessionRules(), IdleRules(), None),  # off
        (watched(SESSION, "production", ran_s=99 * 3600, gpu_idle_s=9999, quiet_s=9999,
                 preemptible=False), CULL, RECLAIM, None),
    ],
)  # fmt: skip
def test_what_is_stopped_and_why(
    w: Watched, sessions: SessionRules, idle: IdleRules, expected: EndReason | None
) -> None:
    stops = decide([w], sessions, idle, NOW)
    assert [s.reason for s in stops] == ([] if expected is None else [expected])


def test_the_notice_says_what_was_idle_and_which_policy_stopped_it() -> None:
    [stop] = decide([watched(gpu_idle_s=2000, quiet_s=1900)], CULL, IdleRules(), NOW)
    assert stop.message == (
        "session culled: GPUs under 5 % and no traffic on its port for 31m "
        "(policy sessions.idle_after 30m)"
    )
    [stop] = decide([watched(JOB, gpu_idle_s=5400)], SessionRules(), RECLAIM, NOW)
    assert stop.message == (
        "GPUs reclaimed: under 5 % busy for 1h30m (policy idle.reclaim_after 1h00m)"
    )


def test_tracking_keeps_an_unbroken_idle_stretch_and_a_busy_reading_breaks_it() -> None:
    first = track(None, 2.0, 10.0, 5.0, NOW)
    assert first == Activity(gpu_idle_since=NOW, quiet_since=NOW - 10)
    later = track(first, 1.0, 0.0, 5.0, NOW + 60)
    assert later.gpu_idle_since == NOW  # still the same stretch
    assert later.quiet_since == NOW + 60  # traffic just now
    busy = track(later, 50.0, 0.0, 5.0, NOW + 61)
    assert busy.gpu_idle_since is None
    assert track(busy, 0.0, None, 5.0, NOW + 62).gpu_idle_since == NOW + 62
    assert track(None, None, None, 5.0, NOW) == Activity()  # nothing measured: nothing idle


def test_flagged_once_past_the_flag_time() -> None:
    activities = {
        "long": Activity(gpu_idle_since=NOW - 601),
        "short": Activity(gpu_idle_since=NOW - 599),
        "busy": Activity(),
    }
    assert flagged(activities, IdleRules(flag_after_s=600.0), NOW) == {"long": 601.0}


def test_ends_for_idleness_are_final_and_not_the_users_cancel() -> None:
    for reason in (EndReason.IDLE_CULLED, EndReason.MAX_LIFETIME, EndReason.IDLE_RECLAIMED):
        assert (reason.phase, reason.retry) == (Phase.CANCELLED, Retry.NEVER)


@pytest.mark.parametrize(
    ("seconds", "text"), [(45, "45s"), (60, "1m"), (840, "14m"), (3600, "1h00m"), (7500, "2h05m")]
)
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert describe_duration(seconds) == text
