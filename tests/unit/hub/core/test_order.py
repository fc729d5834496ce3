"""Who goes first: priority, aging, weighted fair share, then age."""

from __future__ import annotations

import pytest

from hub.core.fairshare import queue_priority
from hub.core.model import Plan, RunningWorkload, Workload
from hub.core.policy import Aging, Policy, PriorityClass, Quota, Team
from tests.unit.hub.core.builders import (
    checked_plan,
    fleet,
    node,
    pending,
    placed,
    running,
    spoke,
)

NOW = 100_000.0
ONE_NODE = fleet(spoke("s1", node("n1", gpus=4)))


def run(
    *queue: Workload,
    policy: Policy | None = None,
    active: tuple[RunningWorkload, ...] = (),
    base: object = ONE_NODE,
) -> Plan:
    return checked_plan(base, queue, active, policy or Policy(), NOW)  # type: ignore[arg-type]


def test_higher_priority_first_even_when_younger() -> None:
    result = run(
        pending("old-batch", at=NOW - 60, cls="batch", gpus=4),
        pending("new-training", at=NOW - 1, cls="training", gpus=4),
    )
    assert set(placed(result)) == {"new-training"}


def test_oldest_first_within_a_team_and_class() -> None:
    result = run(*(pending(f"w{i}", at=NOW - 100 + i, gpus=2) for i in (3, 1, 2, 0)))
    assert set(placed(result)) == {"w0", "w1"}


def test_team_with_the_smaller_share_goes_next() -> None:
    # vision already runs 2 GPUs of a 6-GPU fleet; nlp runs none, so nlp's newer job wins.
    snapshot = fleet(spoke("s1", node("n1", gpus=6)))
    active = (running("r", "s1", {"n1": [0, 1]}, team="vision"),)
    result = run(
        pending("v", at=NOW - 50, team="vision", gpus=4),
        pending("n", at=NOW - 10, team="nlp", gpus=4),
        active=active,
        base=snapshot,
    )
    assert set(placed(result)) == {"n"}


def test_fair_share_alternates_between_teams() -> None:
    snapshot = fleet(spoke("s1", node("n1", gpus=4)))
    queue = [pending(f"v{i}", at=i, team="vision") for i in range(4)]
    queue += [pending(f"n{i}", at=10 + i, team="nlp") for i in range(4)]
    result = run(*queue, base=snapshot)
    assert set(placed(result)) == {"v0", "v1", "n0", "n1"}


def test_weight_gives_a_team_a_larger_share() -> None:
    snapshot = fleet(spoke("s1", node("n1", gpus=8)))
    policy = Policy(teams=(Team("vision", weight=3.0), Team("nlp", weight=1.0)))
    queue = [pending(f"v{i}", at=i, team="vision") for i in range(8)]
    queue += [pending(f"n{i}", at=i, team="nlp") for i in range(8)]
    result = run(*queue, policy=policy, base=snapshot)
    teams = [w[0] for w in placed(result)]
    assert teams.count("v") == 6
    assert teams.count("n") == 2


def test_share_is_measured_above_guarantee() -> None:
    # vision uses 4 GPUs but they are all guaranteed; nlp borrows 2: vision goes first.
    snapshot = fleet(spoke("s1", node("n1", gpus=8)))
    policy = Policy(
        teams=(Team("vision", quotas={"H100": Quota(4)}), Team("nlp", quotas={"H100": Quota(0)}))
    )
    active = (
        running("rv", "s1", {"n1": [0, 1, 2, 3]}, team="vision"),
        running("rn", "s1", {"n1": [4, 5]}, team="nlp"),
    )
    result = run(
        pending("n", at=1, team="nlp", gpus=2),
        pending("v", at=2, team="vision", gpus=2),
        policy=policy,
        active=active,
        base=snapshot,
    )
    assert set(placed(result)) == {"v"}


@pytest.mark.parametrize(
    ("cls", "waited", "expected"),
    [
        ("batch", 0, 100),
        ("batch", 899, 100),
        ("batch", 900, 125),
        ("batch", 9000, 350),  # older batch outranks fresh dev (300)
        ("batch", 10**9, 999),  # never reaches production
        ("training", 10**9, 999),
        ("production", 10**9, 1000),
    ],
)
def test_aging_raises_queue_priority_up_to_just_below_production(
    cls: str, waited: float, expected: int
) -> None:
    policy = Policy()
    assert queue_priority(policy.priority_class(cls), waited, policy) == expected  # type: ignore[arg-type]


def test_aged_batch_goes_before_fresh_dev_but_never_before_production() -> None:
    result = run(
        pending("ancient-batch", at=NOW - 10**7, cls="batch", gpus=4),
        pending("fresh-dev", at=NOW, cls="dev", gpus=4),
    )
    assert set(placed(result)) == {"ancient-batch"}
    result = run(
        pending("ancient-batch", at=NOW - 10**7, cls="batch", gpus=4),
        pending("fresh-prod", at=NOW, cls="production", gpus=4),
    )
    assert set(placed(result)) == {"fresh-prod"}


def test_aging_can_be_turned_off() -> None:
    policy = Policy(aging=Aging(step=0))
    result = run(
        pending("ancient-batch", at=NOW - 10**7, cls="batch", gpus=4),
        pending("fresh-dev", at=NOW, cls="dev", gpus=4),
        policy=policy,
    )
    assert set(placed(result)) == {"fresh-dev"}


def test_aging_never_makes_work_preempt() -> None:
    policy = Policy(
        classes=(PriorityClass("high", 500), PriorityClass("low", 100)),
        aging=Aging(interval_s=1, step=1000),
    )
    active = (running("r", "s1", {"n1": [0, 1, 2, 3]}, team="vision", cls="high"),)
    result = run(
        pending("old-low", at=0, team="vision", cls="low", gpus=4), policy=policy, active=active
    )
    assert result.preemptions == ()
