"""What the hub tells burst: only demand more capacity would serve, of teams that may burst."""

from __future__ import annotations

import dataclasses

from hub.core.demand import unplaceable_demand
from hub.core.model import Reason, Unplaced, Workload
from hub.core.policy import Policy, Team
from schemas import WorkloadSpec


def pending(wid: str, team: str = "vision", at: float = 0.0, **spec: object) -> Workload:
    full = {"name": "w", "team": team, "command": ["true"], "gpu_model": "H100", **spec}
    return Workload(wid, WorkloadSpec.model_validate(full), at)


def test_groups_same_shapes_and_reports_the_oldest_age() -> None:
    work = {
        w.id: w for w in [pending("a", at=10), pending("b", at=40), pending("c", gpus_per_node=8)]
    }
    unplaced = [Unplaced(w, Reason.INSUFFICIENT_FREE, "full") for w in work]
    report = unplaceable_demand(unplaced, work, Policy(), now=100, seq=3)
    shapes = {(i.gpus_per_node, i.count, i.oldest_age_s) for i in report.items}
    assert shapes == {(1, 2, 90.0), (8, 1, 100.0)}
    assert report.seq == 3


def test_limits_preemption_gangs_and_teams_that_may_not_burst_are_left_out() -> None:
    policy = Policy(teams=(Team("vision", may_burst=True), Team("nlp", may_burst=False)))
    work = {
        "limit": pending("limit"),
        "preempt": pending("preempt"),
        "gang": pending("gang", nodes=2, gpus_per_node=8),
        "nlp": pending("nlp", team="nlp"),
        "ok": pending("ok"),
    }
    unplaced = [
        Unplaced("limit", Reason.TEAM_LIMIT, "at its limit"),
        Unplaced("preempt", Reason.WAITING_FOR_PREEMPTION, "victims stopping"),
        Unplaced("gang", Reason.INSUFFICIENT_FREE, "full"),
        Unplaced("nlp", Reason.INSUFFICIENT_FREE, "full"),
        Unplaced("ok", Reason.INSUFFICIENT_FREE, "full"),
    ]
    report = unplaceable_demand(unplaced, work, policy, now=100, seq=1)
    assert [i.workload_ids for i in report.items] == [("ok",)]


def test_work_never_preempted_is_never_sent_to_spot() -> None:
    work = {"p": pending("p", priority_class="production"), "b": pending("b")}
    unplaced = [Unplaced(w, Reason.INSUFFICIENT_FREE, "full") for w in work]
    report = unplaceable_demand(unplaced, work, Policy(), now=1, seq=1)
    assert {i.workload_ids[0]: i.spot_ok for i in report.items} == {"p": False, "b": True}


def test_work_that_ran_before_is_its_own_item_with_its_attained_seconds_per_gpu() -> None:
    # Two GPUs for an hour, then preempted.
    ran = dataclasses.replace(pending("ran", at=0, gpus_per_node=2), attained_gpu_s=7200.0)
    work = {w.id: w for w in [ran, pending("fresh", at=5, gpus_per_node=2)]}
    unplaced = [Unplaced(w, Reason.INSUFFICIENT_FREE, "full") for w in work]
    report = unplaceable_demand(unplaced, work, Policy(), now=100, seq=1)
    assert {i.workload_ids: i.attained_s for i in report.items} == {
        ("ran",): 3600.0,
        ("fresh",): 0.0,
    }
