"""Inventories: simulated GPUs from a file; real GPUs through NVML, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from spoke.errors import PermanentSpokeError
from spoke.inventory.models import short_model
from spoke.inventory.nvml import NvmlInventory
from spoke.inventory.static import StaticInventory


async def test_static_inventory_expands_node_groups(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(
        "nodes:\n"
        "  - {prefix: eu-n, count: 2, gpu_model: H100, gpu_count: 8, labels: {zone: a}}\n"
        "  - {name: big, gpu_model: A100, gpu_count: 4}\n"
    )
    nodes = await StaticInventory.from_file(path).nodes()
    assert [(n.name, n.gpu_model, n.gpu_count) for n in nodes] == [
        ("eu-n0", "H100", 8),
        ("eu-n1", "H100", 8),
        ("big", "A100", 4),
    ]
    assert nodes[0].labels == {"zone": "a"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nodes: []", "nodes"),
        ("nodes:\n  - {name: a, gpu_model: H100, gpu_count: 99}", "gpu_count"),
        (
            "nodes:\n"
            "  - {name: a, gpu_model: H100, gpu_count: 1}\n"
            "  - {name: a, gpu_model: H100, gpu_count: 1}",
            "twice",
        ),
        ("{not yaml", "not YAML"),
    ],
)
def test_static_inventory_refuses_bad_files_clearly(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(PermanentSpokeError, match=needle):
        StaticInventory.from_file(path)


def test_missing_inventory_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PermanentSpokeError, match="cannot read inventory file"):
        StaticInventory.from_file(tmp_path / "nope.yaml")


def test_nvml_without_gpus_fails_with_a_clear_message() -> None:
    # This machine has no NVIDIA driver: the spoke must say so, not crash.
    with pytest.raises(PermanentSpokeError, match="no NVIDIA GPUs usable here"):
        NvmlInventory()


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_model_names_from_nvml_products(product: str, model: str) -> None:
    assert short_model(product) == model
