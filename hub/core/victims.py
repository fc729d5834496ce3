"""Running work as preemption sees it: who is stopping, who is borrowed, in victim order.

Victim order is lowest priority first, then newest first: the exact reverse of the order in
which guarantees fill (highest priority, then oldest). So a team's borrowed work is a prefix
of its victim order: the first workloads whose GPUs, counted from that end, lie beyond its
guarantee (a workload straddling the line counts as borrowed). For a team in a department the
part beyond its own guarantee goes to the department's shared pool, which fills across its
teams in the same order; what the pool cannot hold is borrowed.

Running work is grouped per team, GPU model and priority class in one pass (`tally`); the
rest is lazy. Candidates come out of generators in victim order, each class sorted only when
a search first reaches it, so a search that stops early pays for little. `PlanState` keeps the
sorted classes across plans (`hub.core.holdings.KeptOrder`), filing only the work that started
or ended.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Iterator, Mapping
from heapq import merge

from hub.core.capacity import EPS, Capacity
from hub.core.holdings import (
    VICTIM_ORDER,
    Holding,
    KeptOrder,
    newest_first,
)
from hub.core.model import RunningWorkload
from hub.core.policy import Policy, PriorityClass
from hub.core.quotas import Ledger

#: A holding beyond a guarantee: its place in victim order, the GPUs of it beyond, itself.
_Part = tuple[tuple[int, float, str], float, Holding]


class Tally:
    """Running work summed and grouped in one pass: the only pass over all of it."""

    __slots__ = ("_keys", "groups", "stopping", "sums", "totals")

    def __init__(self) -> None:
        # (team, model, stopping, class name) -> GPUs
        self.sums: dict[tuple[str, str, bool, str], float] = {}
        self._keys: list[tuple[str, str, bool, str]] | None = None  # `sums`' keys, sorted
        # (team, model, class name) -> running work, not stopping (`PlanState` keeps a view of
        # its own members here, not a copy)
        self.groups: dict[tuple[str, str, str], Collection[RunningWorkload]] = {}
        self.totals: dict[tuple[str, str], float] = {}  # (team, model), not stopping
        self.stopping: dict[str, list[RunningWorkload]] = {}  # model -> being preempted

    def ordered(self) -> list[tuple[str, str, bool, str]]:
        """The keys of `sums`, sorted; kept until `reorder()` says the keys changed."""
        if self._keys is None:
            self._keys = sorted(self.sums)
        return self._keys

    def reorder(self) -> None:
        """A key joined or left `sums`."""
        self._keys = None


def tally(running: Iterable[RunningWorkload], models: Mapping[str, Mapping[str, str]]) -> Tally:
    """Sum running work per team, GPU model, stopping or not, and priority class.

    `models` maps spoke id, then node name, to the node's GPU model.
    """
    acc: dict[tuple[str, str, bool, str], tuple[list[float], list[RunningWorkload]]] = {}
    for r in running:
        assignments = r.assignments
        if not assignments:
            continue
        spec = r.need
        nodes = models.get(r.spoke_id)
        model = nodes.get(assignments[0].node) if nodes is not None else None
        if model is None:
            # Its spoke is gone from the snapshot: count what it asked for, if it named one.
            if not spec.gpu_models:
                continue
            model = spec.gpu_models[0]
        amount = spec.gpu_fraction
        if amount is None:
            amount = float(spec.gpus_per_node * spec.nodes)
        key = (spec.team, model, r.preempting, spec.priority_class)
        entry = acc.get(key)
        if entry is None:
            acc[key] = ([amount], [r])
        else:
            entry[0].append(amount)
            entry[1].append(r)
    out = Tally()
    for key, (amounts, members) in acc.items():
        team, model, preempting, name = key
        amount = sum(amounts)
        out.sums[key] = amount
        if preempting:
            out.stopping.setdefault(model, []).extend(members)
        else:
            out.groups[(team, model, name)] = members
            out.totals[(team, model)] = out.totals.get((team, model), 0.0) + amount
    for members in out.stopping.values():
        members.sort(key=lambda r: r.id)
    return out


class Victims:
    """Running work per team and GPU model, and what this plan already decided about it."""

    def __init__(
        self,
        running: Tally,
        capacity: Capacity,
        ledger: Ledger,
        policy: Policy,
        kept: KeptOrder | None = None,
    ) -> None:
        self.running = running
        self.capacity = capacity
        self.ledger = ledger
        self.policy = policy
        self.chosen: set[str] = set()  # victims chosen in this plan
        self.claimed: set[str] = set()  # stopping work some pending workload waits on
        self.undecided: set[str] = set()  # pending workloads the plan has not come to yet
        # pending workloads some stopping work was preempted for
        self.earmarked = {
            r.preempted_for
            for stopping in running.stopping.values()
            for r in stopping
            if r.preempted_for is not None
        }
        self._teams: dict[str, list[str]] = {}  # model -> teams running on it
        # (team, model) -> [(value, class name, GPUs, class)], lowest value first
        self._classes: dict[tuple[str, str], list[tuple[int, str, float, PriorityClass | None]]]
        self._classes = {}
        sums = running.sums
        for key in running.ordered():
            team, model, preempting, name = key
            if preempting:
                continue
            amount = sums[key]
            cls = policy.priority_class(name)
            value = cls.value if cls is not None else 0
            self._classes.setdefault((team, model), []).append((value, name, amount, cls))
        for (team, model), classes in self._classes.items():
            classes.sort(key=lambda c: (c[0], c[1]))
            self._teams.setdefault(model, []).append(team)
        self._kept = kept
        if kept is not None:
            kept.prune(running.groups)
        self._segments: dict[tuple[str, str, str], list[Holding]] = {}
        self._stopping: dict[str, list[Holding]] = {}
        self._borrowed: dict[str, _Replay] = {}
        self._over_teams: dict[str, list[str]] = {}  # model -> teams beyond their guarantee
        self._departments: dict[str, list[list[Holding]]] = {}  # `_department_borrowed`

    def stopping(self, model: str) -> list[Holding]:
        """Work on `model` GPUs already being preempted, by id."""
        found = self._stopping.get(model)
        if found is None:
            classes = self.policy.priority_class
            found = [
                Holding(r, model, classes(r.need.priority_class), self.capacity)
                for r in self.running.stopping.get(model, ())
            ]
            found.sort(key=lambda h: h.id)
            self._stopping[model] = found
        return found

    def may_wait_on(self, h: Holding, workload_id: str) -> bool:
        """Whether `workload_id` may count stopping `h` as its own room.

        Not when another workload waits on it already, nor when it was preempted for a
        workload the plan has yet to come to (that one gets it first).
        """
        if h.id in self.claimed:
            return False
        beneficiary = h.workload.preempted_for
        return beneficiary in (None, workload_id) or beneficiary not in self.undecided

    def own(self, team: str, model: str, below: int) -> Iterator[Holding]:
        """The team's preemptible work on `model` GPUs below priority `below`, victim order."""
        for value, name, _, cls in self._classes.get((team, model), ()):
            if value >= below:
                break
            if cls is None or not cls.preemptible:
                continue
            chosen = self.chosen
            for h in self._sorted(team, model, name, cls):
                if h.id not in chosen:
                    yield h

    def own_amount(self, team: str, model: str, below: int) -> float:
        """GPUs `own` could free at most."""
        return sum(
            amount
            for value, _, amount, cls in self._classes.get((team, model), ())
            if value < below and cls is not None and cls.preemptible
        )

    def may_have_borrowed(self, model: str, team: str) -> bool:
        """Does another team run more `model` GPUs than its own guarantee?"""
        over = self._over_teams.get(model)
        if over is None:  # running work and guarantees stay as they are for the plan
            over = [t for t in self._teams.get(model, ()) if self._over(t, model) > EPS]
            self._over_teams[model] = over
        return len(over) > 1 or (len(over) == 1 and over[0] != team)

    def borrowed(self, model: str, team: str) -> Iterator[Holding]:
        """Other teams' preemptible borrowed work on `model` GPUs, in victim order."""
        replay = self._borrowed.get(model)
        if replay is None:
            replay = self._borrowed[model] = _Replay(self._all_borrowed(model))
        chosen = self.chosen
        items = replay.items
        i = 0
        while True:  # the replay's own iterator, inlined: this is read once per candidate
            if i < len(items):
                h = items[i]
            else:
                source = replay.source
                if source is None:
                    return
                found = next(source, None)
                if found is None:
                    replay.source = None
                    return
                items.append(found)
                h = found
            i += 1
            if h.team != team and h.id not in chosen:
                yield h

    def may_list_on(
        self, spokes: Container[str], team: str, model: str, below: int, borrowed: bool
    ) -> bool:
        """Whether `own(team, model, below)` or (`borrowed`) `borrowed(model, team)` may list
        work on one of `spokes`: False only when neither does.

        Without the merge into victim order: a team outside departments is read up to its
        guarantee's line, a department's cut is worked out once for the plan. The team's own
        work counts whether chosen already or not.
        """
        for value, name, _, cls in self._classes.get((team, model), ()):
            if value >= below:
                break
            if cls is not None and cls.preemptible:
                for h in self._sorted(team, model, name, cls):
                    if h.spoke_id in spokes:
                        return True
        if not borrowed:
            return False
        chosen = self.chosen
        alone, departments = self._borrowers(model)
        for t in alone:  # its work beyond its guarantee, as `_beyond_own` cuts it
            over = self._over(t, model) - EPS
            if t == team:
                continue
            counted = 0.0
            for _, name, _, cls in self._classes.get((t, model), ()):
                for h in self._sorted(t, model, name, cls):
                    if counted >= over:
                        break
                    if h.preemptible and h.spoke_id in spokes and h.id not in chosen:
                        return True
                    counted += h.amount
                else:
                    continue
                break
        for cut in self._department_borrowed(model, departments):
            for h in cut:
                on = h.spoke_id in spokes
                if on and h.team != team and h.preemptible and h.id not in chosen:
                    return True
        return False

    def _department_borrowed(
        self, model: str, departments: list[tuple[str, list[str]]]
    ) -> list[list[Holding]]:
        """Per department, the work `_all_borrowed` takes from its teams, kept for the plan."""
        found = self._departments.get(model)
        if found is None:
            found = self._departments[model] = [
                list(self._department_cut(dept, members, model)) for dept, members in departments
            ]
        return found

    def _department_cut(self, dept: str, members: list[str], model: str) -> Iterator[Holding]:
        # Orders differ between workloads, so the tuples compare by order alone.
        merged = merge(*(self._beyond_own(t, model) for t in members))
        return _cut(merged, self._pool_beyond(dept, members, model))

    def beyond_guarantee(self, model: str) -> Iterator[tuple[str, float]]:
        """Teams outside departments running `model` GPUs beyond their own guarantee, and how
        many (stopping work not counted; `hub.core.ordering` takes from these)."""
        for t in self._teams.get(model, ()):
            if self.ledger.department_of(t) is None:
                yield t, self._over(t, model)

    def team_work(self, team: str, model: str) -> Iterator[Holding]:
        """The team's running work on `model` GPUs (not stopping), class by class."""
        for _, name, _, cls in self._classes.get((team, model), ()):
            yield from self._sorted(team, model, name, cls)

    def _over(self, team: str, model: str) -> float:
        """Running `model` GPUs beyond the team's own guarantee."""
        total = self.running.totals.get((team, model), 0.0)
        return total - self.ledger.guaranteed(team, model)

    def _borrowers(self, model: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
        """Teams beyond their own guarantee: those outside departments, and per department
        (by name) its members."""
        alone: list[str] = []
        departments: dict[str, list[str]] = {}
        for t in self._teams.get(model, ()):
            if self._over(t, model) <= EPS:
                continue
            dept = self.ledger.department_of(t)
            if dept is None:
                alone.append(t)
            else:
                departments.setdefault(dept, []).append(t)
        return alone, sorted(departments.items())

    def _all_borrowed(self, model: str) -> Iterator[Holding]:
        alone, departments = self._borrowers(model)
        streams: list[Iterator[Holding]] = [
            (h for _, _, h in self._beyond_own(t, model)) for t in alone
        ]
        cuts = self._departments.get(model)  # worked out already: read them again
        if cuts is not None:
            streams.extend(iter(cut) for cut in cuts)
        else:
            streams.extend(self._department_cut(d, members, model) for d, members in departments)
        for h in merge(*streams, key=VICTIM_ORDER):
            if h.preemptible:
                yield h

    def _pool_beyond(self, dept: str, members: list[str], model: str) -> float:
        """GPUs the department's members run beyond their own guarantees and its pool."""
        return sum(self._over(t, model) for t in members) - self.ledger.pool(dept, model)

    def _beyond_own(self, team: str, model: str) -> Iterator[_Part]:
        """The team's work beyond its own guarantee, victim order, with the GPUs beyond it."""
        over = self._over(team, model)
        counted = 0.0
        for _, name, _, cls in self._classes.get((team, model), ()):
            for h in self._sorted(team, model, name, cls):
                if counted >= over - EPS:
                    return
                yield h.order, min(h.amount, over - counted), h
                counted += h.amount

    def _sorted(self, team: str, model: str, name: str, cls: PriorityClass | None) -> list[Holding]:
        """The team's running work of one class on `model` GPUs, newest first."""
        key = (team, model, name)
        found = self._segments.get(key)
        if found is None:
            group = self.running.groups.get(key, [])
            kept = self._kept
            if kept is None:
                found = newest_first(group, model, cls, self.capacity)
            else:
                found = kept.holdings(key, group, model, cls, self.capacity)
            self._segments[key] = found
        return found


def _cut(parts: Iterable[_Part], beyond: float) -> Iterator[Holding]:
    """Holdings in order until their parts add up to `beyond` (a department pool's cut-off)."""
    counted = 0.0
    for _, part, h in parts:
        if counted >= beyond - EPS:
            return
        counted += part
        yield h


class _Replay:
    """An iterator's items, computed once and replayed to every later reader (`borrowed`)."""

    __slots__ = ("items", "source")

    def __init__(self, source: Iterator[Holding]) -> None:
        self.items: list[Holding] = []
        self.source: Iterator[Holding] | None = source
