"""Build the placement snapshot from spoke reports and the hub's own assignments."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from hub.core.model import Node, RunningWorkload, Snapshot, Spoke
from schemas import CapacityReport, NodeCapacity


def build_snapshot(
    reports: Mapping[str, CapacityReport],
    active: Iterable[tuple[RunningWorkload, int]],
    accepting: Mapping[str, bool],
) -> Snapshot:
    """The fleet as placement should see it.

    `active` lists every workload the hub has placed and not yet seen end, with its epoch. Those
    the spoke's report does not show running yet are *assumed*: their devices are taken off the
    report's free devices, so a stale report never lets a device be given twice.
    """
    assumed: dict[tuple[str, str], list[tuple[tuple[int, ...], float | None]]] = defaultdict(list)
    for workload, epoch in active:
        report = reports.get(workload.spoke_id)
        if report is not None and any(
            r.workload_id == workload.id and r.epoch == epoch for r in report.running
        ):
            continue
        for a in workload.assignments:
            assumed[(workload.spoke_id, a.node)].append((a.devices, a.fraction))
    spokes = []
    for spoke_id in sorted(reports):
        report = reports[spoke_id]
        nodes = tuple(_node(spoke_id, n, assumed) for n in report.nodes)
        spokes.append(
            Spoke(
                id=spoke_id,
                region=report.region,
                kind=report.kind,
                nodes=nodes,
                labels=report.labels,
                accepts_work=accepting.get(spoke_id, True),
                price_per_gpu_hour=report.price_per_gpu_hour,
            )
        )
    return Snapshot(spokes=tuple(spokes))


def _node(
    spoke_id: str,
    node: NodeCapacity,
    assumed: Mapping[tuple[str, str], list[tuple[tuple[int, ...], float | None]]],
) -> Node:
    free = set(node.free_devices)
    shared = dict(node.device_free_fraction)
    for devices, fraction in assumed.get((spoke_id, node.name), ()):
        for device in devices:
            if fraction is None:
                free.discard(device)
                shared.pop(device, None)
            elif device in free:
                free.discard(device)
                shared[device] = 1.0 - fraction
            else:
                shared[device] = max(0.0, shared.get(device, 0.0) - fraction)
    return Node(
        name=node.name,
        gpu_model=node.gpu_model,
        gpu_count=node.gpu_count,
        free=tuple(sorted(free)),
        free_fraction=shared,
        labels=node.labels,
        schedulable=node.schedulable,
    )
