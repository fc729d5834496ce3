"""Build and run the burst controller with the local or the AWS provider."""

from __future__ import annotations

import asyncio

from burst.catalog import Catalog, load_catalog
from burst.errors import CatalogError
from burst.ports import Provisioner
from burst.service import BurstController
from burst.settings import BurstSettings
from bus.client import Bus, BusSettings
from bus.identities import BURST, inbox_prefix
from bus.issuer import InstanceIssuer
from bus.metrics_http import serve_metrics
from gpufed.compose.signals import stop_on_signals
from gpufed.secretfile import read_secret_file


def build_burst(
    settings: BurstSettings,
    catalog: Catalog | None = None,
    provider: Provisioner | None = None,
    bus_name: str = "gpufed-burst",
) -> BurstController:
    """A controller; `catalog` defaults to `settings.catalog`, `provider` to `settings.provider`.

    Raises BurstError or ValueError on a bad catalog or provider configuration.
    """
    if catalog is None:
        catalog = load_catalog(settings.catalog)
    _check_regions(settings, catalog)
    if provider is None:
        provider = build_provider(settings, catalog)
    bus = Bus(
        BusSettings(
            url=settings.nats_url,
            name=bus_name,
            inbox_prefix=inbox_prefix(BURST),
            user_credentials=str(settings.nats_creds) if settings.nats_creds else None,
            tls_ca=str(settings.nats_ca) if settings.nats_ca else None,
        )
    )
    issuer = None
    if settings.nats_issuer is not None:
        issuer = InstanceIssuer(
            settings.nats_issuer,
            settings.nats_url,
            ttl_s=settings.instance_credential_ttl_s,
            tls_ca=str(settings.nats_ca) if settings.nats_ca else None,
        )
    return BurstController(settings, bus, provider, catalog, settings.policy(), issuer=issuer)


async def serve_burst(controller: BurstController, stop: asyncio.Event | None = None) -> None:
    """Run a built controller until SIGINT/SIGTERM (or `stop`)."""
    stop = stop or asyncio.Event()
    stop_on_signals(stop)
    settings = controller.settings
    if settings.metrics_port is None:
        await controller.run(stop)
        return
    from burst.metrics import BurstMetrics

    metrics = BurstMetrics(controller)
    await asyncio.gather(
        controller.run(stop),
        serve_metrics(metrics.registry, settings.metrics_host, settings.metrics_port, stop),
    )


def _check_regions(settings: BurstSettings, catalog: Catalog) -> None:
    """Refuse a controller that could never launch: no catalog price in any region it may use
    (an --aws-region or --region the catalog does not list would otherwise skip every demand
    as `no_offer`, found only in its log)."""
    regions = settings.policy().regions
    offered = {offer.region for offer in catalog.offers()}
    if regions is None or regions & offered:
        return
    if not regions:
        raise CatalogError(
            f"--region leaves out --aws-region {settings.aws_region}, the one region the aws "
            "provider launches in: burst could launch nothing"
        )
    source = settings.catalog or "the default catalog"
    raise CatalogError(
        f"burst may launch in {', '.join(sorted(regions))}, where {source} prices no instance "
        f"type (it prices {', '.join(sorted(offered)) or 'none'}): add the region to a "
        "--catalog file or choose one it prices"
    )


def build_provider(settings: BurstSettings, catalog: Catalog) -> Provisioner:
    """The configured Provisioner (boto3 is imported only for `aws`)."""
    if settings.provider == "local":
        from burst.providers.local import LocalProvider

        return LocalProvider(
            settings.state_dir,
            settings.spoke_url,
            catalog,
            settings.python,
            settings.spoke_heartbeat_s,
            stop_grace_s=settings.local_stop_grace_s,
            nats_ca=settings.nats_ca,
        )
    from burst.providers.aws import AwsLaunchConfig, AwsProvider, ec2_client_factory

    if not settings.aws_image_id:
        raise ValueError("--provider aws needs --aws-image-id")
    config = AwsLaunchConfig(
        image_id=settings.aws_image_id,
        nats_url=settings.spoke_url,
        subnet_ids=settings.aws_subnet_ids,
        security_group_ids=settings.aws_security_group_ids,
        instance_profile=settings.aws_instance_profile,
        key_name=settings.aws_key_name,
        root_volume_gib=settings.aws_root_volume_gib,
        root_device_name=settings.aws_root_device_name,
        cluster=settings.aws_cluster,
        package=settings.aws_package,
        # The instances check the hub's NATS server against the same CA as this controller.
        nats_ca=(
            None if settings.nats_ca is None else read_secret_file(settings.nats_ca, "--nats-ca")
        ),
    )
    factory = ec2_client_factory(
        settings.aws_region, settings.aws_endpoint_url, settings.aws_profile
    )
    return AwsProvider(factory, settings.aws_region, config)
