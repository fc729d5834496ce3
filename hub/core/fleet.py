"""Build the placement snapshot from spoke reports and the hub's own assignments."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from hub.core.model import Node, RunningWorkload, Snapshot, Spoke
from schemas import Assignment, CapacityReport, NodeCapacity

_NodeKey = tuple[str, str]  # (spoke id, node name)


def build_snapshot(
    reports: Mapping[str, CapacityReport],
    active: Iterable[tuple[RunningWorkload, int, int | None]],
    accepting: Mapping[str, bool],
    ended: Iterable[tuple[RunningWorkload, int]] = (),
) -> Snapshot:
    """The fleet as placement should see it.

    `active` lists every workload the hub has placed and not yet seen end, with its epoch and
    the command stream sequence of its Place (None if unknown). Those the spoke's report does
    not show running yet are *assumed*: their devices are taken off the report's free devices,
    so a stale report never lets a device be given twice. Once a report says the spoke applied
    that command and the workload is not running, it ended there (its end is on its way): the
    report's free devices are right and nothing is assumed.

    `ended` lists workloads whose end the hub has already heard of. A spoke releases a
    workload's devices before it reports the end, so where its last report still shows one of
    them running, its devices are free again without waiting for the next report.
    """
    taken: dict[_NodeKey, list[Assignment]] = defaultdict(list)
    given_back: dict[_NodeKey, list[Assignment]] = defaultdict(list)
    # What each report lists as running, indexed once: a lookup per workload, not a scan.
    listed = {(sid, r.workload_id, r.epoch) for sid, rep in reports.items() for r in rep.running}
    for workload, epoch, command_seq in active:
        if (workload.spoke_id, workload.id, epoch) not in listed and not _applied(
            reports, workload, command_seq
        ):
            for a in workload.assignments:
                taken[(workload.spoke_id, a.node)].append(a)
    for workload, epoch in ended:
        if (workload.spoke_id, workload.id, epoch) in listed:
            for a in workload.assignments:
                given_back[(workload.spoke_id, a.node)].append(a)
    spokes = []
    for spoke_id in sorted(reports):
        report = reports[spoke_id]
        nodes = tuple(
            _node(n, taken.get((spoke_id, n.name), ()), given_back.get((spoke_id, n.name), ()))
            for n in report.nodes
        )
        spokes.append(
            Spoke(
                id=spoke_id,
                region=report.region,
                kind=report.kind,
                nodes=nodes,
                labels=report.labels,
                accepts_work=accepting.get(spoke_id, True),
                price_per_gpu_hour=report.price_per_gpu_hour,
                reserved_for=_reserved_for(report),
                capabilities=report.capabilities,
            )
        )
    return Snapshot(spokes=tuple(spokes))


#: Label a burst instance's spoke carries: the team it was rented for (and is reserved to).
BURST_TEAM_LABEL = "burst-team"


def _reserved_for(report: CapacityReport) -> tuple[str, ...]:
    team = report.labels.get(BURST_TEAM_LABEL)
    return (team,) if team else ()


def _applied(
    reports: Mapping[str, CapacityReport], workload: RunningWorkload, command_seq: int | None
) -> bool:
    report = reports.get(workload.spoke_id)
    return report is not None and command_seq is not None and report.applied_seq >= command_seq


def _node(
    node: NodeCapacity, taken: Iterable[Assignment], given_back: Iterable[Assignment]
) -> Node:
    free = set(node.free_devices)
    shared = dict(node.device_free_fraction)
    for a in given_back:
        for device in a.devices:
            if a.fraction is None:
                free.add(device)
            else:
                shared[device] = min(1.0, shared.get(device, 0.0) + a.fraction)
    for device, left in list(shared.items()):
        if left >= 1.0 - 1e-9:  # every share handed back: whole again
            del shared[device]
            free.add(device)
    for a in taken:
        for device in a.devices:
            if a.fraction is None:
                free.discard(device)
                shared.pop(device, None)
            elif device in free:
                free.discard(device)
                shared[device] = 1.0 - a.fraction
            else:
                shared[device] = max(0.0, shared.get(device, 0.0) - a.fraction)
    return Node(
        name=node.name,
        gpu_model=node.gpu_model,
        gpu_count=node.gpu_count,
        free=tuple(sorted(d for d in free if 0 <= d < node.gpu_count)),
        free_fraction=shared,
        labels=node.labels,
        schedulable=node.schedulable,
    )
