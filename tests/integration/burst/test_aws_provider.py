"""The AWS provider against moto's EC2 server: launch, idempotency, terminate, sweep, failover."""

from __future__ import annotations

import base64
import dataclasses
import time
from typing import Any

import pytest

from burst.catalog import Catalog, load_catalog
from burst.core import BurstPolicy, PlannerState, plan_burst, record_capacity_error
from burst.errors import InsufficientCapacityError, UnauthorizedError
from burst.ports import LaunchRequest, Provisioner
from burst.providers.aws import AwsProvider, ec2_client_factory
from burst.providers.aws_catalog import refresh_catalog
from schemas.burst import DemandItem, DemandReport, InstanceState, Market
from tests.integration.burst.conftest import REGION, RunFailure

CREDS = "-----BEGIN NATS USER JWT-----\neyJhbGc.eyJzdWI.c2ln\n------END NATS USER JWT------\n"


def request(burst_id: str = "burst-1-0-abcd1234", **fields: Any) -> LaunchRequest:
    values: dict[str, Any] = {
        "burst_id": burst_id,
        "instance_type": "p5.48xlarge",
        "region": REGION,
        "market": Market.SPOT,
        "team": "ml",
        "price_per_hour": 45.0,
        "gpu_model": "H100",
        "gpu_count": 8,
        "spoke_creds": CREDS,
        "workload_ids": ("w1",),
    }
    values.update(fields)
    return LaunchRequest(**values)


def instances(ec2: Any, **filters: str) -> list[dict[str, Any]]:
    reply = ec2.describe_instances(
        Filters=[{"Name": name, "Values": [value]} for name, value in filters.items()]
    )
    return [i for r in reply["Reservations"] for i in r["Instances"]]


def tags(instance: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}


def test_is_a_provisioner(provider: AwsProvider) -> None:
    assert isinstance(provider.name, str)
    _: Provisioner = provider  # mypy checks the protocol


async def test_launch_tags_the_instance_and_boots_a_spoke(provider: AwsProvider, ec2: Any) -> None:
    info = await provider.launch(request())
    assert (info.burst_id, info.instance_type, info.market, info.team) == (
        "burst-1-0-abcd1234",
        "p5.48xlarge",
        Market.SPOT,
        "ml",
    )
    assert info.state is InstanceState.REQUESTED
    assert info.zone == "us-east-1a"  # the first subnet
    assert (info.price_per_hour, info.gpu_model, info.gpu_count) == (45.0, "H100", 8)

    [raw] = instances(ec2, **{"tag:gpufed:burst-id": "burst-1-0-abcd1234"})
    assert raw["InstanceLifecycle"] == "spot"
    assert tags(raw) | {} == {
        "Name": "gpufed-burst-1-0-abcd1234",
        "gpufed:managed": "true",
        "gpufed:cluster": "test",
        "gpufed:burst-id": "burst-1-0-abcd1234",
        "gpufed:team": "ml",
        "gpufed:market": "spot",
        "gpufed:price-per-hour": "45",
        "gpufed:gpu-model": "H100",
        "gpufed:gpu-count": "8",
    }
    attribute = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert (
        "gpufed spoke --id burst-1-0-abcd1234 --region us-east-1 --kind cloud"
        " --nats-url tls://hub.example.com:4222 --nats-creds /etc/gpufed/nats.creds"
        " --inventory nvml --runtime local --price 5.625"
        " --label burst-team=ml --label instance-type=p5.48xlarge --label market=spot"
        # A spot instance's spoke watches for EC2's two-minute notice and drains.
        " --interruption-imds http://169.254.169.254\n"
    ) in script

    # The credential is written to a root-only file; the command line only names it.
    assert "(umask 077; cat > /etc/gpufed/nats.creds <<'CREDS'\n" + CREDS in script
    assert "eyJhbGc" not in script.split("ExecStart=")[1]

    [described] = await provider.describe(["burst-1-0-abcd1234", "unknown"])
    assert described.provider_instance_id == info.provider_instance_id
    assert described.launched_at is not None
    assert described.state is InstanceState.RUNNING  # moto boots instances at once
    event = described.to_event(at=1.0)
    assert (event.burst_id, event.provider, event.state) == (info.burst_id, "aws", described.state)


async def test_a_private_ca_goes_to_the_instance_beside_its_credential(
    provider: AwsProvider, ec2: Any
) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"
    config = dataclasses.replace(provider._config, nats_ca=ca)
    info = await AwsProvider(lambda: ec2, REGION, config).launch(request(market=Market.ON_DEMAND))
    [raw] = instances(ec2, **{"tag:gpufed:burst-id": info.burst_id})
    attribute = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    # The spoke checks the hub's NATS server against the deployment's own CA, from a file.
    assert "--nats-creds /etc/gpufed/nats.creds --nats-ca /etc/gpufed/nats-ca.crt " in script
    assert "(umask 077; cat > /etc/gpufed/nats-ca.crt <<'PEM'\n" + ca + "PEM\n" in script


