"""AWS EC2 provisioner: RunInstances / DescribeInstances / TerminateInstances, found by tags.

boto3 is blocking: every call runs in a worker thread (anyio.to_thread.run_sync). Errors are
translated into burst's at this boundary (see burst.providers.aws_errors).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread
import structlog
from botocore.exceptions import BotoCoreError, ClientError

from burst.catalog import Catalog
from burst.core.model import OfferKey
from burst.errors import BurstError, InsufficientCapacityError, PermanentBurstError
from burst.ports import InstanceInfo, LaunchRequest
from burst.providers.aws_catalog import refresh_catalog
from burst.providers.aws_errors import translate_error
from burst.providers.userdata import DEFAULT_TEMPLATE, SpokeBoot, render_user_data
from schemas.burst import InstanceState, Market

log = structlog.get_logger(__name__)

T = TypeVar("T")

PROVIDER = "aws"
#: The instance metadata service, as seen from the instance itself.
IMDS_URL = "http://169.254.169.254"
TAG_MANAGED = "gpufed:managed"
TAG_CLUSTER = "gpufed:cluster"
TAG_BURST_ID = "gpufed:burst-id"
TAG_TEAM = "gpufed:team"
TAG_MARKET = "gpufed:market"
TAG_PRICE = "gpufed:price-per-hour"
TAG_GPU_MODEL = "gpufed:gpu-model"
TAG_GPU_COUNT = "gpufed:gpu-count"

_STATES = {
    "pending": InstanceState.REQUESTED,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.TERMINATING,
    "stopped": InstanceState.TERMINATING,
    "shutting-down": InstanceState.TERMINATING,
    "terminated": InstanceState.TERMINATED,
}
_LIVE_STATES = ["pending", "running", "stopping", "stopped"]
_FILTER_VALUES_MAX = 200  # EC2 caps the values of one filter


@dataclass(frozen=True, slots=True)
class AwsLaunchConfig:
    """How burst instances are started in one region.

    `subnet_ids` are tried in order (each lies in one zone) when a zone has no capacity; empty
    means the default VPC. `cluster` names this gpufed deployment: the orphan sweep only ever
    touches instances tagged with it. `package` is the pip requirement the instance installs.
    `root_device_name` must be the AMI's root device (`/dev/sda1` on the Ubuntu Deep Learning
    AMIs, `/dev/xvda` on Amazon Linux) or the size applies to an extra volume; None for
    `root_volume_gib` keeps the AMI's own root volume.
    """

    image_id: str
    nats_url: str
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    instance_profile: str | None = None  # name or ARN
    key_name: str | None = None
    root_volume_gib: int | None = 200
    root_device_name: str = "/dev/sda1"
    cluster: str = "default"
    package: str = "gpufed[nvml]"
    extra_tags: Mapping[str, str] = field(default_factory=dict)
    nats_ca: str | None = None  # PEM of a private CA the hub's NATS certificate is signed by


def ec2_client_factory(
    region: str, endpoint_url: str | None = None, profile: str | None = None
) -> Callable[[], Any]:
    """A factory of boto3 EC2 clients for `region` (each call builds its own session)."""

    def make() -> Any:
        import boto3  # only the AWS provider needs boto3 (the `aws` extra)
        from botocore.config import Config

        # Bounded waits: a hung call would hold a worker thread and stall the burst loop.
        config = Config(
            connect_timeout=5, read_timeout=30, retries={"mode": "standard", "max_attempts": 4}
        )
        session = boto3.session.Session(profile_name=profile, region_name=region)
        return session.client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)

    return make


class AwsProvider:
    """Provisioner for one AWS region. See burst.ports.Provisioner for the contract."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        region: str,
        config: AwsLaunchConfig,
        user_data_template: str = DEFAULT_TEMPLATE,
    ) -> None:
        self._factory = client_factory
        self._region = region
        self._config = config
        self._template = user_data_template
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return PROVIDER

    @property
    def region(self) -> str:
        return self._region

    async def launch(self, request: LaunchRequest) -> InstanceInfo:
        """Start one instance (see Provisioner.launch); tries each subnet on capacity errors.

        Idempotent twice over: an instance already tagged with the burst id is returned as is,
        and RunInstances gets the burst id as ClientToken so a retried call after a lost
        answer does not start a second instance.
        """
        if request.region != self._region:
            raise PermanentBurstError(
                f"launch {request.burst_id} is for {request.region}, this provider serves "
                f"{self._region}"
            )
        existing = await self.describe([request.burst_id])
        if existing:
            log.info("burst_launch_reused", burst_id=request.burst_id, state=existing[0].state)
            return existing[0]
        boot = SpokeBoot(
            burst_id=request.burst_id,
            region=request.region,
            nats_url=self._config.nats_url,
            creds=request.spoke_creds,
            nats_ca=self._config.nats_ca,
            labels={
                "instance-type": request.instance_type,
                "market": request.market.value,
                # The hub reserves the spoke for the team it was rented for.
                "burst-team": request.team,
            },
            price_per_gpu_hour=request.price_per_hour / max(1, request.gpu_count),
            package=self._config.package,
            # EC2 gives a spot instance two minutes' notice in its metadata: the spoke drains.
            interruption_imds=IMDS_URL if request.market is Market.SPOT else None,
        )
        try:
            user_data = render_user_data(self._template, boot)
        except ValueError as exc:
            raise PermanentBurstError(f"launch {request.burst_id}: {exc}") from exc
        subnets: Sequence[str | None] = self._config.subnet_ids or (None,)
        failure: BurstError | None = None
        for index, subnet in enumerate(subnets):
            # A token per subnet: AWS refuses one token reused with other parameters.
            token = request.burst_id if index == 0 else f"{request.burst_id}-s{index}"
            params = self._run_params(request, user_data, subnet, token)
            try:
                reply = await self._call(request.offer, "run_instances", **params)
            except InsufficientCapacityError as exc:
                log.warning(
                    "burst_launch_no_capacity",
                    burst_id=request.burst_id,
                    instance_type=request.instance_type,
                    subnet=subnet,
                    provider_code=exc.provider_code,
                )
                failure = exc
                continue
            info = self._info(reply["Instances"][0])
            log.info(
                "burst_instance_launched",
                burst_id=request.burst_id,
                instance_id=info.provider_instance_id,
                instance_type=info.instance_type,
                zone=info.zone,
                market=info.market.value,
                team=info.team,
            )
            return info
        assert failure is not None
        raise failure

    async def describe(self, burst_ids: Sequence[str]) -> list[InstanceInfo]:
        """Instances tagged with these burst ids in this deployment (Provisioner.describe)."""
        found: list[InstanceInfo] = []
        unique = sorted(set(burst_ids))
        for start in range(0, len(unique), _FILTER_VALUES_MAX):
            filters = [
                *self._deployment_filters(),
                {
                    "Name": f"tag:{TAG_BURST_ID}",
                    "Values": unique[start : start + _FILTER_VALUES_MAX],
                },
            ]
            found.extend(await self._describe(filters))
        return found

    async def terminate(self, burst_ids: Sequence[str]) -> list[InstanceInfo]:
        """Terminate the instances of these burst ids; unknown or ended ones are a no-op."""
        live = [
            info
            for info in await self.describe(burst_ids)
            if info.state is not InstanceState.TERMINATED
        ]
        await self._terminate_instances(live)
        return live

    async def sweep_orphans(
        self, known_burst_ids: Collection[str], now: float, grace_s: float
    ) -> list[InstanceInfo]:
        """Terminate this deployment's live instances unknown to the store (Provisioner)."""
        known = set(known_burst_ids)
        filters = [
            *self._deployment_filters(),
            {"Name": "instance-state-name", "Values": _LIVE_STATES},
        ]
        orphans = [
            info
            for info in await self._describe(filters)
            if info.burst_id not in known
            and info.launched_at is not None
            and now - info.launched_at > grace_s
        ]
        await self._terminate_instances(orphans)
        for info in orphans:
            log.warning(
                "burst_orphan_terminated",
                burst_id=info.burst_id,
                instance_id=info.provider_instance_id,
                instance_type=info.instance_type,
                age_s=round(now - (info.launched_at or now)),
            )
        return orphans

    async def refresh_catalog(self, catalog: Catalog) -> Catalog:
        """`catalog` refreshed from this region's EC2 API (see burst.providers.aws_catalog)."""
        return await anyio.to_thread.run_sync(lambda: refresh_catalog(catalog, self._get_client()))

    # -- helpers ---------------------------------------------------------------------------

    def _run_params(
        self, request: LaunchRequest, user_data: str, subnet: str | None, token: str
    ) -> dict[str, Any]:
        config = self._config
        tags = {
            **config.extra_tags,
            "Name": f"gpufed-{request.burst_id}",
            TAG_MANAGED: "true",
            TAG_CLUSTER: config.cluster,
            TAG_BURST_ID: request.burst_id,
            TAG_TEAM: request.team,
            TAG_MARKET: request.market.value,
            TAG_PRICE: f"{request.price_per_hour:g}",
            TAG_GPU_MODEL: request.gpu_model,
            TAG_GPU_COUNT: str(request.gpu_count),
        }
        tag_list = [{"Key": key, "Value": value} for key, value in tags.items()]
        params: dict[str, Any] = {
            "ImageId": config.image_id,
            "InstanceType": request.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": token,
            "UserData": user_data,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
        }
        if config.root_volume_gib is not None:
            params["BlockDeviceMappings"] = [
                {
                    "DeviceName": config.root_device_name,
                    "Ebs": {
                        "VolumeSize": config.root_volume_gib,
                        "VolumeType": "gp3",
                        "DeleteOnTermination": True,
                    },
                }
            ]
        if request.market is Market.SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        if subnet is not None:
            params["SubnetId"] = subnet
        if config.security_group_ids:
            params["SecurityGroupIds"] = list(config.security_group_ids)
        if config.instance_profile:
            key = "Arn" if config.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: config.instance_profile}
        if config.key_name:
            params["KeyName"] = config.key_name
        return params

    def _deployment_filters(self) -> list[dict[str, Any]]:
        return [
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self._config.cluster]},
        ]

    async def _describe(self, filters: list[dict[str, Any]]) -> list[InstanceInfo]:
        def pages(client: Any) -> list[dict[str, Any]]:
            paginator = client.get_paginator("describe_instances")
            return [
                instance
                for page in paginator.paginate(Filters=filters)
                for reservation in page.get("Reservations", [])
                for instance in reservation.get("Instances", [])
            ]

        instances = await self._run(None, pages)
        return sorted((self._info(i) for i in instances), key=lambda i: i.burst_id)

    async def _terminate_instances(self, infos: Sequence[InstanceInfo]) -> None:
        ids = sorted({info.provider_instance_id for info in infos})
        if not ids:
            return
        try:
            await self._call(None, "terminate_instances", InstanceIds=ids)
        except PermanentBurstError as exc:
            if not exc.provider_code.startswith("InvalidInstanceID"):
                raise
            # Gone between describe and terminate: what we wanted. Retry one by one so a
            # single vanished id does not keep the others running.
            for instance_id in ids:
                try:
                    await self._call(None, "terminate_instances", InstanceIds=[instance_id])
                except PermanentBurstError as inner:
                    if not inner.provider_code.startswith("InvalidInstanceID"):
                        raise
        log.info("burst_instances_terminated", instance_ids=ids, region=self._region)

    def _info(self, instance: Mapping[str, Any]) -> InstanceInfo:
        tags = {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}
        lifecycle_spot = instance.get("InstanceLifecycle") == "spot"
        market_tag = tags.get(TAG_MARKET)
        market = Market(market_tag) if market_tag in ("spot", "on_demand") else None
        launch_time = instance.get("LaunchTime")
        return InstanceInfo(
            burst_id=tags.get(TAG_BURST_ID, instance["InstanceId"]),
            provider=PROVIDER,
            provider_instance_id=instance["InstanceId"],
            instance_type=instance.get("InstanceType", ""),
            region=self._region,
            zone=instance.get("Placement", {}).get("AvailabilityZone", ""),
            market=market or (Market.SPOT if lifecycle_spot else Market.ON_DEMAND),
            team=tags.get(TAG_TEAM, ""),
            state=_STATES.get(instance.get("State", {}).get("Name", ""), InstanceState.FAILED),
            launched_at=launch_time.timestamp() if launch_time is not None else None,
            price_per_hour=_float(tags.get(TAG_PRICE)),
            gpu_model=tags.get(TAG_GPU_MODEL, ""),
            gpu_count=int(_float(tags.get(TAG_GPU_COUNT))),
        )

    async def _call(self, offer: OfferKey | None, operation: str, **params: Any) -> Any:
        def invoke(client: Any) -> Any:
            return getattr(client, operation)(**params)

        return await self._run(offer, invoke)

    async def _run(self, offer: OfferKey | None, work: Callable[[Any], T]) -> T:
        def in_thread() -> T:
            try:
                return work(self._get_client())
            except (ClientError, BotoCoreError) as exc:
                raise translate_error(exc, offer) from exc

        return await anyio.to_thread.run_sync(in_thread)

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client


def _float(value: str | None) -> float:
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0
