"""The instance catalog: GPU instance types and their prices per region, read from YAML."""

from __future__ import annotations

from datetime import date, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from burst.core.model import Offer
from burst.errors import CatalogError
from schemas.burst import Market

DEFAULT_CATALOG = "catalog_default.yaml"


class RegionPrices(BaseModel):
    """$/h of one instance type in one region; None: not sold that way there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_demand: float | None = Field(default=None, gt=0)
    spot: float | None = Field(default=None, gt=0)


class InstanceTypeSpec(BaseModel):
    """One instance type: its GPUs and where it is sold at what price."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    gpu_model: str = Field(min_length=1, max_length=63)
    gpu_count: int = Field(ge=1, le=64)
    gpu_memory_gib: float = Field(gt=0, description="Memory of one GPU.")
    vcpus: int = Field(ge=1)
    prices: dict[str, RegionPrices] = Field(default_factory=dict)


class Catalog(BaseModel):
    """Instance types burst may buy. Plain data: the planner reads it, never changes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    as_of: date = Field(description="Date the prices were taken.")
    source: str = ""
    refreshed_at: datetime | None = Field(
        default=None, description="Last refresh from the provider's API, if any."
    )
    instance_types: tuple[InstanceTypeSpec, ...]

    @model_validator(mode="after")
    def _unique_names(self) -> Catalog:
        names = [spec.name for spec in self.instance_types]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"instance types listed twice: {', '.join(repeated)}")
        return self

    def offers(self) -> tuple[Offer, ...]:
        """Every (instance type, region, market) with a price, in a stable order."""
        found: list[Offer] = []
        for spec in self.instance_types:
            for region, prices in sorted(spec.prices.items()):
                for market, price in (
                    (Market.ON_DEMAND, prices.on_demand),
                    (Market.SPOT, prices.spot),
                ):
                    if price is not None:
                        found.append(
                            Offer(
                                instance_type=spec.name,
                                region=region,
                                market=market,
                                price_per_hour=price,
                                gpu_model=spec.gpu_model,
                                gpu_count=spec.gpu_count,
                                gpu_memory_gib=spec.gpu_memory_gib,
                            )
                        )
        return tuple(found)

    def get(self, name: str) -> InstanceTypeSpec | None:
        """The instance type called `name`, or None."""
        return next((spec for spec in self.instance_types if spec.name == name), None)


def parse_catalog(text: str, source: str = "<catalog>") -> Catalog:
    """Parse catalog YAML; raises CatalogError naming the file and the field at fault."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CatalogError(f"{source}: expected a mapping with 'as_of' and 'instance_types'")
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise CatalogError(f"{source}: invalid catalog: {problems}") from exc


def load_catalog(path: Path | str | None = None) -> Catalog:
    """Read a catalog file; without a path, the dated default shipped with gpufed."""
    if path is None:
        text = resources.files("burst").joinpath(DEFAULT_CATALOG).read_text(encoding="utf-8")
        return parse_catalog(text, DEFAULT_CATALOG)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read catalog: {exc.strerror or exc}") from exc
    return parse_catalog(text, str(path))
