"""Packing pending workloads onto instances of one type (first-fit decreasing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Fractions are floats: 0.25 * 4 must fit one GPU.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Work:
    """One pending workload: `nodes` x `gpus_per_node` GPUs, or a `fraction` of one GPU.

    `order` ranks it among the round's pending work (oldest demand first); `workload_id` is
    None when the hub sent a count beyond the ids it listed.
    """

    order: int
    workload_id: str | None
    gpus_per_node: int
    nodes: int
    fraction: float | None


@dataclass(frozen=True, slots=True)
class Unit:
    """What one launch decision buys: `instances` instances of one type and the work they get.

    A single-node unit is one instance; a gang unit is `nodes` instances, each holding one node
    of every workload in it.
    """

    instances: int
    works: tuple[Work, ...]

    @property
    def first(self) -> int:
        return min(work.order for work in self.works)


def pack(works: Sequence[Work], gpu_count: int) -> tuple[list[Unit], list[Work]]:
    """Pack works onto instances with `gpu_count` GPUs each.

    Returns the units, oldest work first, and the works that do not fit such an instance at all.
    """
    units: list[Unit] = []
    unfit: list[Work] = []
    singles = [w for w in works if w.nodes == 1 and w.fraction is None]
    shared = [w for w in works if w.fraction is not None]
    gangs = [w for w in works if w.nodes > 1]

    # Slots are (GPUs, works): a whole-GPU workload, or one GPU shared by fractional ones.
    slots: list[tuple[int, list[Work]]] = [(w.gpus_per_node, [w]) for w in singles]
    slots.extend((1, cell) for cell in _share_gpus(shared))
    units.extend(_first_fit_decreasing(slots, gpu_count, unfit))
    units.extend(_gang_layers(gangs, gpu_count, unfit))
    units.sort(key=lambda unit: unit.first)
    return units, unfit


def _share_gpus(shared: Sequence[Work]) -> list[list[Work]]:
    cells: list[tuple[float, list[Work]]] = []
    for work in sorted(shared, key=lambda w: (-(w.fraction or 0.0), w.order)):
        need = work.fraction or 0.0
        for index, (used, members) in enumerate(cells):
            if used + need <= 1.0 + _EPSILON:
                cells[index] = (used + need, [*members, work])
                break
        else:
            cells.append((need, [work]))
    return [members for _, members in cells]


def _first_fit_decreasing(
    slots: list[tuple[int, list[Work]]], capacity: int, unfit: list[Work]
) -> list[Unit]:
    bins: list[tuple[int, list[Work]]] = []
    for size, members in sorted(slots, key=lambda s: (-s[0], min(w.order for w in s[1]))):
        if size > capacity:
            unfit.extend(members)
            continue
        for index, (used, held) in enumerate(bins):
            if used + size <= capacity:
                bins[index] = (used + size, held + members)
                break
        else:
            bins.append((size, list(members)))
    return [Unit(1, tuple(sorted(held, key=lambda w: w.order))) for _, held in bins]


def _gang_layers(gangs: Sequence[Work], capacity: int, unfit: list[Work]) -> list[Unit]:
    units: list[Unit] = []
    shapes = sorted({(w.gpus_per_node, w.nodes) for w in gangs})
    for gpus_per_node, nodes in shapes:
        members = sorted(
            (w for w in gangs if (w.gpus_per_node, w.nodes) == (gpus_per_node, nodes)),
            key=lambda w: w.order,
        )
        per_instance = capacity // gpus_per_node
        if per_instance == 0:
            unfit.extend(members)
            continue
        for start in range(0, len(members), per_instance):
            units.append(Unit(nodes, tuple(members[start : start + per_instance])))
    return units
