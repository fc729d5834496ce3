"""Refresh the catalog from the EC2 API: GPU data, availability and spot prices of one region.

Blocking (boto3): call it through anyio.to_thread.run_sync from async code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog
from botocore.exceptions import BotoCoreError, ClientError

from burst.catalog import Catalog, InstanceTypeSpec, RegionPrices
from burst.providers.aws_errors import translate_error

log = structlog.get_logger(__name__)

_LINUX = "Linux/UNIX"


def refresh_catalog(catalog: Catalog, ec2_client: Any, now: datetime | None = None) -> Catalog:
    """A copy of `catalog` updated from the EC2 API of `ec2_client`'s region.

    - GPU model, count, per-GPU memory and vCPUs from DescribeInstanceTypes (all regions).
    - The region's prices are dropped for types DescribeInstanceTypeOfferings says are not
      sold there.
    - Spot price: the latest Linux price of each zone, the highest zone taken as the region's
      (a budget check must not count on the cheapest zone having capacity).
    On-demand prices stay as listed (the EC2 API does not serve them). Raises BurstError.
    """
    region = str(ec2_client.meta.region_name)
    names = [spec.name for spec in catalog.instance_types]
    if not names:
        return catalog
    try:
        hardware = _describe_types(ec2_client, names)
        offered = _offered(ec2_client, names)
        spot = _spot_prices(ec2_client, names, now or datetime.now(UTC))
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, None) from exc
    specs = [
        _refreshed(spec, hardware.get(spec.name), region, offered, spot)
        for spec in catalog.instance_types
    ]
    log.info(
        "burst_catalog_refreshed",
        region=region,
        types=len(names),
        offered=len(offered),
        spot_prices=len(spot),
    )
    return Catalog.model_validate(
        {
            **catalog.model_dump(),
            "instance_types": [spec.model_dump() for spec in specs],
            "refreshed_at": now or datetime.now(UTC),
        }
    )


def _refreshed(
    spec: InstanceTypeSpec,
    hardware: Mapping[str, Any] | None,
    region: str,
    offered: set[str],
    spot: Mapping[str, float],
) -> InstanceTypeSpec:
    update: dict[str, Any] = {}
    if hardware is not None:
        gpus = hardware.get("GpuInfo", {}).get("Gpus", [])
        if gpus:
            update["gpu_model"] = str(gpus[0]["Name"])
            update["gpu_count"] = sum(int(gpu.get("Count", 0)) for gpu in gpus)
            memory = gpus[0].get("MemoryInfo", {}).get("SizeInMiB")
            if memory:
                update["gpu_memory_gib"] = round(float(memory) / 1024, 1)
        else:
            log.warning("burst_catalog_type_without_gpus", instance_type=spec.name)
        vcpus = hardware.get("VCpuInfo", {}).get("DefaultVCpus")
        if vcpus:
            update["vcpus"] = int(vcpus)
    prices = dict(spec.prices)
    if spec.name not in offered:
        if prices.pop(region, None) is not None:
            log.info("burst_catalog_type_not_offered", instance_type=spec.name, region=region)
    elif spec.name in spot:
        current = prices.get(region, RegionPrices())
        prices[region] = current.model_copy(update={"spot": spot[spec.name]})
    update["prices"] = prices
    return spec.model_copy(update=update)


def _describe_types(client: Any, names: list[str]) -> dict[str, Mapping[str, Any]]:
    paginator = client.get_paginator("describe_instance_types")
    return {
        item["InstanceType"]: item
        for page in paginator.paginate(InstanceTypes=names)
        for item in page.get("InstanceTypes", [])
    }


def _offered(client: Any, names: list[str]) -> set[str]:
    paginator = client.get_paginator("describe_instance_type_offerings")
    pages: Iterable[Mapping[str, Any]] = paginator.paginate(
        LocationType="region", Filters=[{"Name": "instance-type", "Values": names}]
    )
    return {
        item["InstanceType"] for page in pages for item in page.get("InstanceTypeOfferings", [])
    }


def _spot_prices(client: Any, names: list[str], now: datetime) -> dict[str, float]:
    # StartTime=now asks for the price in effect now in each zone.
    paginator = client.get_paginator("describe_spot_price_history")
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for page in paginator.paginate(
        InstanceTypes=names, ProductDescriptions=[_LINUX], StartTime=now
    ):
        for item in page.get("SpotPriceHistory", []):
            if not str(item.get("ProductDescription", "")).startswith(_LINUX):
                continue
            key = (item["InstanceType"], item["AvailabilityZone"])
            seen = latest.get(key)
            if seen is None or item["Timestamp"] > seen[0]:
                latest[key] = (item["Timestamp"], float(item["SpotPrice"]))
    prices: dict[str, float] = {}
    for (instance_type, _zone), (_, price) in latest.items():
        prices[instance_type] = max(prices.get(instance_type, 0.0), price)
    return prices
