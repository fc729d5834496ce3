"""Plain data of the Provisioner port."""

from __future__ import annotations

from burst.core import Launch
from burst.ports import InstanceInfo, LaunchRequest
from schemas.burst import InstanceState, Market

LAUNCH = Launch(
    "burst-1-0-ab", "p5.48xlarge", "us-east-1", Market.SPOT, "ml", 45.0, "H100", 8, ("w1",)
)


def test_request_from_a_planned_launch_keeps_the_credential_out_of_its_repr() -> None:
    request = LaunchRequest.from_launch(LAUNCH, "SUAsecretseed")
    assert request.burst_id == LAUNCH.request_id
    assert request.offer == LAUNCH.offer
    assert request.spoke_creds == "SUAsecretseed"
    assert "SUAsecretseed" not in repr(request)


def test_instance_info_becomes_an_instance_event() -> None:
    info = InstanceInfo(
        burst_id="burst-1-0-ab",
        provider="aws",
        provider_instance_id="i-0abc",
        instance_type="p5.48xlarge",
        region="us-east-1",
        zone="us-east-1a",
        market=Market.SPOT,
        team="ml",
        state=InstanceState.REQUESTED,
        launched_at=5.0,
        price_per_hour=45.0,
        gpu_model="H100",
        gpu_count=8,
    )
    event = info.to_event(at=6.0, reason="launched")
    assert event.model_dump(exclude={"schema_version"}) == {
        "burst_id": "burst-1-0-ab",
        "provider": "aws",
        "instance_type": "p5.48xlarge",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "market": Market.SPOT,
        "gpu_model": "H100",
        "gpu_count": 8,
        "price_per_hour": 45.0,
        "team": "ml",
        "state": InstanceState.REQUESTED,
        "spoke_id": None,
        "reason": "launched",
        "at": 6.0,
        "provider_instance_id": "i-0abc",
        "workload_ids": (),
    }
