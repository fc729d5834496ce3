"""Which devices of a node the spoke's own placements use, and whether a new one fits."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from schemas import Assignment, NodeCapacity, PlaceCommand, RuntimeCapabilities, mig_profile
from spoke.ports import NodeInventory

_EPS = 1e-9

Allocations = Iterable[tuple[int, tuple[Assignment, ...]]]  # (epoch, assignments) per workload


def usage(allocations: Allocations, node: str) -> tuple[set[int], dict[int, float]]:
    """Devices of `node` held whole, and the share used of each shared device."""
    whole: set[int] = set()
    shared: dict[int, float] = defaultdict(float)
    for _epoch, assignments in allocations:
        for a in assignments:
            if a.node != node:
                continue
            if a.fraction is None:
                whole.update(a.devices)
            else:
                for d in a.devices:
                    shared[d] += a.fraction
    return whole, shared


def check_assignments(
    command: PlaceCommand,
    nodes: Mapping[str, NodeInventory],
    allocations: Allocations,
    spoke_id: str,
) -> str | None:
    """Why this assignment cannot be honoured here, or None."""
    held = list(allocations)
    for a in command.assignments:
        node = nodes.get(a.node)
        if node is None:
            return f"no node {a.node!r} on spoke {spoke_id}"
        bad = [d for d in a.devices if not 0 <= d < node.gpu_count]
        if bad:
            return f"node {a.node} has no device {bad[0]} (it has {node.gpu_count})"
        whole, shared = usage(held, a.node)
        for d in a.devices:
            if d in whole:
                return f"device {d} of node {a.node} is in use"
            if a.fraction is None and d in shared:
                return f"device {d} of node {a.node} is shared by fractional work"
            if a.fraction is not None and shared.get(d, 0.0) + a.fraction > 1.0 + _EPS:
                return f"device {d} of node {a.node} has only {1 - shared[d]:g} free"
    return None


def node_capacity(node: NodeInventory, allocations: Allocations, draining: bool) -> NodeCapacity:
    """How a node is reported: its devices free of the spoke's placements and of others' use."""
    whole, shared = usage(allocations, node.name)
    free = [d for d in range(node.gpu_count) if d not in whole and d not in shared]
    if node.busy_outside:
        free = free[: max(0, len(free) - node.busy_outside)]
    return NodeCapacity(
        name=node.name,
        gpu_model=node.gpu_model,
        gpu_count=node.gpu_count,
        free_devices=tuple(free),
        device_free_fraction={d: max(0.0, 1.0 - used) for d, used in shared.items()},
        labels=node.labels,
        schedulable=node.schedulable and not draining,
    )


def with_mig_profiles(caps: RuntimeCapabilities, names: Iterable[str]) -> RuntimeCapabilities:
    """The runtime's capabilities and, where it runs MIG, the profiles its nodes' names show."""
    if not caps.mig:
        return caps
    profiles = sorted({p for name in names if (p := mig_profile(name)) is not None})
    return caps.model_copy(update={"mig_profiles": tuple(profiles)})
