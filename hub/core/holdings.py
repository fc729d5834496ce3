"""Running work's GPUs as preemption reads them, in victim order, and that order kept.

Victim order is lowest priority first, then newest first (`Holding.order`). `KeptOrder` keeps
each group's holdings in that order across plans on the same fleet (`hub.core.planstate`).
Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Mapping
from operator import attrgetter

from hub.core.capacity import Capacity, Pool
from hub.core.model import RunningWorkload
from hub.core.policy import Policy, PriorityClass
from schemas import Assignment


class Holding:
    """One running workload's GPUs."""

    __slots__ = (
        "_where",
        "amount",
        "capacity",
        "id",
        "model",
        "order",
        "preemptible",
        "preempting",
        "started_at",
        "team",
        "value",
        "workload",
    )

    def __init__(
        self,
        workload: RunningWorkload,
        model: str,
        cls: PriorityClass | None,
        capacity: Capacity,
    ) -> None:
        self.workload = workload
        self.id = workload.id
        self.team = workload.spec.team
        self.started_at = workload.started_at
        self.preempting = workload.preempting
        self.model = model
        self.amount = workload.spec.total_gpus
        self.value = cls.value if cls is not None else 0
        self.preemptible = cls.preemptible if cls is not None else False  # unknown: keep it
        self.order = (self.value, -self.started_at, self.id)  # its place in victim order
        self.capacity = capacity
        self._where: tuple[tuple[Pool, int, Assignment], ...] | None = None

    @property
    def where(self) -> tuple[tuple[Pool, int, Assignment], ...]:
        """Its devices on nodes that take work: (pool, node index, assignment)."""
        if self._where is None:
            found = []
            for a in self.workload.assignments:
                at = self.capacity.locate(self.workload.spoke_id, a.node)
                if at is not None:
                    found.append((at[0], at[1], a))
            self._where = tuple(found)
        return self._where


def victim_order(h: Holding) -> tuple[int, float, str]:
    """Lowest priority first, then newest first."""
    return h.order


#: `victim_order` as a key that stays in C.
VICTIM_ORDER = attrgetter("order")


class KeptOrder:
    """Each group's work in victim order, kept across plans on the same fleet (`PlanState`).

    `PlanState` files each workload that starts or ends in its sorted group in place (`add`,
    `remove`), so a plan reads every group as it is. A group whose class changed its value or
    preemptibility (a new policy), or whose size differs from the tally's, is sorted again.
    """

    __slots__ = ("_groups",)

    def __init__(self) -> None:
        # (team, model, class name) -> (class, holdings newest first)
        self._groups: dict[tuple[str, str, str], tuple[PriorityClass | None, list[Holding]]] = {}

    def holdings(
        self,
        key: tuple[str, str, str],
        group: Collection[RunningWorkload],
        model: str,
        cls: PriorityClass | None,
        capacity: Capacity,
    ) -> list[Holding]:
        """The group's holdings, newest first."""
        kept = self._groups.get(key)
        if kept is not None and _same_class(kept[0], cls) and len(kept[1]) == len(group):
            return kept[1]
        found = newest_first(group, model, cls, capacity)
        self._groups[key] = (cls, found)
        return found

    def add(
        self, key: tuple[str, str, str], r: RunningWorkload, capacity: Capacity, policy: Policy
    ) -> None:
        """File `r`, which started running in group `key`."""
        kept = self._groups.get(key)
        if kept is None:
            kept = self._groups[key] = (policy.priority_class(key[2]), [])
        insort(kept[1], Holding(r, key[1], kept[0], capacity), key=VICTIM_ORDER)

    def remove(self, key: tuple[str, str, str], r: RunningWorkload) -> None:
        """Take out `r`, which left group `key`."""
        kept = self._groups.get(key)
        if kept is None:
            return
        cls, found = kept
        order = (cls.value if cls is not None else 0, -r.started_at, r.id)
        i = bisect_left(found, order, key=VICTIM_ORDER)
        if i < len(found) and found[i].id == r.id:
            del found[i]
        else:  # not where it should be: sort the group afresh when next read
            del self._groups[key]

    def prune(self, groups: Mapping[tuple[str, str, str], object]) -> None:
        """Forget groups that no longer run."""
        for key in [k for k in self._groups if k not in groups]:
            del self._groups[key]


def _same_class(a: PriorityClass | None, b: PriorityClass | None) -> bool:
    """Whether holdings made with class `a` are those `b` makes (value and preemptibility)."""
    if a is None or b is None:
        return a is b
    return a.value == b.value and a.preemptible == b.preemptible


def newest_first(
    group: Iterable[RunningWorkload], model: str, cls: PriorityClass | None, capacity: Capacity
) -> list[Holding]:
    """Holdings of `group`, newest first, ties by id."""
    ordered = sorted(group, key=_ID)
    ordered.sort(key=_STARTED, reverse=True)
    return [Holding(r, model, cls, capacity) for r in ordered]


_ID = attrgetter("id")
_STARTED = attrgetter("started_at")
