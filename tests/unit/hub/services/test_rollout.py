"""Replica plans: scaling, replacing failed replicas, rolling updates, region spread."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hub.core.rollout import Replica, choose_regions, plan_replicas


def _r(i: int, gen: int = 1, ready: bool = True, unhealthy: bool = False) -> Replica:
    return Replica(f"r{i}", gen, started_at=float(i), ready=ready, unhealthy=unhealthy)


def test_scale_up_starts_the_missing_replicas() -> None:
    plan = plan_replicas((_r(1),), desired=3, generation=1)
    assert (plan.start, plan.stop) == (2, ())


def test_scale_down_stops_not_ready_then_newest() -> None:
    plan = plan_replicas((_r(1), _r(2), _r(3, ready=False), _r(4)), desired=2, generation=1)
    assert plan.stop == ("r3", "r4")


def test_an_unhealthy_replica_is_replaced() -> None:
    plan = plan_replicas((_r(1), _r(2, unhealthy=True)), desired=2, generation=1)
    assert (plan.start, plan.stop, plan.replaced) == (1, ("r2",), ("r2",))


def test_a_rolling_update_goes_one_at_a_time_and_keeps_the_ready_count() -> None:
    replicas = [_r(1), _r(2)]
    starts = 0
    for step in range(20):
        plan = plan_replicas(tuple(replicas), desired=2, generation=2)
        if plan.idle:
            break
        ready = sum(r.ready for r in replicas if r.id not in plan.stop)
        assert ready >= 2 or all(r.generation == 2 for r in replicas)
        replicas = [r for r in replicas if r.id not in plan.stop]
        for _ in range(plan.start):
            starts += 1
            replicas.append(Replica(f"n{starts}", 2, started_at=100.0 + step, ready=False))
        assert len(replicas) <= 3
        # The new ones pass their health check before the next plan.
        replicas = [Replica(r.id, r.generation, r.started_at, ready=True) for r in replicas]
    assert sorted(r.generation for r in replicas) == [2, 2]
    assert starts == 2


replica_sets = st.lists(
    st.builds(
        Replica,
        id=st.text("abcdef", min_size=1, max_size=4),
        generation=st.integers(1, 3),
        started_at=st.floats(0, 100),
        ready=st.booleans(),
        unhealthy=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda r: r.id,
)


@given(replicas=replica_sets, desired=st.integers(0, 6), generation=st.integers(1, 3))
def test_a_plan_never_drops_ready_replicas_below_what_is_asked(
    replicas: list[Replica], desired: int, generation: int
) -> None:
    plan = plan_replicas(tuple(replicas), desired, generation)
    healthy_ready = [r for r in replicas if r.ready and not r.unhealthy]
    kept_ready = [r for r in healthy_ready if r.id not in plan.stop]
    assert len(kept_ready) >= min(desired, len(healthy_ready))
    alive_after = sum(1 for r in replicas if r.id not in plan.stop) + plan.start
    assert alive_after <= max(desired + 1, len(replicas))
    assert set(plan.replaced) == {r.id for r in replicas if r.unhealthy}


def test_spread_fills_the_emptiest_region_with_room_preferred_first() -> None:
    everywhere = frozenset({"eu", "us", "ap"})
    assert choose_regions(["eu"], ("eu", "us", "ap"), 3, True, everywhere) == ["us", "ap", "eu"]
    assert choose_regions(["eu"], ("eu", "us", "ap"), 2, True, frozenset({"eu"})) == ["eu", "eu"]
    assert choose_regions(["eu"], ("eu", "us"), 2, False, everywhere) == ["eu", "eu"]
    assert choose_regions([], ("eu", "us"), 1, False, frozenset({"us"})) == ["us"]
    assert choose_regions([], (), 2, True) == [None, None]
