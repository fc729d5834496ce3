"""Where work lands: models, shapes, gangs, fractions, affinity, cloud and scoring."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.capacity import Capacity
from hub.core.fit import (
    _assignment,
    _find_gang,
    _find_whole,
    build_sig,
    fresh_sig,
    sig_key,
    take,
)
from hub.core.model import Node, Plan, Snapshot, Workload
from hub.core.placement import plan
from hub.core.policy import Policy, Team
from schemas import Assignment, WorkloadSpec
from tests.unit.hub.core.builders import (
    check_invariants,
    fleet,
    node,
    pending,
    placed,
    running,
    spoke,
    why,
)
from tests.unit.hub.core.test_properties import fleets

NOW = 10_000.0
POLICY = Policy()


def run(snapshot: Snapshot, *queue: Workload, policy: Policy = POLICY) -> Plan:
    result = plan(snapshot, queue, [], policy, NOW)
    check_invariants(snapshot, queue, [], policy, result)
    return result


def where(result: Plan, wid: str) -> tuple[str, str, tuple[int, ...]]:
    sid, assignments = placed(result)[wid]
    return sid, assignments[0].node, assignments[0].devices


@pytest.mark.parametrize(
    ("free", "gpus", "expected_node"),
    [
        ({"n1": 8, "n2": 3, "n3": 5}, 2, "n2"),  # fullest node that still fits
        ({"n1": 8, "n2": 3, "n3": 5}, 4, "n3"),
        ({"n1": 8, "n2": 3, "n3": 5}, 8, "n1"),
        ({"n1": 2, "n2": 2}, 2, "n1"),  # tie: first node
    ],
)
def test_whole_gpus_go_to_the_fullest_node_that_fits(
    free: dict[str, int], gpus: int, expected_node: str
) -> None:
    snapshot = fleet(spoke("s1", *(node(n, free=range(k)) for n, k in free.items())))
    result = run(snapshot, pending("w", gpus=gpus))
    assert where(result, "w")[1] == expected_node
    assert len(where(result, "w")[2]) == gpus


def test_placements_in_one_plan_never_share_devices() -> None:
    snapshot = fleet(spoke("s1", node("n1", gpus=4)))
    result = run(snapshot, *(pending(f"w{i}", at=i, gpus=1) for i in range(6)))
    devices = [where(result, f"w{i}")[2] for i in range(4)]
    assert sorted(d for ds in devices for d in ds) == [0, 1, 2, 3]
    assert why(result)["w4"][0] == "insufficient_free"
    assert why(result)["w5"][0] == "insufficient_free"


def test_earlier_acceptable_model_is_preferred_then_the_next() -> None:
    snapshot = fleet(spoke("s1", node("a", "A100"), node("h", "H100", free=range(2))))
    result = run(
        snapshot,
        pending("first", at=1, gpus=2, models=("H100", "A100")),
        pending("second", at=2, gpus=2, models=("H100", "A100")),
    )
    assert where(result, "first")[1] == "h"
    assert where(result, "second")[1] == "a"


def test_any_model_when_none_is_named() -> None:
    snapshot = fleet(spoke("s1", node("l", "L4", gpus=4)))
    assert where(run(snapshot, pending("w", gpus=4)), "w")[1] == "l"


def test_on_prem_before_cloud_then_cheaper_cloud() -> None:
    snapshot = fleet(
        spoke("cloud-dear", node("c1"), cloud=True, price=4.0),
        spoke("cloud-cheap", node("c2"), cloud=True, price=2.0),
        spoke("onprem", node("o1", free=range(1))),
    )
    result = run(snapshot, *(pending(f"w{i}", at=i, gpus=1) for i in range(3)))
    assert where(result, "w0")[0] == "onprem"
    assert where(result, "w1")[0] == "cloud-cheap"
    assert where(result, "w2")[0] == "cloud-cheap"


def test_cloud_only_for_teams_that_may_burst() -> None:
    policy = Policy(teams=(Team("vision", may_burst=True), Team("nlp", may_burst=False)))
    snapshot = fleet(spoke("c", node("c1"), cloud=True))
    result = run(snapshot, pending("v", team="vision"), pending("n", team="nlp"), policy=policy)
    assert where(result, "v")[0] == "c"
    reason, message = why(result)["n"]
    assert reason == "burst_not_allowed"
    assert "team nlp may not burst" in message


def test_spoke_reserved_for_a_team_takes_only_its_work() -> None:
    snapshot = fleet(spoke("burst-1", node("c1"), cloud=True, reserved_for=("vision",)))
    result = run(snapshot, pending("v", team="vision"), pending("n", team="nlp"))
    assert where(result, "v")[0] == "burst-1"
    assert why(result)["n"][0] == "reserved_for_other_teams"


def test_required_region_and_labels_are_hard() -> None:
    snapshot = fleet(
        spoke("us", node("u1", ib="true"), region="us"),
        spoke("eu", node("e1"), node("e2", ib="true"), region="eu"),
    )
    result = run(
        snapshot,
        pending("w", gpus=8, required_regions=("eu",), required_labels={"ib": "true"}),
        pending("x", at=1, gpus=8, required_regions=("eu",), required_labels={"ib": "true"}),
    )
    assert where(result, "w")[:2] == ("eu", "e2")
    assert why(result)["x"] == (
        "insufficient_free",
        "no node in region eu has 8 free GPUs with labels ib=true",
    )


def test_spoke_labels_count_as_node_labels() -> None:
    snapshot = fleet(spoke("s1", node("n1"), zone="a"), spoke("s2", node("n2"), zone="b"))
    result = run(snapshot, pending("w", required_labels={"zone": "b"}))
    assert where(result, "w")[0] == "s2"


def test_preferred_region_breaks_ties_but_not_bin_packing() -> None:
    snapshot = fleet(
        spoke("us", node("u1", free=range(8)), region="us"),
        spoke("eu", node("e1", free=range(8)), region="eu"),
        spoke("ap", node("a1", free=range(2)), region="ap"),
    )
    result = run(
        snapshot,
        pending("tie", at=1, gpus=4, preferred_regions=("eu",)),
        pending("packs", at=2, gpus=2, preferred_regions=("eu",)),
    )
    assert where(result, "tie")[0] == "eu"
    assert where(result, "packs")[0] == "ap"  # fewest free GPUs beats preference


def test_preferred_labels_pick_among_equal_nodes() -> None:
    snapshot = fleet(spoke("s1", node("plain"), node("fast", nvlink="yes")))
    result = run(snapshot, pending("w", gpus=8, preferred_labels={"nvlink": "yes"}))
    assert where(result, "w")[1] == "fast"


def test_gang_takes_all_its_nodes_on_one_spoke_or_nothing() -> None:
    snapshot = fleet(
        spoke("s1", node("a"), node("b", free=range(4))),
        spoke("s2", node("c"), node("d"), node("e", free=range(7))),
    )
    result = run(snapshot, pending("gang", gpus=8, nodes=2), pending("big", at=1, gpus=8, nodes=3))
    sid, assignments = placed(result)["gang"]
    assert sid == "s2"
    assert sorted(a.node for a in assignments) == ["c", "d"]
    assert all(a.devices == tuple(range(8)) for a in assignments)
    assert why(result)["big"][0] == "insufficient_free"


def test_gang_never_spans_spokes() -> None:
    snapshot = fleet(spoke("s1", node("a")), spoke("s2", node("b")))
    result = run(snapshot, pending("gang", gpus=8, nodes=2))
    assert why(result)["gang"] == (
        "shape_never_fits",
        "no spoke has 2 nodes with 8 GPUs each (at most 1, on s1)",
    )


def test_gang_prefers_the_spoke_it_fragments_least() -> None:
    snapshot = fleet(
        spoke("roomy", node("a"), node("b"), node("c")),
        spoke("snug", node("d", free=range(4)), node("e", free=range(4))),
    )
    result = run(snapshot, pending("gang", gpus=4, nodes=2))
    assert placed(result)["gang"][0] == "snug"


def test_fractions_pack_onto_shared_devices_first() -> None:
    snapshot = fleet(spoke("s1", node("n1", gpus=2, free=[1], shared={0: 0.5})))
    result = run(
        snapshot,
        pending("a", at=1, fraction=0.25),
        pending("b", at=2, fraction=0.25),
        pending("c", at=3, fraction=0.5),
        pending("d", at=4, fraction=0.75),
    )
    assert where(result, "a")[2] == (0,)
    assert where(result, "b")[2] == (0,)  # device 0 is now full
    assert where(result, "c")[2] == (1,)  # a whole device turned shared
    assert why(result)["d"][0] == "insufficient_free"
    assert placed(result)["c"][1][0].fraction == 0.5


def test_fraction_never_exceeds_what_a_shared_device_has_left() -> None:
    snapshot = fleet(spoke("s1", node("n1", gpus=1, free=[], shared={0: 0.3})))
    result = run(snapshot, pending("big", fraction=0.5), pending("small", at=1, fraction=0.25))
    assert "big" in why(result)
    assert where(result, "small")[2] == (0,)


def test_whole_gpu_never_lands_on_a_shared_device() -> None:
    snapshot = fleet(spoke("s1", node("n1", gpus=2, free=[0, 1], shared={1: 1.0})))
    result = run(snapshot, pending("w", gpus=2), pending("one", at=1, gpus=1))
    assert why(result)["w"][0] == "insufficient_free"
    assert where(result, "one")[2] == (0,)


def test_unschedulable_nodes_and_non_accepting_spokes_are_skipped() -> None:
    suspect = fleet(spoke("s1", node("n1"), accepts=False), spoke("s2", node("n2", free=[0])))
    result = run(suspect, pending("w", gpus=4))
    assert why(result)["w"][0] == "insufficient_free"
    cordoned = fleet(spoke("s1", Node("n1", "H100", 8, tuple(range(8)), schedulable=False)))
    assert why(run(cordoned, pending("w")))["w"] == (
        "no_spokes",
        "no spoke accepting work has a schedulable GPU node",
    )


def test_input_is_not_mutated_and_same_input_gives_same_plan() -> None:
    snapshot = fleet(spoke("s1", node("n1", gpus=2, free=[1], shared={0: 0.5})))
    queue = [pending("a", fraction=0.5), pending("b", at=1, gpus=1)]
    active = [running("r", "s1", {"n1": [0]}, fraction=0.5)]
    first = plan(snapshot, queue, active, POLICY, NOW)
    assert snapshot.spokes[0].nodes[0].free == (1,)
    assert snapshot.spokes[0].nodes[0].free_fraction == {0: 0.5}
    assert plan(snapshot, queue, active, POLICY, NOW) == first


def test_assignments_are_built_as_pydantic_would_build_them() -> None:
    """`take()` skips pydantic's default lookups; the wire form must not change for it."""
    for node_name, devices, fraction in (("n1", (0, 1), None), ("n2", (3,), 0.25)):
        fast = _assignment(node_name, devices, fraction)
        given = {"fraction": fraction} if fraction is not None else {}
        slow = Assignment.model_construct(node=node_name, devices=devices, **given)
        assert fast == slow
        assert fast.model_fields_set == slow.model_fields_set
        assert list(fast.__dict__.items()) == list(slow.__dict__.items())
        assert fast.__pydantic_extra__ == slow.__pydantic_extra__
        assert fast.__pydantic_private__ == slow.__pydantic_private__
        assert hash(fast) == hash(slow)
        assert fast.model_dump_json(exclude_unset=True) == slow.model_dump_json(exclude_unset=True)
        assert fast.model_dump_json() == slow.model_dump_json()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.data())
