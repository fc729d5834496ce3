"""The core's views of workloads: what placement reads of a spec is the spec's own."""

from __future__ import annotations

import pytest

from hub.core.model import Need, RunningWorkload, SpecLike, Workload
from schemas import Assignment, WorkloadKind, WorkloadSpec
from tests.unit.hub.core.builders import spec

READ = sorted(name for name, member in vars(SpecLike).items() if isinstance(member, property))

SPECS = [
    spec(),
    spec(team="nlp", cls="production", gpus=8, nodes=4, models=("H100", "A100")),
    spec(fraction=0.25, models=("L4",)),
    spec(required_regions=("eu-west",), preferred_labels={"ib": "true"}),
    WorkloadSpec(name="nb", team="vision", kind=WorkloadKind.SESSION, command=("jupyter",)),
]


def test_need_copies_every_field_placement_reads() -> None:
    # A field added to SpecLike but not to Need would be read from nothing (AttributeError)
    # in some plans only; the two lists must be the same.
    assert sorted(Need.__slots__) == READ
    assert "total_gpus" in READ and "team" in READ


@pytest.mark.parametrize("s", SPECS, ids=lambda s: f"{s.team}-{s.nodes}x{s.gpus_per_node}")
def test_views_read_what_their_spec_says(s: WorkloadSpec) -> None:
    pending = Workload("w1", s, 10.0)
    holding = RunningWorkload("w2", s, "spoke-a", (Assignment(node="n1", devices=(0,)),), 5.0)
    for view in (pending, holding):
        for name in READ:
            assert getattr(view.need, name) == getattr(s, name), name


def test_views_compare_by_their_fields_not_their_copy() -> None:
    s = spec(gpus=2)
    a, b = Workload("w1", s, 1.0), Workload("w1", s, 1.0)
    assert a.need is not b.need
    assert a == b
    assert "need" not in repr(a)
