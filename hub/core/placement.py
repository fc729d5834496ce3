"""First-fit placement of pending workloads onto free GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from hub.core.model import (
    Node,
    Placement,
    Plan,
    Reason,
    RunningWorkload,
    Snapshot,
    Spoke,
    Unplaced,
    Workload,
)
from hub.core.policy import Policy
from schemas import Assignment, SpokeKind, WorkloadSpec

_EPS = 1e-9


def plan(
    snapshot: Snapshot,
    pending: Sequence[Workload],
    running: Sequence[RunningWorkload],
    policy: Policy,
    now: float,
) -> Plan:
    """Place what fits, highest priority first, then oldest; explain the rest.

    Pure: reads only its arguments and never mutates them.
    """
    del running, now  # used by the policy engine (preemption, aging)
    free = _FreeMap(snapshot)
    order = sorted(
        pending, key=lambda w: (-policy.priority(w.spec.priority_class), w.submitted_at, w.id)
    )
    placements: list[Placement] = []
    unplaced: list[Unplaced] = []
    for workload in order:
        placement = _place_one(workload, snapshot, free)
        if placement is not None:
            placements.append(placement)
        else:
            unplaced.append(_explain(workload, snapshot))
    return Plan(placements=tuple(placements), unplaced=tuple(unplaced))


class _FreeMap:
    """Mutable working copy of free devices, so the input snapshot stays untouched."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.whole: dict[tuple[str, str], list[int]] = {}
        self.shared: dict[tuple[str, str], dict[int, float]] = {}
        for spoke in snapshot.spokes:
            for node in spoke.nodes:
                key = (spoke.id, node.name)
                self.whole[key] = list(node.free)
                self.shared[key] = dict(node.free_fraction)


def _candidate_spokes(spec: WorkloadSpec, snapshot: Snapshot) -> list[Spoke]:
    regions = spec.affinity.required_regions
    spokes = [
        s for s in snapshot.spokes if s.accepts_work and (not regions or s.region in regions)
    ]
    preferred = spec.affinity.preferred_regions
    return sorted(
        spokes,
        key=lambda s: (s.kind != SpokeKind.ONPREM, bool(preferred) and s.region not in preferred),
    )


def _node_matches(node: Node, spec: WorkloadSpec) -> bool:
    if not node.schedulable:
        return False
    if spec.gpu_models and node.gpu_model not in spec.gpu_models:
        return False
    return all(node.labels.get(k) == v for k, v in spec.affinity.required_labels.items())


def _place_one(workload: Workload, snapshot: Snapshot, free: _FreeMap) -> Placement | None:
    spec = workload.spec
    for spoke in _candidate_spokes(spec, snapshot):
        nodes = [n for n in spoke.nodes if _node_matches(n, spec)]
        if spec.gpu_fraction is not None:
            assignment = _place_fraction(spoke, nodes, spec.gpu_fraction, free)
            if assignment is not None:
                return Placement(workload.id, spoke.id, (assignment,))
            continue
        chosen = [
            n for n in nodes if len(free.whole[(spoke.id, n.name)]) >= spec.gpus_per_node
        ][: spec.nodes]
        if len(chosen) < spec.nodes:
            continue
        assignments = []
        for node in chosen:
            devices = free.whole[(spoke.id, node.name)]
            taken, free.whole[(spoke.id, node.name)] = (
                devices[: spec.gpus_per_node],
                devices[spec.gpus_per_node :],
            )
            assignments.append(Assignment(node=node.name, devices=tuple(taken)))
        return Placement(workload.id, spoke.id, tuple(assignments))
    return None


def _place_fraction(
    spoke: Spoke, nodes: list[Node], fraction: float, free: _FreeMap
) -> Assignment | None:
    # Pack onto an already shared device first, so whole devices stay whole.
    for node in nodes:
        shared = free.shared[(spoke.id, node.name)]
        for device, left in sorted(shared.items()):
            if left + _EPS >= fraction:
                shared[device] = left - fraction
                return Assignment(node=node.name, devices=(device,), fraction=fraction)
    for node in nodes:
        whole = free.whole[(spoke.id, node.name)]
        if whole:
            device = whole.pop(0)
            free.shared[(spoke.id, node.name)][device] = 1.0 - fraction
            return Assignment(node=node.name, devices=(device,), fraction=fraction)
    return None


def _explain(workload: Workload, snapshot: Snapshot) -> Unplaced:
    spec = workload.spec
    wid = workload.id
    shape = (
        f"{spec.gpu_fraction:g} of a GPU"
        if spec.gpu_fraction is not None
        else f"{spec.nodes} x {spec.gpus_per_node} GPUs"
    )
    models = "/".join(spec.gpu_models) or "any model"
    if not snapshot.spokes:
        return Unplaced(wid, Reason.NO_SPOKES, "no spoke has reported capacity yet")
    spokes = _candidate_spokes(spec, snapshot)
    if not spokes:
        regions = ", ".join(spec.affinity.required_regions)
        return Unplaced(
            wid, Reason.NO_MATCHING_REGION, f"no spoke accepting work in region(s) {regions}"
        )
    fitting = [(s, [n for n in s.nodes if _node_matches(n, spec)]) for s in spokes]
    if not any(nodes for _, nodes in fitting):
        return Unplaced(wid, Reason.NO_MATCHING_MODEL, f"no schedulable node with {models} GPUs")
    if spec.gpu_fraction is None and not any(
        len([n for n in nodes if n.gpu_count >= spec.gpus_per_node]) >= spec.nodes
        for _, nodes in fitting
    ):
        return Unplaced(
            wid,
            Reason.SHAPE_NEVER_FITS,
            f"no spoke has {spec.nodes} node(s) with {spec.gpus_per_node} {models} GPUs each",
        )
    return Unplaced(
        wid, Reason.INSUFFICIENT_FREE, f"waiting for {shape} ({models}) to become free"
    )
