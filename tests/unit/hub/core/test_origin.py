"""Which burst-only labels a capacity report may claim."""

from __future__ import annotations

import pytest

from hub.core.origin import forged_burst_labels
from schemas.burst import InstanceEvent, InstanceState, Market
from schemas.capacity import CapacityReport

pytestmark = pytest.mark.security


def report(spoke_id: str, **labels: str) -> CapacityReport:
    return CapacityReport(
        spoke_id=spoke_id, region="us-east-1", incarnation="i", seq=1, sent_at=0.0, labels=labels
    )


def instance(burst_id: str, team: str) -> InstanceEvent:
    return InstanceEvent(
        burst_id=burst_id,
        provider="local",
        instance_type="p5.48xlarge",
        region="us-east-1",
        market=Market.SPOT,
        price_per_hour=45.0,
        team=team,
        state=InstanceState.RUNNING,
        spoke_id=burst_id,
        at=0.0,
    )


def test_an_onprem_spoke_may_not_reserve_itself_for_a_team() -> None:
    assert forged_burst_labels(report("eu-1", **{"burst-team": "vision"}), None) == ("burst-team",)


def test_a_burst_spoke_may_carry_the_team_it_was_rented_for_only() -> None:
    rented = instance("burst-1-0-ab", "vision")
    assert forged_burst_labels(report("burst-1-0-ab", **{"burst-team": "vision"}), rented) == ()
    assert forged_burst_labels(report("burst-1-0-ab", **{"burst-team": "nlp"}), rented) == (
        "burst-team",
    )


def test_ordinary_labels_are_anyones() -> None:
    assert forged_burst_labels(report("eu-1", rack="r1", zone="a"), None) == ()
