"""moto's EC2 server on a free loopback port, fake credentials, and an AwsProvider against it."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from burst.providers.aws import AwsLaunchConfig, AwsProvider

REGION = "us-east-1"
IMAGE_ID = "ami-12c6146b"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Fake credentials; never read a real AWS config or profile."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def ec2(moto_endpoint: str, aws_env: None) -> Any:
    """An EC2 client on a freshly reset moto."""
    request = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto_endpoint)


@pytest.fixture
def subnets(ec2: Any) -> tuple[str, str]:
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    ids = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.7.{n}.0/24", AvailabilityZone=zone)
        for n, zone in enumerate(("us-east-1a", "us-east-1b"))
    ]
    return ids[0]["Subnet"]["SubnetId"], ids[1]["Subnet"]["SubnetId"]


@pytest.fixture
def provider(ec2: Any, subnets: tuple[str, str]) -> AwsProvider:
    config = AwsLaunchConfig(
        image_id=IMAGE_ID,
        nats_url="tls://hub.example.com:4222",
        subnet_ids=subnets,
        cluster="test",
        package="gpufed[nvml]==0.1.0",
    )
    # The provider uses this very client, so failure hooks registered on it apply.
    return AwsProvider(lambda: ec2, REGION, config)


RunFailure = Callable[[str, Callable[[dict[str, Any]], bool]], list[dict[str, Any]]]


@pytest.fixture
def fail_run_instances(ec2: Any) -> RunFailure:
    """Make RunInstances answer an error code for the requests a predicate accepts.

    moto never runs out of capacity, so the error is raised from a botocore `before-call` hook
    on the client the provider uses. Returns every RunInstances request body seen.
    """

    def inject(code: str, when: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []

        def hook(params: dict[str, Any], **_: Any) -> None:
            body = dict(params["body"])
            seen.append(body)
            if when(body):
                raise ClientError(
                    {
                        "Error": {"Code": code, "Message": f"injected {code}"},
                        "ResponseMetadata": {"HTTPStatusCode": 500},
                    },
                    "RunInstances",
                )

        ec2.meta.events.register("before-call.ec2.RunInstances", hook)
        return seen

    return inject
