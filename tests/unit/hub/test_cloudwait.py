"""What a queued workload shows of the burst controllers' word on it (hub.cloudwait)."""

from __future__ import annotations

from hub.cloudwait import VERDICTS_FRESH_S, Verdicts
from schemas.burst import BurstVerdict, BurstVerdicts


def report(provider: str, at: float, *verdicts: tuple[str, str, tuple[str, ...]]) -> BurstVerdicts:
    return BurstVerdicts(
        provider=provider,
        at=at,
        verdicts=tuple(
            BurstVerdict(reason=r, message=m, workload_ids=ids) for r, m, ids in verdicts
        ),
    )


def test_the_latest_report_of_each_provider_is_what_a_workload_shows() -> None:
    verdicts = Verdicts()
    verdicts.update(report("aws", 100.0, ("no_offer", "no catalog offer fits", ("w1", "w2"))))
    verdicts.update(report("local", 101.0, ("team_budget", "team nlp over $5/h", ("w3",))))
    assert verdicts.refused_for("w1", 105.0) == "no catalog offer fits [no_offer]"
    assert verdicts.refused_for("w3", 105.0) == "team nlp over $5/h [team_budget]"
    # aws's next round rents for w1 (no verdict on it) and still refuses w2, for another reason
    verdicts.update(report("aws", 102.0, ("cooldown", "a launch is booting", ("w2",))))
    assert verdicts.refused_for("w1", 105.0) is None
    assert verdicts.refused_for("w2", 105.0) == "a launch is booting [cooldown]"
    assert verdicts.refused_for("w3", 105.0) == "team nlp over $5/h [team_budget]"
    assert verdicts.refused_for("w4", 105.0) is None


def test_a_controller_that_stops_reporting_is_forgotten() -> None:
    verdicts = Verdicts()
    verdicts.update(report("aws", 100.0, ("no_offer", "no catalog offer fits", ("w1",))))
    assert verdicts.refused_for("w1", 100.0 + VERDICTS_FRESH_S) is not None
    assert verdicts.refused_for("w1", 100.1 + VERDICTS_FRESH_S) is None
