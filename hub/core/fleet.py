"""Build the placement snapshot from spoke reports and the hub's own assignments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hub.core.model import Node, RunningWorkload, Snapshot, Spoke
from schemas import Assignment, CapacityReport, NodeCapacity


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
    return SnapshotBuilder().build(reports, active, accepting, ended)


#: A node's capacity as reported, the assignments assumed on it and given back, its Node.
_Entry = tuple[NodeCapacity, list[Assignment], list[Assignment], Node]


class _SpokeSeen:
    """A spoke as the last snapshot built it, and what it was built from."""

    __slots__ = ("built", "given_back", "listed", "nodes", "report", "spoke", "taken")

    def __init__(self, report: CapacityReport) -> None:
        self.report = report
        self.built: CapacityReport | None = None  # the report `spoke` was built from
        self.taken: dict[str, list[Assignment]] = {}  # node -> assumed on it, as built
        self.given_back: dict[str, list[Assignment]] = {}
        self.listed = {r.workload_id: r.epoch for r in report.running}  # what it runs, by epoch
        # per node of the report, in its order: what its Node was built from, and the Node
        self.nodes: list[_Entry] = []
        self.spoke: Spoke | None = None


class SnapshotBuilder:
    """`build_snapshot` that hands back last time's `Node` and `Spoke` objects where nothing
    they were built from changed.

    A node is built again only when its reported capacity (compared by value when the report
    is new) or the assignments assumed on it or given back changed; a spoke only when one of
    its nodes or its own report fields did. So most of a busy fleet's 6,400 nodes are the
    same objects from cycle to cycle, and `hub.core.planstate` skips them with an `is`; the
    reports' running lists are indexed once per report, not once per cycle.
    """

    def __init__(self) -> None:
        self._seen: dict[str, _SpokeSeen] = {}

    def build(
        self,
        reports: Mapping[str, CapacityReport],
        active: Iterable[tuple[RunningWorkload, int, int | None]],
        accepting: Mapping[str, bool],
        ended: Iterable[tuple[RunningWorkload, int]] = (),
    ) -> Snapshot:
        """What `build_snapshot` returns for these arguments."""
        seen: dict[str, _SpokeSeen] = {}
        for spoke_id, report in reports.items():
            last = self._seen.get(spoke_id)
            if last is None or last.report is not report:
                fresh = _SpokeSeen(report)
                if last is not None:
                    fresh.nodes = last.nodes  # compared by value below
                    fresh.spoke = last.spoke
                last = fresh
            seen[spoke_id] = last
        self._seen = seen
        taken: dict[str, dict[str, list[Assignment]]] = {}  # spoke -> node -> assumed
        given_back: dict[str, dict[str, list[Assignment]]] = {}
        for workload, epoch, command_seq in active:
            spoke_seen = seen.get(workload.spoke_id)
            if (spoke_seen is None or spoke_seen.listed.get(workload.id) != epoch) and not (
                _applied(reports, workload, command_seq)
            ):
                on = taken.setdefault(workload.spoke_id, {})
                for a in workload.assignments:
                    on.setdefault(a.node, []).append(a)
        for workload, epoch in ended:
            spoke_seen = seen.get(workload.spoke_id)
            if spoke_seen is not None and spoke_seen.listed.get(workload.id) == epoch:
                back = given_back.setdefault(workload.spoke_id, {})
                for a in workload.assignments:
                    back.setdefault(a.node, []).append(a)
        spokes = []
        for spoke_id in sorted(reports):
            spokes.append(
                self._spoke(
                    spoke_id,
                    seen[spoke_id],
                    accepting.get(spoke_id, True),
                    taken.get(spoke_id, _NO_NODES),
                    given_back.get(spoke_id, _NO_NODES),
                )
            )
        return Snapshot(spokes=tuple(spokes))

    def _spoke(
        self,
        spoke_id: str,
        seen: _SpokeSeen,
        accepting: bool,
        taken: dict[str, list[Assignment]],
        given_back: dict[str, list[Assignment]],
    ) -> Spoke:
        report = seen.report
        spoke = seen.spoke
        if (
            seen.built is report
            and spoke is not None
            and spoke.accepts_work == accepting
            and seen.taken == taken
            and seen.given_back == given_back
        ):
            return spoke  # nothing it was built from changed: not even a look at its nodes
        seen.built, seen.taken, seen.given_back = report, taken, given_back
        kept = seen.nodes  # in the last report's order, which a spoke keeps
        count = len(kept)
        by_name: dict[str, _Entry] | None = None
        plain = not taken and not given_back
        built: list[_Entry] = []
        nodes: list[Node] = []
        for i, n in enumerate(report.nodes):
            name = n.name
            last = kept[i] if i < count else None
            if last is not None and last[0] is not n and last[0].name != name:
                if by_name is None:
                    by_name = {e[0].name: e for e in kept}
                last = by_name.get(name)
            if plain:
                on = back = _NONE
            else:
                on = taken.get(name, _NONE)
                back = given_back.get(name, _NONE)
            if (
                last is not None
                and (last[0] is n or last[0].__dict__ == n.__dict__ or _same_capacity(last[0], n))
                and last[1] == on
                and last[2] == back
            ):
                entry = last if last[0] is n else (n, on, back, last[3])
            else:
                entry = (n, on, back, _node(n, on, back))
            built.append(entry)
            nodes.append(entry[3])
        seen.nodes = built
        if (
            spoke is not None
            and spoke.id == spoke_id
            and spoke.accepts_work == accepting
            and len(spoke.nodes) == len(nodes)
            and all(a is b for a, b in zip(spoke.nodes, nodes, strict=True))
            and spoke.region == report.region
            and spoke.kind == report.kind
            and spoke.labels == report.labels
            and spoke.price_per_gpu_hour == report.price_per_gpu_hour
            and spoke.reserved_for == _reserved_for(report)
            and spoke.capabilities == report.capabilities
        ):
            return spoke
        spoke = seen.spoke = Spoke(
            id=spoke_id,
            region=report.region,
            kind=report.kind,
            nodes=tuple(nodes),
            labels=report.labels,
            accepts_work=accepting,
            price_per_gpu_hour=report.price_per_gpu_hour,
            reserved_for=_reserved_for(report),
            capabilities=report.capabilities,
        )
        return spoke


_NONE: list[Assignment] = []  # no assignments on a node (never mutated)
_NO_NODES: dict[str, list[Assignment]] = {}  # none on any node of a spoke (never mutated)


def _same_capacity(old: NodeCapacity, new: NodeCapacity) -> bool:
    """Whether `_node` would build the same Node from both (given the same assignments)."""
    return (
        old.free_devices == new.free_devices
        and old.device_free_fraction == new.device_free_fraction
        and old.name == new.name
        and old.gpu_model == new.gpu_model
        and old.gpu_count == new.gpu_count
        and old.schedulable == new.schedulable
        and old.labels == new.labels
    )


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