async def test_on_demand_launch_has_no_spot_options(provider: AwsProvider, ec2: Any) -> None:
    info = await provider.launch(request(market=Market.ON_DEMAND))
    [raw] = instances(ec2, **{"tag:gpufed:burst-id": info.burst_id})
    assert "InstanceLifecycle" not in raw
    assert info.market is Market.ON_DEMAND
    attribute = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert "--interruption-imds" not in script  # no notice comes for on-demand instances


async def test_same_request_twice_starts_one_instance(
    provider: AwsProvider, ec2: Any, fail_run_instances: RunFailure
) -> None:
    calls = fail_run_instances("never", lambda body: False)
    first = await provider.launch(request())
    second = await provider.launch(request())
    assert second.provider_instance_id == first.provider_instance_id
    assert len(instances(ec2, **{"tag:gpufed:burst-id": first.burst_id})) == 1
    # The second call found the instance by tag; the first carried the id as ClientToken,
    # which makes AWS itself dedupe a retry whose answer was lost (moto does not model it).
    assert [call["ClientToken"] for call in calls] == ["burst-1-0-abcd1234"]


async def test_terminate_is_idempotent(provider: AwsProvider, ec2: Any) -> None:
    info = await provider.launch(request())
    stopped = await provider.terminate([info.burst_id, "never-launched"])
    assert [i.burst_id for i in stopped] == [info.burst_id]
    [after] = await provider.describe([info.burst_id])
    assert after.state is InstanceState.TERMINATED
    assert await provider.terminate([info.burst_id]) == []
    assert await provider.terminate([]) == []


async def test_orphan_sweep_terminates_only_unknown_old_instances_of_this_cluster(
    provider: AwsProvider, ec2: Any
) -> None:
    known = await provider.launch(request("burst-1-0-known"))
    orphan = await provider.launch(request("burst-1-1-orphan"))
    # not ours: no gpufed tags, or another gpufed deployment's
    ec2.run_instances(ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1, MaxCount=1)
    ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="g5.xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "gpufed:managed", "Value": "true"},
                    {"Key": "gpufed:cluster", "Value": "prod"},
                    {"Key": "gpufed:burst-id", "Value": "burst-9-9-prod"},
                ],
            }
        ],
    )
    # within the grace period nothing goes: the store may be writing the record right now
    assert await provider.sweep_orphans({known.burst_id}, now=time.time(), grace_s=300) == []

    swept = await provider.sweep_orphans({known.burst_id}, now=time.time() + 3600, grace_s=300)
    assert [i.burst_id for i in swept] == [orphan.burst_id]
    live = instances(ec2, **{"instance-state-name": "pending"}) + instances(
        ec2, **{"instance-state-name": "running"}
    )
    assert sorted(tags(i).get("gpufed:burst-id", "untagged") for i in live) == [
        "burst-1-0-known",
        "burst-9-9-prod",
        "untagged",
    ]
    # a second sweep finds nothing left to do
    assert await provider.sweep_orphans({known.burst_id}, now=time.time() + 3600, grace_s=300) == []


async def test_zone_without_capacity_falls_over_to_the_next_subnet(
    provider: AwsProvider, subnets: tuple[str, str], fail_run_instances: RunFailure
) -> None:
    calls = fail_run_instances(
        "InsufficientInstanceCapacity", lambda body: body.get("SubnetId") == subnets[0]
    )
    info = await provider.launch(request())
    assert info.zone == "us-east-1b"
    assert [c["SubnetId"] for c in calls] == list(subnets)
    # each subnet gets its own client token: AWS refuses a token reused with other parameters
    assert [c["ClientToken"] for c in calls] == ["burst-1-0-abcd1234", "burst-1-0-abcd1234-s1"]


