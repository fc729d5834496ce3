"""Wire models of gpufed.v1.burst.*: validation, defaults, old payloads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.burst import (
    BURST_DEMAND,
    BURST_INSTANCES,
    DemandItem,
    DemandReport,
    InstanceEvent,
    InstanceState,
    Market,
)


def test_subjects() -> None:
    assert BURST_DEMAND == "gpufed.v1.burst.demand"
    assert BURST_INSTANCES == "gpufed.v1.burst.instances"


def test_minimal_payloads_parse_with_defaults() -> None:
    report = DemandReport.model_validate_json(
        '{"schema_version": 1, "sent_at": 1.5, "seq": 3,'
        ' "items": [{"team": "ml", "oldest_age_s": 90}], "from_the_future": true}'
    )
    item = report.items[0]
    assert (item.gpu_model, item.gpus_per_node, item.nodes, item.count) == (None, 1, 1, 1)
    assert item.regions == () and item.spot_ok is True
    event = InstanceEvent.model_validate(
        {
            "burst_id": "burst-1-0-abcd",
            "provider": "aws",
            "instance_type": "p5.48xlarge",
            "region": "us-east-1",
            "market": "spot",
            "price_per_hour": 45.0,
            "team": "ml",
            "state": "requested",
            "at": 2.0,
        }
    )
    assert event.market is Market.SPOT and event.state is InstanceState.REQUESTED
    assert event.spoke_id is None and event.workload_ids == ()


def test_round_trip() -> None:
    item = DemandItem(
        team="ml",
        gpu_model="H100",
        gpus_per_node=8,
        nodes=2,
        count=2,
        oldest_age_s=61,
        workload_ids=("a", "b"),
        regions=("us-east-1",),
    )
    report = DemandReport(items=(item,), sent_at=5, seq=9)
    assert DemandReport.model_validate_json(report.model_dump_json()) == report


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpu_fraction": 0.5, "gpus_per_node": 2}, "gpu_fraction needs"),
        ({"count": 1, "workload_ids": ("a", "b")}, "more workload_ids than count"),
        ({"count": 2, "workload_ids": ("a", "a")}, "workload_ids repeat"),
        ({"team": "Not A Label"}, "team"),
        ({"workload_ids": ("bad id",)}, "workload_ids"),
        ({"oldest_age_s": -1}, "oldest_age_s"),
    ],
)
def test_invalid_items(fields: dict[str, object], message: str) -> None:
    data: dict[str, object] = {"team": "ml", "oldest_age_s": 1, "count": 2}
    data.update(fields)
    with pytest.raises(ValidationError, match=message):
        DemandItem.model_validate(data)


def test_states_that_hold_instances() -> None:
    assert {s for s in InstanceState if s.active} == {
        InstanceState.REQUESTED,
        InstanceState.RUNNING,
        InstanceState.TERMINATING,
    }
