"""The instance catalog: the shipped default parses, bad files fail with a usable message."""

from __future__ import annotations

from pathlib import Path

import pytest

from burst.catalog import load_catalog, parse_catalog
from burst.errors import CatalogError, PermanentBurstError
from schemas.burst import Market

REQUIRED_TYPES = {
    "p4d.24xlarge": ("A100", 8, 40),
    "p4de.24xlarge": ("A100", 8, 80),
    "p5.48xlarge": ("H100", 8, 80),
    "p5en.48xlarge": ("H200", 8, 141),
    "g5.xlarge": ("A10G", 1, 24),
    "g5.12xlarge": ("A10G", 4, 24),
    "g5.48xlarge": ("A10G", 8, 24),
    "g6.xlarge": ("L4", 1, 24),
    "g6.12xlarge": ("L4", 4, 24),
    "g6e.xlarge": ("L40S", 1, 48),
    "g6e.12xlarge": ("L40S", 4, 48),
}


def test_default_catalog_lists_the_gpu_types_with_dated_prices() -> None:
    catalog = load_catalog()
    assert catalog.as_of.year >= 2024
    assert "approximate" in catalog.source
    for name, (model, count, memory) in REQUIRED_TYPES.items():
        spec = catalog.get(name)
        assert spec is not None, name
        assert (spec.gpu_model, spec.gpu_count, spec.gpu_memory_gib) == (model, count, memory)
    regions = {region for spec in catalog.instance_types for region in spec.prices}
    assert {"us-east-1", "us-west-2", "eu-west-1"} <= regions
    for spec in catalog.instance_types:
        for prices in spec.prices.values():
            # spot is a discount on on-demand where both are listed
            if prices.spot is not None and prices.on_demand is not None:
                assert prices.spot < prices.on_demand


def test_offers_cover_each_priced_market() -> None:
    catalog = parse_catalog(
        """
as_of: 2025-01-15
instance_types:
  - {name: x.big, gpu_model: H100, gpu_count: 8, gpu_memory_gib: 80, vcpus: 96,
     prices: {us-east-1: {on_demand: 10, spot: 4}, eu-west-1: {on_demand: 12}}}
"""
    )
    offers = [(o.instance_type, o.region, o.market, o.price_per_hour) for o in catalog.offers()]
    assert offers == [
        ("x.big", "eu-west-1", Market.ON_DEMAND, 12),
        ("x.big", "us-east-1", Market.ON_DEMAND, 10),
        ("x.big", "us-east-1", Market.SPOT, 4),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("as_of: [unclosed", "not valid YAML"),
        ("- a list", "expected a mapping"),
        ("instance_types: []", "as_of: Field required"),
        (
            "as_of: 2025-01-15\ninstance_types:\n  - {name: a, gpu_model: L4, gpu_count: 0,"
            " gpu_memory_gib: 24, vcpus: 4}",
            "instance_types.0.gpu_count: Input should be greater than or equal to 1",
        ),
        (
            "as_of: 2025-01-15\ninstance_types:\n  - {name: a, gpu_model: L4, gpu_count: 1,"
            " gpu_memory_gib: 24, vcpus: 4, prices: {us-east-1: {spot: -1}}}",
            "instance_types.0.prices.us-east-1.spot: Input should be greater than 0",
        ),
        (
            "as_of: 2025-01-15\ninstance_types:\n  - {name: a, gpu_model: L4, gpu_count: 1,"
            " gpu_memory_gib: 24, vcpus: 4, gpus: 2}",
            "instance_types.0.gpus: Extra inputs are not permitted",
        ),
        (
            "as_of: 2025-01-15\ninstance_types:\n"
            "  - {name: a, gpu_model: L4, gpu_count: 1, gpu_memory_gib: 24, vcpus: 4}\n"
            "  - {name: a, gpu_model: L4, gpu_count: 1, gpu_memory_gib: 24, vcpus: 4}",
            "instance types listed twice: a",
        ),
    ],
)
def test_invalid_catalogs_name_the_fault(text: str, message: str) -> None:
    with pytest.raises(CatalogError, match=r"my\.yaml") as caught:
        parse_catalog(text, "my.yaml")
    assert message in str(caught.value)
    assert isinstance(caught.value, PermanentBurstError)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read catalog"):
        load_catalog(tmp_path / "nope.yaml")


def test_load_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(
        "as_of: 2025-02-01\ninstance_types:\n  - {name: a, gpu_model: L4, gpu_count: 1,"
        " gpu_memory_gib: 24, vcpus: 4, prices: {us-east-1: {on_demand: 1}}}\n"
    )
    assert [o.instance_type for o in load_catalog(path).offers()] == ["a"]
