"""Spoke leases with an injected clock: who gets work, who is lost, and never for a hub outage."""

from __future__ import annotations

from hub.leases import Leases, SpokeStatus
from hub.records import SpokeRecord

SUSPECT, LOST = 15.0, 120.0


def spoke(sid: str, last_seen: float, lost_at: float | None = None) -> SpokeRecord:
    return SpokeRecord(
        id=sid, region="eu", kind="onprem", first_seen=0.0, last_seen=last_seen, lost_at=lost_at
    )


def hearing(since: float, until: float, every: float = 5.0) -> Leases:
    """Leases of a hub that heard some spoke every `every` s from `since` to `until`."""
    leases = Leases(SUSPECT, LOST)
    t = since
    while t <= until:
        leases.heard(t)
        t += every
    return leases


def test_a_spoke_silent_past_lost_after_is_lost_while_others_are_heard() -> None:
    leases = hearing(0.0, 300.0)
    quiet, chatty = spoke("quiet", last_seen=170.0), spoke("chatty", last_seen=300.0)

    assert leases.expired([quiet, chatty], now=300.0) == [quiet]
    assert leases.expired([spoke("quiet", last_seen=181.0)], now=300.0) == []


def test_a_spoke_already_declared_lost_is_not_declared_again() -> None:
    leases = hearing(0.0, 300.0)
    assert leases.expired([spoke("gone", last_seen=10.0, lost_at=200.0)], now=300.0) == []


def test_nothing_expires_while_the_hub_hears_nobody() -> None:
    leases = hearing(0.0, 100.0)
    # Nobody heard since 100 s: the hub, not the spokes, was cut off.
    assert leases.expired([spoke("a", last_seen=100.0)], now=400.0) == []


def test_nothing_expires_until_lost_after_has_passed_since_the_hub_heard_again() -> None:
    leases = hearing(0.0, 50.0)
    leases.expired([], now=400.0)  # the outage: nobody heard for long
    for t in range(400, 501, 5):
        leases.heard(float(t))
    silent = spoke("silent", last_seen=50.0)

    assert leases.expired([silent], now=500.0) == []  # heard again only 100 s ago
    for t in range(505, 521, 5):
        leases.heard(float(t))
    assert leases.expired([silent], now=520.0) == [silent]


def test_nothing_expires_while_the_bus_is_disconnected() -> None:
    leases = hearing(0.0, 300.0)
    assert leases.expired([spoke("a", last_seen=0.0)], now=300.0, connected=False) == []


def test_status_and_new_work_follow_the_age_of_the_last_report() -> None:
    leases = Leases(SUSPECT, LOST)
    s = spoke("a", last_seen=100.0)

    assert leases.status(s, now=110.0) is SpokeStatus.READY
    assert leases.status(s, now=116.0) is SpokeStatus.SUSPECT
    assert leases.status(s, now=221.0) is SpokeStatus.LOST
    assert leases.accepts_work(s, now=110.0)
    assert not leases.accepts_work(s, now=116.0)
    assert not leases.accepts_work(None, now=110.0)


def test_a_spoke_that_refused_for_its_own_state_gets_work_again_once_it_reports() -> None:
    leases = Leases(SUSPECT, LOST)
    s = spoke("a", last_seen=100.0)
    leases.refused("a", 101.0)  # fenced: it had not heard the hub's acks

    assert not leases.accepts_work(s, now=102.0)
    assert leases.accepts_work(spoke("b", last_seen=100.0), now=102.0)
    s.last_seen = 103.0  # its next report
    assert leases.accepts_work(s, now=104.0)
