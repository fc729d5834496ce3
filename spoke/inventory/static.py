"""Simulated GPUs from a YAML file: the embedded default and the tests use it.

```yaml
nodes:
  - name: eu1-a          # or `prefix: eu1-` with `count: 2` for eu1-0, eu1-1
    gpu_model: H100
    gpu_count: 8
    labels: {zone: a}
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from spoke.errors import PermanentSpokeError
from spoke.ports import NodeInventory


class _NodeEntry(BaseModel):
    name: str | None = None
    prefix: str | None = None
    count: int = Field(default=1, ge=1, le=10_000)
    gpu_model: str
    gpu_count: int = Field(ge=0, le=64)
    labels: dict[str, str] = Field(default_factory=dict)
    schedulable: bool = True


class _InventoryFile(BaseModel):
    nodes: list[_NodeEntry] = Field(min_length=1)


class StaticInventory:
    """Nodes read once from a file (or given directly)."""

    def __init__(self, nodes: list[NodeInventory]) -> None:
        self._nodes = nodes

    @classmethod
    def from_file(cls, path: Path) -> StaticInventory:
        try:
            raw: Any = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise PermanentSpokeError(f"cannot read inventory file {path}: {exc}") from exc
        except yaml.YAMLError as exc:
            raise PermanentSpokeError(f"inventory file {path} is not YAML: {exc}") from exc
        try:
            parsed = _InventoryFile.model_validate(raw)
        except ValidationError as exc:
            raise PermanentSpokeError(f"inventory file {path}: {exc}") from exc
        return cls(expand(parsed.nodes))

    async def nodes(self) -> list[NodeInventory]:
        return list(self._nodes)


def expand(entries: list[_NodeEntry]) -> list[NodeInventory]:
    nodes: list[NodeInventory] = []
    for e in entries:
        if e.name and e.count == 1:
            names = [e.name]
        else:
            prefix = e.prefix if e.prefix is not None else (e.name or e.gpu_model.lower()) + "-"
            names = [f"{prefix}{i}" for i in range(e.count)]
        nodes += [
            NodeInventory(
                name=n,
                gpu_model=e.gpu_model,
                gpu_count=e.gpu_count,
                labels=e.labels,
                schedulable=e.schedulable,
            )
            for n in names
        ]
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise PermanentSpokeError(f"inventory lists node {node.name!r} twice")
        seen.add(node.name)
    return nodes