def test_a_search_over_all_of_a_models_pools_finds_what_reading_every_pool_finds(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    """A signature with all of a model's pools looks up the best node, or a gang's spokes, in
    the model's tiers (`Capacity.tiers`); reading each pool in rank order must give the same
    spot, also after devices were taken and the plan's takes were put back."""
    capacity = Capacity(snapshot)
    capacity.begin()
    for model in capacity.models:
        for may_burst in (False, True):
            spec = WorkloadSpec.model_validate(
                {"name": "w", "team": "t", "command": ["x"], "gpu_models": [model]}
            )
            sig = build_sig(sig_key(spec, may_burst, ""), spec, capacity, may_burst, "t")
            assert sig.ranked, "all of a model's pools: looked up in its tiers"
            read = fresh_sig(sig)
            read.ranked = {}  # the same pools, read one by one
            for _ in range(data.draw(st.integers(0, 6))):
                g = data.draw(st.sampled_from((1, 2, 4, 8)))
                nodes = data.draw(st.sampled_from((1, 1, 2, 3)))
                if nodes == 1:
                    fit, scanned = _find_whole(sig, model, 0, g), _find_whole(read, model, 0, g)
                else:
                    fit = _find_gang(sig, model, 0, nodes, g)
                    scanned = _find_gang(read, model, 0, nodes, g)
                assert (fit and (fit.rank, fit.parts)) == (
                    scanned and (scanned.rank, scanned.parts)
                )
                if fit is not None and data.draw(st.booleans()):
                    take(fit)
    capacity.rollback()
    fresh = Capacity(snapshot)
    assert {k: (t.mask, t.at) for k, t in capacity.tiers.items()} == {
        k: (t.mask, t.at) for k, t in fresh.tiers.items()
    }
