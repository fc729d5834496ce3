"""Simulated spokes: free devices kept incrementally, turned into a placement Snapshot.

The frozen `Node` and `Spoke` objects plan() reads are rebuilt only for nodes whose devices
changed since the last snapshot; unchanged nodes and spokes are reused as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufed.replay.fleet import Fleet, SpokeSpec
from hub.core.model import Node, Snapshot, Spoke
from schemas import Assignment, SpokeKind

_EPS = 1e-9


class SimNode:
    """One node's free devices: wholly free ones, and shared ones with the share left."""

    __slots__ = ("count", "free", "labels", "model", "name", "node", "shared")

    def __init__(self, name: str, model: str, count: int, labels: dict[str, str]) -> None:
        self.name = name
        self.model = model
        self.count = count
        self.labels = labels
        self.free: set[int] = set(range(count))
        self.shared: dict[int, float] = {}
        self.node: Node | None = None  # cached view; None when it changed

    def view(self) -> Node:
        """The node as plan() sees it now."""
        node = self.node
        if node is None:
            node = self.node = Node(
                name=self.name,
                gpu_model=self.model,
                gpu_count=self.count,
                free=tuple(sorted(self.free)),
                free_fraction=dict(self.shared),
                labels=self.labels,
            )
        return node


class SimSpoke:
    """One spoke: its nodes by name, and a cached view rebuilt when a node changed."""

    __slots__ = ("by_name", "dirty", "nodes", "spec", "spoke", "workloads")

    def __init__(self, spec: SpokeSpec) -> None:
        self.spec = spec
        self.nodes = [SimNode(n.name, n.gpu_model, n.gpu_count, n.labels) for n in spec.nodes]
        self.by_name = {n.name: n for n in self.nodes}
        self.spoke: Spoke | None = None
        self.dirty: list[SimNode] = []
        self.workloads = 0  # workloads holding devices here

    def view(self) -> Spoke:
        """The spoke as plan() sees it now."""
        if self.dirty:
            for node in self.dirty:
                node.node = None
            self.dirty.clear()
            self.spoke = None
        spoke = self.spoke
        if spoke is None:
            spec = self.spec
            spoke = self.spoke = Spoke(
                id=spec.id,
                region=spec.region,
                kind=spec.kind,
                nodes=tuple(n.view() for n in self.nodes),
                labels=spec.labels,
                price_per_gpu_hour=spec.price_per_gpu_hour,
                reserved_for=spec.reserved_for,
            )
        return spoke


class Cluster:
    """Every simulated spoke, on-prem and cloud; hands out and takes back devices."""

    def __init__(self, fleet: Fleet) -> None:
        self.spokes: dict[str, SimSpoke] = {}
        self._snapshot: Snapshot | None = None
        for spec in fleet.spokes:
            self.add(spec)

    def add(self, spec: SpokeSpec) -> None:
        """A spoke joins (a booted cloud instance)."""
        if spec.id in self.spokes:
            raise ValueError(f"spoke {spec.id} already exists")
        self.spokes[spec.id] = SimSpoke(spec)
        self._snapshot = None

    def remove(self, spoke_id: str) -> None:
        """A spoke leaves (a terminated cloud instance); it must hold no work."""
        spoke = self.spokes.pop(spoke_id)
        if spoke.workloads:
            raise ValueError(f"spoke {spoke_id} still runs {spoke.workloads} workloads")
        self._snapshot = None

    def is_cloud(self, spoke_id: str) -> bool:
        """Whether the spoke is a cloud spoke."""
        return self.spokes[spoke_id].spec.kind is SpokeKind.CLOUD

    def snapshot(self) -> Snapshot:
        """The fleet as plan() sees it now, unchanged nodes and spokes reused."""
        snapshot = self._snapshot
        if snapshot is None or any(s.dirty for s in self.spokes.values()):
            snapshot = self._snapshot = Snapshot(
                spokes=tuple(s.view() for s in self.spokes.values())
            )
        return snapshot

    def take(self, spoke_id: str, assignments: Iterable[Assignment]) -> None:
        """Give devices to a workload (as the spoke does when it starts it)."""
        spoke = self.spokes[spoke_id]
        spoke.workloads += 1
        for a in assignments:
            node = spoke.by_name[a.node]
            spoke.dirty.append(node)
            for device in a.devices:
                if a.fraction is None:
                    if device not in node.free:
                        raise ValueError(f"{spoke_id}/{a.node} GPU {device} is not free")
                    node.free.discard(device)
                elif device in node.free:
                    node.free.discard(device)
                    node.shared[device] = 1.0 - a.fraction
                else:
                    left = node.shared.get(device, 0.0) - a.fraction
                    if left < -_EPS:
                        raise ValueError(f"{spoke_id}/{a.node} GPU {device} is over-committed")
                    node.shared[device] = max(0.0, left)

    def give_back(self, spoke_id: str, assignments: Iterable[Assignment]) -> None:
        """Free a workload's devices (it ended or was stopped)."""
        spoke = self.spokes[spoke_id]
        spoke.workloads -= 1
        for a in assignments:
            node = spoke.by_name[a.node]
            spoke.dirty.append(node)
            for device in a.devices:
                if a.fraction is None:
                    node.free.add(device)
                    continue
                left = node.shared.get(device, 0.0) + a.fraction
                if left >= 1.0 - _EPS:
                    node.shared.pop(device, None)
                    node.free.add(device)
                else:
                    node.shared[device] = left
