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
        "spoke_id",
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
        self.spoke_id = workload.spoke_id  # read for every candidate a search passes
        self.team = workload.need.team
        self.started_at = workload.started_at
        self.preempting = workload.preempting
        self.model = model
        self.amount = workload.need.total_gpus
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
                at = self.capacity.locate(self.spoke_id, a.node)
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

    `PlanState` tells it of each workload that starts or ends (`add`, `remove`). A plan's
    searches for victims read a fifth of the groups or fewer, so a change is only noted, and
    filed in place (`insort`, `bisect`) when a plan next reads its group (`holdings`). A
    group whose class changed its value or preemptibility (a new policy), or whose size then
    differs from the tally's, is sorted afresh.
    """

    __slots__ = ("_added", "_gone", "_groups")

    def __init__(self) -> None:
        # (team, model, class name) -> (class, holdings newest first)
        self._groups: dict[tuple[str, str, str], tuple[PriorityClass | None, list[Holding]]] = {}
        # per group read before, since its last read: work that started, and work that ended
        # (by id: its started_at when it was filed)
        self._added: dict[tuple[str, str, str], dict[str, RunningWorkload]] = {}
        self._gone: dict[tuple[str, str, str], dict[str, float]] = {}

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
        added = self._added.pop(key, None)
        gone = self._gone.pop(key, None)
        if kept is not None and _same_class(kept[0], cls):
            kept_cls, found = kept
            value = kept_cls.value if kept_cls is not None else 0
            filed = True
            if gone:
                for workload_id, started_at in gone.items():
                    i = bisect_left(found, (value, -started_at, workload_id), key=VICTIM_ORDER)
                    if i < len(found) and found[i].id == workload_id:
                        del found[i]
                    else:  # not where it should be: sort the group afresh
                        filed = False
                        break
            if filed and added:
                for r in added.values():
                    insort(found, Holding(r, model, kept_cls, capacity), key=VICTIM_ORDER)
            if filed and len(found) == len(group):
                return found
        found = newest_first(group, model, cls, capacity)
        self._groups[key] = (cls, found)
        return found

    def fill(
        self,
        groups: Mapping[tuple[str, str, str], Collection[RunningWorkload]],
        capacity: Capacity,
        policy: Policy,
    ) -> None:
        """Put every group in victim order (the fleet was set up afresh)."""
        for key, group in groups.items():
            cls = policy.priority_class(key[2])
            self._groups[key] = (cls, newest_first(group, key[1], cls, capacity))
            self._added.pop(key, None)
            self._gone.pop(key, None)

    def misfiled(
        self,
        groups: Mapping[tuple[str, str, str], Collection[RunningWorkload]],
        capacity: Capacity,
        policy: Policy,
    ) -> list[tuple[str, str, str]]:
        """Groups whose kept order, its noted changes filed, is not the one sorted afresh
        (`PlanState.verify`)."""
        found = []
        for key in list(self._groups):
            group = groups.get(key)
            if group is None:
                continue  # no longer runs: forgotten at the next plan's read (`prune`)
            cls = policy.priority_class(key[2])
            kept = [h.id for h in self.holdings(key, group, key[1], cls, capacity)]
            if kept != [h.id for h in newest_first(group, key[1], cls, capacity)]:
                found.append(key)
        return found

    def add(self, key: tuple[str, str, str], r: RunningWorkload) -> None:
        """Note `r`, which started running in group `key`."""
        if key in self._groups:
            added = self._added.get(key)
            if added is None:
                added = self._added[key] = {}
            added[r.id] = r

    def remove(self, key: tuple[str, str, str], r: RunningWorkload) -> None:
        """Note that `r` left group `key`."""
        if key not in self._groups:
            return
        added = self._added.get(key)
        if added is not None and added.pop(r.id, None) is not None:
            return  # noted as started since the last read: never filed
        gone = self._gone.get(key)
        if gone is None:
            gone = self._gone[key] = {}
        gone[r.id] = r.started_at

    def prune(self, groups: Mapping[tuple[str, str, str], object]) -> None:
        """Forget groups that no longer run."""
        for key in [k for k in self._groups if k not in groups]:
            del self._groups[key]
            self._added.pop(key, None)
            self._gone.pop(key, None)


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
