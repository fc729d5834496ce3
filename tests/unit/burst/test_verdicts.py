"""What the burst controller tells the hub of the work it rents nothing for: never more than
the message's bounds, so a long reason or many skips cannot fail a planning round."""

from __future__ import annotations

from burst.core.model import BurstPlan, Skip, SkipReason
from burst.verdicts import MAX_MESSAGE, verdicts_of
from schemas.burst import MAX_WORKLOAD_IDS, DemandItem


def skip(reason: SkipReason, message: str, ids: tuple[str, ...]) -> Skip:
    item = DemandItem(team="nlp", count=max(1, len(ids)), oldest_age_s=90.0, workload_ids=ids[:256])
    return Skip(item, reason, message, len(ids), ids)


def test_long_reasons_and_many_workloads_are_cut_to_the_messages_bounds() -> None:
    many = tuple(f"w{i}" for i in range(300))
    plan = BurstPlan(
        skipped=(
            skip(SkipReason.NO_OFFER, "no catalog offer fits " + "x" * 1000, many),
            skip(SkipReason.COVERED, "instances already launched", ("w9",)),  # cloud_instance
            skip(SkipReason.TEAM_BUDGET, "team nlp over $5/h", ()),  # counted, none named
        )
    )
    [said] = verdicts_of(plan)
    assert said.reason == "no_offer"
    assert len(said.message) == MAX_MESSAGE and said.message.startswith("no catalog offer")
    assert said.workload_ids == many[:MAX_WORKLOAD_IDS]
