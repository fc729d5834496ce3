"""Every workload left pending gets a stable reason code and a sentence to act on."""

from __future__ import annotations

import pytest

from hub.core.model import Reason, Snapshot, Workload
from hub.core.placement import plan
from hub.core.policy import Policy, Quota, Team
from tests.unit.hub.core.builders import check_invariants, fleet, node, pending, spoke, why

POLICY = Policy(
    teams=(
        Team("vision", quotas={"H100": Quota(0, 0)}, may_burst=False),
        Team("nlp", may_burst=True),
    )
)
FLEET = fleet(
    spoke("eu1", node("e1", "A100", free=range(2)), node("e2", "A100", free=[]), region="eu"),
    spoke("us1", node("u1", "L4", gpus=4, ib="true"), region="us"),
    spoke("cloud", node("c1", "H100"), region="us", cloud=True, price=3.0),
)


@pytest.mark.parametrize(
    ("snapshot", "workload", "reason", "message"),
    [
        (fleet(), pending("w"), "no_spokes", "no spoke has reported capacity yet"),
        (
            fleet(spoke("s", node("n"), accepts=False)),
            pending("w"),
            "no_spokes",
            "no spoke accepting work has a schedulable GPU node",
        ),
        (
            FLEET,
            pending("w", required_regions=("ap",)),
            "no_matching_region",
            "no spoke accepting work in region ap (regions: eu, us)",
        ),
        (
            FLEET,
            pending("w", models=("B200",), required_regions=("eu",)),
            "no_matching_model",
            "no schedulable node in region eu has B200 GPUs (models: A100)",
        ),
        (  # a model misspelt is seen as such beside the ones there are
            FLEET,
            pending("w", models=("h100",)),
            "no_matching_model",
            "no schedulable node has h100 GPUs (models: A100, H100, L4)",
        ),
        (
            FLEET,
            pending("w", models=("A100",), required_labels={"ib": "true"}),
            "no_matching_labels",
            "no A100 node has labels ib=true",
        ),
        (
            FLEET,
            pending("w", team="vision", models=("H100",)),
            "burst_not_allowed",
            "only cloud spokes have H100 GPUs and team vision may not burst to the cloud",
        ),
        (
            FLEET,
            pending("w", models=("L4",), gpus=8),
            "shape_never_fits",
            "no node has 8 L4 GPUs (the most on one node is 4)",
        ),
        (
            FLEET,
            pending("w", team="nlp", gpus=16),
            "shape_never_fits",
            "no node has 16 GPUs (the most on one node is 8)",
        ),
        (
            FLEET,
            pending("w", team="nlp", gpus=16, nodes=2),
            "shape_never_fits",
            "no spoke has 2 nodes with 16 GPUs each (the most on one node is 8)",
        ),
        (
            FLEET,
            pending("w", models=("A100",), gpus=8, nodes=3),
            "shape_never_fits",
            "no spoke has 3 nodes with 8 A100 GPUs each (at most 2, on eu1)",
        ),
        (
            FLEET,
            pending("w", models=("A100",), gpus=4, required_regions=("eu",)),
            "insufficient_free",
            "no node in region eu has 4 free A100",
        ),
        (
            FLEET,
            pending("w", models=("A100",), gpus=8, nodes=2),
            "insufficient_free",
            "no spoke has 2 nodes with 8 free A100 each",
        ),
        (
            fleet(spoke("s", node("n", gpus=1, free=[], shared={0: 0.25}))),
            pending("w", team="nlp", fraction=0.5),
            "insufficient_free",
            "no GPU has 0.5 of a device free",
        ),
        (
            FLEET,
            pending("w", team="nlp", cls="gold"),
            "unknown_priority_class",
            "priority class 'gold' is not defined; ask an admin or use a defined one",
        ),
    ],
)
def test_reason_and_message(
    snapshot: Snapshot, workload: Workload, reason: str, message: str
) -> None:
    result = plan(snapshot, [workload], [], POLICY, 0.0)
    check_invariants(snapshot, [workload], [], POLICY, result)
    assert why(result)[workload.id] == (reason, message)


def test_quota_is_named_when_it_is_what_stops_the_work() -> None:
    # H100 capacity exists (cloud) and nlp may burst, but vision's H100 limit is 0.
    policy = Policy(teams=(Team("vision", quotas={"H100": Quota(0, 0)}, may_burst=True),))
    result = plan(FLEET, [pending("w", team="vision", models=("H100",))], [], policy, 0.0)
    assert why(result)["w"] == ("team_limit", "team vision is at its H100 limit 0/0")


def test_reason_codes_are_stable() -> None:
    assert {r.value for r in Reason} == {
        "no_spokes",
        "no_matching_model",
        "no_matching_region",
        "no_matching_labels",
        "burst_not_allowed",
        "reserved_for_other_teams",
        "insufficient_free",
        "shape_never_fits",
        "team_limit",
        "department_limit",
        "guarantee_exhausted",
        "waiting_for_preemption",
        "unknown_priority_class",
        "runtime_refuses",
    }