async def test_capacity_error_blocks_the_offer_and_the_planner_tries_the_next(
    provider: AwsProvider, ec2: Any, fail_run_instances: RunFailure
) -> None:
    catalog = Catalog.model_validate(
        {
            "as_of": "2025-01-15",
            "instance_types": [
                {"name": "p5.48xlarge", "gpu_model": "H100", "gpu_count": 8,
                 "gpu_memory_gib": 80, "vcpus": 192,
                 "prices": {REGION: {"on_demand": 98.32, "spot": 45.0}}},
                {"name": "p4d.24xlarge", "gpu_model": "A100", "gpu_count": 8,
                 "gpu_memory_gib": 40, "vcpus": 96,
                 "prices": {REGION: {"on_demand": 32.77, "spot": 14.5}}},
            ],
        }
    )  # fmt: skip
    fail_run_instances(
        "InsufficientInstanceCapacity", lambda body: body["InstanceType"] == "p4d.24xlarge"
    )
    demand = DemandReport(
        items=(DemandItem(team="ml", gpus_per_node=8, oldest_age_s=600, workload_ids=("w1",)),),
        sent_at=1000.0,
        seq=1,
    )
    policy = BurstPolicy()
    state = PlannerState()
    outcomes: list[str] = []
    for attempt in range(4):
        now = 1000.0 + attempt
        plan = plan_burst(demand, [], catalog, policy, state, now)
        [launch] = plan.launches
        try:
            info = await provider.launch(LaunchRequest.from_launch(launch, "tok_x"))
        except InsufficientCapacityError as exc:
            assert exc.offer == launch.offer
            outcomes.append(f"no capacity: {launch.instance_type} {launch.market}")
            state = record_capacity_error(state, exc.offer, now, policy.capacity_backoff_s)
            continue
        outcomes.append(f"launched: {info.instance_type} {info.market}")
        break
    # cheapest first (A100 spot, then A100 on-demand), both out of capacity in every zone;
    # then the H100 spot offer
    assert outcomes == [
        "no capacity: p4d.24xlarge spot",
        "no capacity: p4d.24xlarge on_demand",
        "launched: p5.48xlarge spot",
    ]
    live = instances(ec2, **{"tag:gpufed:managed": "true"})
    assert [i["InstanceType"] for i in live] == ["p5.48xlarge"]


async def test_missing_permission_is_an_unauthorized_error(
    provider: AwsProvider, fail_run_instances: RunFailure
) -> None:
    fail_run_instances("UnauthorizedOperation", lambda body: True)
    with pytest.raises(UnauthorizedError, match="IAM policy"):
        await provider.launch(request())


async def test_launch_for_another_region_is_refused(provider: AwsProvider) -> None:
    with pytest.raises(Exception, match="this provider serves us-east-1"):
        await provider.launch(request(region="eu-west-1"))


def test_refresh_catalog_from_describe_instance_types_and_spot_history(ec2: Any) -> None:
    base = load_catalog()
    stale = base.model_copy(
        update={
            "instance_types": tuple(
                spec.model_copy(update={"gpu_count": 1, "gpu_model": "old"})
                if spec.name == "p5en.48xlarge"
                else spec
                for spec in base.instance_types
            )
        }
    )
    fresh = refresh_catalog(stale, ec2)
    p5en = fresh.get("p5en.48xlarge")
    assert p5en is not None
    assert (p5en.gpu_model, p5en.gpu_count, p5en.gpu_memory_gib) == ("H200", 8, 141.0)
    # moto quotes every spot price as 0.00001 $/h; on-demand stays as listed
    assert p5en.prices[REGION].spot == pytest.approx(0.00001)
    assert p5en.prices[REGION].on_demand == base.get("p5en.48xlarge").prices[REGION].on_demand  # type: ignore[union-attr]
    assert fresh.refreshed_at is not None
    # other regions are left alone
    assert p5en.prices["us-west-2"] == base.get("p5en.48xlarge").prices["us-west-2"]  # type: ignore[union-attr]


def test_refresh_drops_regions_where_a_type_is_not_sold(
    moto_endpoint: str, aws_env: None, ec2: Any
) -> None:
    catalog = Catalog.model_validate(
        {
            "as_of": "2025-01-15",
            "instance_types": [
                {"name": "p5en.48xlarge", "gpu_model": "H200", "gpu_count": 8,
                 "gpu_memory_gib": 141, "vcpus": 192,
                 "prices": {"eu-west-1": {"on_demand": 90.0}, REGION: {"on_demand": 84.8}}},
                {"name": "g5.xlarge", "gpu_model": "A10G", "gpu_count": 1,
                 "gpu_memory_gib": 24, "vcpus": 4,
                 "prices": {"eu-west-1": {"on_demand": 1.123}}},
            ],
        }
    )  # fmt: skip
    ireland = ec2_client_factory("eu-west-1", endpoint_url=moto_endpoint)()
    assert ireland.meta.region_name == "eu-west-1"
    fresh = refresh_catalog(catalog, ireland)
    assert set(fresh.get("p5en.48xlarge").prices) == {REGION}  # type: ignore[union-attr]
    assert fresh.get("g5.xlarge").prices["eu-west-1"].on_demand == 1.123  # type: ignore[union-attr]


async def test_provider_refreshes_the_catalog_off_the_event_loop(provider: AwsProvider) -> None:
    fresh = await provider.refresh_catalog(load_catalog())
    assert fresh.refreshed_at is not None
    assert fresh.get("g6e.xlarge").prices[REGION].spot == pytest.approx(0.00001)  # type: ignore[union-attr]
