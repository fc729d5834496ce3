"""Small builders of burst planner inputs for the unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from burst.catalog import Catalog
from burst.core import CloudInstance
from schemas.burst import DemandItem, DemandReport, InstanceState, Market

NOW = 10_000.0


def item(team: str = "ml", **fields: Any) -> DemandItem:
    """A demand item, old enough to burst unless `oldest_age_s` says otherwise."""
    fields.setdefault("oldest_age_s", 600.0)
    if "workload_ids" not in fields:
        count = fields.get("count", 1)
        fields["workload_ids"] = tuple(f"{team}-w{n}" for n in range(count))
    return DemandItem(team=team, **fields)


def report(*items: DemandItem, sent_at: float = NOW, seq: int = 7) -> DemandReport:
    return DemandReport(items=items, sent_at=sent_at, seq=seq)


def instance(id: str = "burst-0-0-aaaa", **fields: Any) -> CloudInstance:
    """A live instance; running and busy unless told otherwise."""
    defaults: dict[str, Any] = {
        "instance_type": "p5.48xlarge",
        "region": "us-east-1",
        "market": Market.SPOT,
        "team": "ml",
        "state": InstanceState.RUNNING,
        "launched_at": NOW - 3600,
        "price_per_hour": 45.0,
    }
    defaults.update(fields)
    return CloudInstance(id=id, **defaults)


def catalog(*types: tuple[str, str, int, dict[str, tuple[float | None, float | None]]]) -> Catalog:
    """A catalog of (name, gpu_model, gpu_count, {region: (on_demand, spot)})."""
    return Catalog.model_validate(
        {
            "as_of": "2025-01-15",
            "instance_types": [
                {
                    "name": name,
                    "gpu_model": model,
                    "gpu_count": count,
                    "gpu_memory_gib": 80,
                    "vcpus": 8 * count,
                    "prices": {
                        region: {"on_demand": od, "spot": spot}
                        for region, (od, spot) in prices.items()
                    },
                }
                for name, model, count, prices in types
            ],
        }
    )


def launched_ids(launches: Sequence[Any]) -> list[str]:
    return sorted(w for launch in launches for w in launch.workload_ids)
