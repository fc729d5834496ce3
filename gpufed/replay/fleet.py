"""The simulated fleet: read from YAML (or Alibaba's node list) into plain spoke specs.

```yaml
spokes:
  - id: philly-1
    region: us-east
    kind: onprem                 # or cloud
    price_per_gpu_hour: 0        # optional
    labels: {}                   # optional
    nodes:                       # the static inventory's node entries
      - {prefix: p1-, count: 118, gpu_model: P100, gpu_count: 8}
      - {name: big-1, gpu_model: A100, gpu_count: 8, labels: {ib: "true"}}
```
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas import SpokeKind


class FleetError(ValueError):
    """The fleet file is not valid; the message names the file and the field at fault."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One simulated GPU node."""

    name: str
    gpu_model: str
    gpu_count: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpokeSpec:
    """One simulated spoke (cluster) and its nodes."""

    id: str
    region: str
    kind: SpokeKind
    nodes: tuple[NodeSpec, ...]
    labels: dict[str, str] = field(default_factory=dict)
    price_per_gpu_hour: float = 0.0
    reserved_for: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        """GPUs on all its nodes."""
        return sum(node.gpu_count for node in self.nodes)


@dataclass(frozen=True, slots=True)
class Fleet:
    """Every spoke of a replay."""

    spokes: tuple[SpokeSpec, ...]

    @property
    def gpus(self) -> int:
        """On-prem GPUs (what utilisation is measured against)."""
        return sum(s.gpus for s in self.spokes if s.kind is SpokeKind.ONPREM)

    @property
    def max_node_gpus(self) -> int:
        """GPUs of the largest node (wider jobs become gangs of such nodes)."""
        return max((n.gpu_count for s in self.spokes for n in s.nodes), default=0)


def load_fleet(path: Path) -> Fleet:
    """Read a fleet YAML file, or Alibaba's `openb_node_list_*.csv` (one on-prem spoke)."""
    if path.suffix.lower() == ".csv":
        return load_openb_nodes(path)
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetError(f"{path}: cannot read fleet: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise FleetError(f"{path}: not valid YAML: {exc}") from exc
    return fleet_from_dict(data, str(path))


def fleet_from_dict(data: Any, source: str = "<fleet>") -> Fleet:
    """Build a fleet from its dict form; raises FleetError naming the field at fault."""
    try:
        doc = _FleetDoc.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise FleetError(f"{source}: invalid fleet: {problems}") from exc
    spokes = []
    seen: set[str] = set()
    for entry in doc.spokes:
        if entry.id in seen:
            raise FleetError(f"{source}: spokes[{entry.id}]: defined more than once")
        seen.add(entry.id)
        nodes = _expand(entry.nodes, f"{source}: spokes[{entry.id}]")
        spokes.append(
            SpokeSpec(
                id=entry.id,
                region=entry.region,
                kind=entry.kind,
                nodes=nodes,
                labels=dict(entry.labels),
                price_per_gpu_hour=entry.price_per_gpu_hour,
            )
        )
    return Fleet(tuple(spokes))


def load_openb_nodes(path: Path, region: str = "openb") -> Fleet:
    """Alibaba's GPU node list (`sn,cpu_milli,memory_mib,gpu,model`) as one on-prem spoke.

    Nodes without GPUs are left out (only GPUs are simulated).
    """
    nodes = []
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise FleetError(f"{path}: cannot read node list: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        if not {"sn", "gpu", "model"} <= set(reader.fieldnames or ()):
            raise FleetError(f"{path} line 1: expected columns sn, gpu and model")
        for row in reader:
            try:
                gpus = int(row["gpu"])
            except (TypeError, ValueError):
                raise FleetError(
                    f"{path} line {reader.line_num}, column gpu: {row['gpu']!r} is not a count"
                ) from None
            if gpus > 0:
                nodes.append(NodeSpec(row["sn"], (row["model"] or "GPU").strip(), gpus))
    if not nodes:
        raise FleetError(f"{path}: no GPU nodes")
    return Fleet((SpokeSpec("openb", region, SpokeKind.ONPREM, tuple(nodes)),))


class _NodeEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    prefix: str | None = None
    count: int = Field(default=1, ge=1, le=100_000)
    gpu_model: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    gpu_count: int = Field(ge=1, le=64)
    labels: dict[str, str] = Field(default_factory=dict)


class _SpokeEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
    region: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    kind: SpokeKind = SpokeKind.ONPREM
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    nodes: list[_NodeEntry] = Field(min_length=1)


class _FleetDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spokes: list[_SpokeEntry] = Field(min_length=1)


def _expand(entries: list[_NodeEntry], where: str) -> tuple[NodeSpec, ...]:
    nodes: list[NodeSpec] = []
    for e in entries:
        if e.name and e.count == 1:
            names = [e.name]
        else:
            prefix = e.prefix if e.prefix is not None else (e.name or e.gpu_model.lower()) + "-"
            names = [f"{prefix}{i}" for i in range(e.count)]
        nodes += [NodeSpec(n, e.gpu_model, e.gpu_count, dict(e.labels)) for n in names]
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise FleetError(f"{where}: node {node.name!r} listed twice")
        seen.add(node.name)
    return tuple(nodes)
