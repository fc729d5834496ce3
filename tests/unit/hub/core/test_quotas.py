"""Admission: guarantees, limits, departments, borrowing and unknown teams or classes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.model import Plan, RunningWorkload, Workload
from hub.core.policy import Department, Policy, PriorityClass, Quota, Team
from hub.core.quotas import Ledger
from tests.unit.hub.core.builders import (
    checked_plan,
    fleet,
    node,
    pending,
    placed,
    running,
    spoke,
    why,
)

NOW = 10_000.0
BIG = fleet(spoke("s1", *(node(f"h{i}") for i in range(4)), node("a1", "A100")))


def run(
    policy: Policy,
    *queue: Workload,
    active: tuple[RunningWorkload, ...] = (),
) -> Plan:
    return checked_plan(BIG, queue, active, policy, NOW)


def team(name: str, guaranteed: float = 0, limit: float | None = None, **kw: object) -> Team:
    return Team(name, quotas={"H100": Quota(guaranteed, limit)}, **kw)  # type: ignore[arg-type]


def test_no_teams_means_no_quotas() -> None:
    result = run(Policy(), *(pending(f"w{i}", at=i, cls="production", gpus=8) for i in range(4)))
    assert len(result.placements) == 4


@pytest.mark.parametrize(
    ("limit", "used", "gpus", "placed_ok", "message"),
    [
        (16, 8, 8, True, ""),
        (16, 16, 1, False, "team vision is at its H100 limit 16/16"),
        (16, 12, 8, False, "team vision would pass its H100 limit: 12/16 in use, needs 8 more"),
        (None, 24, 8, True, ""),  # no limit: borrow what is idle
    ],
)
def test_team_limit(
    limit: float | None, used: int, gpus: int, placed_ok: bool, message: str
) -> None:
    policy = Policy(teams=(team("vision", 0, limit),))
    active = _occupying("vision", used)
    result = run(policy, pending("w", gpus=gpus, models=("H100",)), active=active)
    if placed_ok:
        assert "w" in placed(result)
    else:
        assert why(result)["w"] == ("team_limit", message)


def test_limit_counts_work_placed_earlier_in_the_same_plan() -> None:
    policy = Policy(teams=(team("vision", 0, 12),))
    result = run(policy, *(pending(f"w{i}", at=i, gpus=4, models=("H100",)) for i in range(4)))
    assert len(result.placements) == 3
    assert why(result)["w3"] == ("team_limit", "team vision is at its H100 limit 12/12")


def test_fractions_count_as_their_share() -> None:
    policy = Policy(teams=(team("vision", 0, 1),))
    result = run(
        policy, *(pending(f"w{i}", at=i, fraction=0.5, models=("H100",)) for i in range(3))
    )
    assert len(result.placements) == 2
    assert why(result)["w2"][0] == "team_limit"


def test_limit_on_one_model_leaves_another_acceptable_model() -> None:
    policy = Policy(teams=(team("vision", 0, 0),))
    result = run(policy, pending("w", gpus=8, models=("H100", "A100")))
    assert placed(result)["w"][1][0].node == "a1"


def test_star_quota_applies_to_models_not_listed() -> None:
    policy = Policy(teams=(Team("vision", quotas={"*": Quota(0, 4)}),))
    result = run(policy, pending("a", gpus=8, models=("A100",)), pending("h", gpus=4))
    assert why(result)["a"] == (
        "team_limit",
        "team vision would pass its A100 limit: 0/4 in use, needs 8 more",
    )
    assert "h" in placed(result)


def test_department_limit_caps_its_teams_together() -> None:
    policy = Policy(
        departments=(Department("research", {"H100": Quota(0, 16)}),),
        teams=(
            Team("vision", department="research"),
            Team("nlp", department="research"),
            Team("ads"),
        ),
    )
    result = run(
        policy,
        pending("v", at=1, team="vision", gpus=8, models=("H100",)),
        pending("n", at=2, team="nlp", gpus=8, models=("H100",)),
        pending("n2", at=3, team="nlp", gpus=8, models=("H100",)),
        pending("a", at=4, team="ads", gpus=8, models=("H100",)),
    )
    assert {"v", "n", "a"} <= set(placed(result))
    assert why(result)["n2"] == (
        "department_limit",
        "department research is at its H100 limit 16/16",
    )


def test_class_that_may_not_borrow_runs_only_within_guarantee() -> None:
    policy = Policy(teams=(team("vision", 8),))
    result = run(
        policy,
        pending("p1", at=1, cls="production", gpus=8, models=("H100",)),
        pending("p2", at=2, cls="production", gpus=8, models=("H100",)),
        pending("b", at=3, cls="batch", gpus=8, models=("H100",)),
    )
    assert {"p1", "b"} <= set(placed(result))
    assert why(result)["p2"] == (
        "guarantee_exhausted",
        "priority class 'production' may only use guaranteed GPUs and team vision has 0 of "
        "its 8 guaranteed H100 left for it, needs 8",
    )
    # A team without a guarantee is told so, not "0 of its 0".
    result = run(policy, pending("n", at=1, team="nlp", cls="production", gpus=8, models=("H100",)))
    assert why(result)["n"] == (
        "guarantee_exhausted",
        "priority class 'production' may only use guaranteed GPUs and team nlp has no "
        "guaranteed H100, needs 8",
    )


def test_lower_priority_work_does_not_use_up_a_higher_class_guarantee() -> None:
    # Batch inside the guarantee becomes borrowed once production needs it.
    policy = Policy(teams=(team("vision", 8),))
    active = _occupying("vision", 8)
    result = run(policy, pending("p", cls="production", gpus=8, models=("H100",)), active=active)
    assert "p" in placed(result)


def test_department_pool_is_guaranteed_to_its_teams() -> None:
    policy = Policy(
        departments=(Department("research", {"H100": Quota(16)}),),
        teams=(Team("vision", department="research"), Team("nlp", department="research")),
    )
    result = run(
        policy,
        pending("v", at=1, team="vision", cls="production", gpus=8, models=("H100",)),
        pending("n", at=2, team="nlp", cls="production", gpus=8, models=("H100",)),
        pending("v2", at=3, team="vision", cls="production", gpus=8, models=("H100",)),
    )
    assert {"v", "n"} <= set(placed(result))
    assert why(result)["v2"][0] == "guarantee_exhausted"


def test_unknown_team_has_no_guarantee_but_may_borrow() -> None:
    policy = Policy(teams=(team("vision", 8, 8),), default_team=Team("*", may_burst=False))
    result = run(
        policy,
        pending("b", team="stranger", gpus=8, models=("H100",)),
        pending("p", team="stranger", cls="production", gpus=8, models=("H100",)),
    )
    assert "b" in placed(result)
    assert why(result)["p"][0] == "guarantee_exhausted"


def test_unknown_priority_class_is_explained() -> None:
    result = run(Policy(), pending("w", cls="urgent"))
    assert why(result)["w"] == (
        "unknown_priority_class",
        "priority class 'urgent' is not defined; ask an admin or use a defined one",
    )


def test_custom_classes() -> None:
    policy = Policy(classes=(PriorityClass("gold", 10, preemptible=False, may_borrow=False),))
    result = run(policy, pending("g", cls="gold"), pending("b", cls="batch"))
    assert "g" in placed(result)  # no teams: no quotas
    assert why(result)["b"][0] == "unknown_priority_class"


def _occupying(team_name: str, gpus: int) -> tuple[RunningWorkload, ...]:
    """Running batch work of `team_name` holding `gpus` H100 (whole nodes, then a rest)."""
    out = []
    left = gpus
    for i in range(4):
        take = min(8, left)
        if take:
            out.append(running(f"r{i}", "s1", {f"h{i}": range(take)}, team=team_name))
        left -= take
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("t0", "t1", "t2", "t3", "nobody")),
            st.sampled_from(("H100", "A100")),
            st.sampled_from((0.25, 1.0, 2.0, 8.0)),
            st.sampled_from((0, 100, 300, 500, 1000)),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_guaranteed_room_read_between_adds_is_the_room_of_a_fresh_count(
    adds: list[tuple[str, str, float, int, bool]],
) -> None:
    """The room cache forgets exactly what each add changes; rooms only shrink."""
    teams = tuple(
        Team(
            t,
            department="d" if t in ("t0", "t1") else None,
            quotas={"H100": Quota(g), "A100": Quota(g / 2)},
        )
        for t, g in (("t0", 4), ("t1", 2), ("t2", 8), ("t3", 0))
    )
    policy = Policy(
        teams=teams, departments=(Department("d", {"H100": Quota(10), "A100": Quota(3)}),)
    )
    totals = {"H100": 64.0, "A100": 32.0}
    ledger = Ledger(policy, totals)
    done: list[tuple[str, str, float, int, bool]] = []
    for add in adds:
        t, model, amount, value, preempting = add
        ledger.add(t, model, amount, value, preempting=preempting)
        done.append(add)
        fresh = Ledger(policy, totals)
        for t2, m2, a2, v2, p2 in done:
            fresh.add(t2, m2, a2, v2, preempting=p2)
        for t2 in ("t0", "t1", "t2", "t3", "nobody"):
            for m2 in ("H100", "A100"):
                for v2 in (0, 100, 300, 500, 1000, 2000):
                    room = fresh.room(t2, m2, v2)
                    for need in (0.5, 1.0, 4.0, 9.0):  # from a bound on it, when one tells
                        assert ledger.exceeds_room(t2, m2, v2, need) == (need > room + 1e-9)
                    assert ledger.room(t2, m2, v2) == room
