"""Placement state kept from one scheduling cycle to the next: the same plan for less work.

`plan()` sets up the fleet's free devices (`Capacity`) and the tally of running work from the
whole snapshot every time: on a busy fleet that is most of a cycle, although between two
cycles only the nodes where something started or ended change, and only the workloads that
started, ended or began stopping. `PlanState` keeps both, and its `plan()` takes the same
arguments as `hub.core.placement.plan` and returns the same plan:

- **Fleet.** Each cycle it compares the snapshot with the last one, spoke by spoke and node by
  node (an unchanged node or spoke that is the same object costs an `is`), and applies only
  the changed free devices. A change in the fleet's make-up (a spoke joins, leaves or stops
  accepting work; a node's model, size, labels or schedulability; a runtime's capabilities)
  sets everything up again, as does a snapshot it cannot follow node by node.
- **Running work.** Likewise by id and identity: a workload placed, ended, or marked stopping
  is moved between the tally's groups; sums are updated in place. Sums of whole GPUs and of
  fractions that are multiples of 1/1024 are exact in any order, so they equal `tally()`'s;
  while any running fraction is not such a multiple the tally is summed afresh instead.
  Reading 10,000 running workloads through for the few that changed took a fifth of a cycle
  (each a cache miss), so a caller that knows what moved since its last plan says so
  (`moved`, as `hub.cycle` does): then only those are looked at, and a count that does not
  match `running`'s falls back to reading it through.
- **Within a plan** the plan takes devices off the kept fleet as it always did; every node is
  noted before its first change (`Capacity.begin`) and put back afterwards
  (`Capacity.rollback`), also when the plan raises. Whatever the plan decided reaches the kept
  state only through the next snapshot and running list: the caller's truth, not the plan's.
- **Across plans** the pools of each workload signature, the reasons a shape never fits and
  running work in victim order (`hub.core.kept.Kept`) stay while the fleet's make-up
  does; work that starts or ends is noted against its class's victim order, and filed in
  when a plan next reads that class (`hub.core.holdings.KeptOrder`). The pending queue stays
  sorted, and only what was queued, placed or changed since is filed in or taken out
  (`hub.core.pendingorder.KeptQueue`; `queued`, as `hub.cycle` tells it).

`verify()` compares the kept state with one set up from scratch; the hub runs it now and then
and starts afresh when it finds a difference (`hub.cycle`). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import compress
from operator import is_not
from typing import Any

from hub.core.capacity import Capacity, node_free
from hub.core.kept import Kept
from hub.core.model import Node, Plan, RunningWorkload, Snapshot, Spoke, Workload
from hub.core.placement import plan_on
from hub.core.policy import Policy
from hub.core.victims import Tally, tally

_Key = tuple[str, str, bool, str]  # team, model, stopping, priority class
_Entry = tuple[RunningWorkload, _Key | None, float]

#: Amounts that are multiples of this add up exactly in any order (far below 2**53 GPUs).
_GRAIN = 1024.0


class PlanState:
    """What plan() sets up, kept between cycles and updated from what changed."""

    def __init__(self) -> None:
        self._capacity: Capacity | None = None
        self._spokes: tuple[Spoke, ...] = ()
        self._kept = Kept()
        self._entries: dict[str, _Entry] = {}
        self._members: dict[_Key, dict[str, RunningWorkload]] = {}
        self._tally = Tally()
        self._pairs: dict[tuple[str, str], set[_Key]] = {}  # (team, model) -> running keys
        self._dirty: set[_Key] = set()
        self._odd = 0  # running amounts that are not exact in any order
        self.rebuilds = 0  # times the fleet was set up from scratch (for tests and metrics)
        # times the caller's `moved` or `queued` missed something (read through instead)
        self.untold = 0
        self._policy: Policy | None = None  # the last plan's (for running work's classes)

    def plan(
        self,
        snapshot: Snapshot,
        pending: Sequence[Workload],
        running: Sequence[RunningWorkload],
        policy: Policy,
        now: float,
        moved: Mapping[str, RunningWorkload | None] | None = None,
        queued: Mapping[str, Workload | None] | None = None,
    ) -> Plan:
        """The plan `hub.core.placement.plan` gives for these arguments.

        `moved`: what the caller knows changed in `running` since its last plan here: for
        each workload that started, ended, began stopping or was replaced, its entry in
        `running` now (None: it is not there). Only those are looked at then, not all of
        `running`; without it, `running` is read through. `queued`: the same for `pending`
        (`hub.core.pendingorder.KeptQueue`).
        """
        self._policy = policy
        capacity = self._sync(snapshot, running, moved)
        work = self._current_tally(running, capacity)
        capacity.begin()
        queue = self._kept.queue
        missed = queue.untold
        try:
            return plan_on(capacity, work, pending, running, policy, now, self._kept, queued)
        except BaseException:
            self.reset()  # the roll back below may not undo a half-done change: start afresh
            raise
        finally:
            capacity.rollback()
            self.untold += queue.untold - missed

    def reset(self) -> None:
        """Forget everything: the next plan sets up from its snapshot (start, takeover)."""
        self._capacity = None

    def verify(self, snapshot: Snapshot, running: Sequence[RunningWorkload]) -> list[str]:
        """Differences between the kept state (synced to these) and one set up from them."""
        capacity = self._sync(snapshot, running)
        work = self._current_tally(running, capacity)
        fresh = Capacity(snapshot)
        problems: list[str] = []
        if len(fresh.pools) != len(capacity.pools):
            problems.append(f"pools: {len(capacity.pools)} kept, {len(fresh.pools)} fresh")
        for kept, new in zip(capacity.pools, fresh.pools, strict=False):
            for name in ("spoke_id", "model", "free", "shared", "by_k", "mask", "shared_sorted"):
                if getattr(kept, name) != getattr(new, name):
                    problems.append(f"pool {kept.index} ({kept.spoke_id}) differs in {name}")
        if capacity.total_by_model != fresh.total_by_model:
            problems.append("total_by_model differs")
        for (model, cloud), tier in capacity.tiers.items():
            new_tier = fresh.tiers.get((model, cloud))
            if new_tier is None or (tier.mask, tier.at) != (new_tier.mask, new_tier.at):
                problems.append(f"tier of {model} ({'cloud' if cloud else 'on-prem'}) differs")
        expected = tally(running, fresh.model_of)
        if work.sums != expected.sums:
            problems.append("tally sums differ")
        if work.totals != expected.totals:
            problems.append("tally totals differ")
        if _ids(work.groups) != _ids(expected.groups):
            problems.append("tally groups differ")
        if _ids(work.stopping) != _ids(expected.stopping):
            problems.append("stopping work differs")
        if self._policy is not None:
            for key in self._kept.order.misfiled(work.groups, capacity, self._policy):
                problems.append(f"victim order of {key} differs")
        return problems

    # -- the fleet -------------------------------------------------------------------------

    def _sync(
        self,
        snapshot: Snapshot,
        running: Sequence[RunningWorkload],
        moved: Mapping[str, RunningWorkload | None] | None = None,
    ) -> Capacity:
        capacity = self._capacity
        if capacity is None or not self._follow(capacity, snapshot):
            capacity = self._rebuild(snapshot, running)
        elif moved is None:
            self._sync_running(running, capacity)
        elif not self._apply_moved(moved, len(running), capacity):
            self.untold += 1
            self._sync_running(running, capacity)
        return capacity

    def _rebuild(self, snapshot: Snapshot, running: Sequence[RunningWorkload]) -> Capacity:
        self.rebuilds += 1
        capacity = self._capacity = Capacity(snapshot)
        self._spokes = snapshot.spokes
        self._kept = Kept()
        self._entries = {}
        self._members = {}
        self._tally = Tally()
        self._pairs = {}
        self._dirty = set()
        self._odd = 0
        if not _followable(snapshot):
            self._capacity = None  # node names repeat: set up afresh every plan
        for r in running:
            self._add(r, capacity)
        if self._policy is not None:  # every group in victim order now, not in later cycles
            groups = {(k[0], k[1], k[3]): m.values() for k, m in self._members.items() if not k[2]}
            self._kept.order.fill(groups, capacity, self._policy)
        return capacity

    def _follow(self, capacity: Capacity, snapshot: Snapshot) -> bool:
        """Apply the snapshot's free devices; False when its make-up changed."""
        old_spokes = self._spokes
        spokes = snapshot.spokes
        if len(spokes) != len(old_spokes):
            return False
        updates: list[tuple[Spoke, Node]] = []
        for old, new in zip(old_spokes, spokes, strict=True):
            if old is new:
                continue
            if not _same_spoke(old, new):
                return False
            old_nodes, nodes = old.nodes, new.nodes
            for i in compress(range(len(nodes)), map(is_not, old_nodes, nodes)):
                old_node, node = old_nodes[i], nodes[i]
                if not _same_node(old_node, node):
                    return False
                if new.accepts_work and node.schedulable:
                    updates.append((new, node))
        for spoke, node in updates:
            found = capacity.locate(spoke.id, node.name)
            if found is None:
                return False
            pool, i = found
            free, shares = node_free(node)
            pool.nodes[i] = node
            if free != pool.free[i] or shares != pool.shared.get(i):
                pool.set_free(i, free, shares)
        self._spokes = spokes
        capacity.snapshot = snapshot
        return True

    # -- running work ----------------------------------------------------------------------

    def _apply_moved(
        self, moved: Mapping[str, RunningWorkload | None], count: int, capacity: Capacity
    ) -> bool:
        """Apply the caller's list of what moved; False when the kept entries then do not
        number `count` (the list missed something: read `running` through instead)."""
        entries = self._entries
        for workload_id, r in moved.items():
            entry = entries.get(workload_id)
            if entry is not None:
                if entry[0] is r:
                    continue
                self._remove(workload_id)
            if r is not None:
                self._add(r, capacity)
        return len(entries) == count

    def _sync_running(self, running: Sequence[RunningWorkload], capacity: Capacity) -> None:
        entries = self._entries
        unseen = entries.copy()  # what is left in it once `running` is read through ended
        changed: list[RunningWorkload] = []
        for r in running:
            entry = unseen.pop(r.id, None)
            if entry is None or entry[0] is not r:
                changed.append(r)
        for gone in unseen:
            self._remove(gone)
        for r in changed:
            if r.id in entries:
                self._remove(r.id)
            self._add(r, capacity)

    def _add(self, r: RunningWorkload, capacity: Capacity) -> None:
        key, amount = _classify(r, capacity)
        self._entries[r.id] = (r, key, amount)
        if key is None:
            return
        if not (amount * _GRAIN).is_integer():
            self._odd += 1
        members = self._members.get(key)
        if members is None:
            members = self._members[key] = {}
            self._pairs.setdefault((key[0], key[1]), set()).add(key)
            self._tally.reorder()
        members[r.id] = r
        sums = self._tally.sums
        sums[key] = sums.get(key, 0.0) + amount
        self._dirty.add(key)
        if not key[2]:
            self._kept.order.add((key[0], key[1], key[3]), r)

    def _remove(self, workload_id: str) -> None:
        r, key, amount = self._entries.pop(workload_id)
        if key is None:
            return
        if not key[2]:
            self._kept.order.remove((key[0], key[1], key[3]), r)
        if not (amount * _GRAIN).is_integer():
            self._odd -= 1
        members = self._members[key]
        del members[workload_id]
        sums = self._tally.sums
        if members:
            sums[key] -= amount
        else:
            del self._members[key]
            del sums[key]
            self._tally.reorder()
            pair = self._pairs[(key[0], key[1])]
            pair.discard(key)
            if not pair:
                del self._pairs[(key[0], key[1])]
        self._dirty.add(key)

    def _current_tally(self, running: Sequence[RunningWorkload], capacity: Capacity) -> Tally:
        """The tally of `running`, from the kept groups (or afresh while one is inexact)."""
        if self._odd or self._capacity is None:
            self._dirty.clear()
            return tally(running, capacity.model_of)
        out = self._tally
        members = self._members
        models: set[str] = set()
        pairs: set[tuple[str, str]] = set()
        for key in self._dirty:
            team, model, stopping, name = key
            if stopping:
                models.add(model)
                continue
            pairs.add((team, model))
            group = members.get(key)
            if group is None:
                out.groups.pop((team, model, name), None)
            else:
                out.groups[(team, model, name)] = group.values()  # a view: no copy
        self._dirty.clear()
        for pair in pairs:
            total = 0.0
            found = False
            for key in self._pairs.get(pair, ()):
                if not key[2]:
                    total += out.sums[key]
                    found = True
            if found:
                out.totals[pair] = total
            else:
                out.totals.pop(pair, None)
        for model in models:
            leaving = [
                r
                for key, group in members.items()
                if key[2] and key[1] == model
                for r in group.values()
            ]
            if leaving:
                leaving.sort(key=lambda r: r.id)
                out.stopping[model] = leaving
            else:
                out.stopping.pop(model, None)
        return out


def _classify(r: RunningWorkload, capacity: Capacity) -> tuple[_Key | None, float]:
    """Where `tally()` counts `r`: its group key (None: not at all) and its GPUs."""
    assignments = r.assignments
    if not assignments:
        return None, 0.0
    spec = r.need
    nodes = capacity.model_of.get(r.spoke_id)
    model = nodes.get(assignments[0].node) if nodes is not None else None
    if model is None:
        if not spec.gpu_models:
            return None, 0.0
        model = spec.gpu_models[0]
    amount = spec.gpu_fraction
    if amount is None:
        amount = float(spec.gpus_per_node * spec.nodes)
    return (spec.team, model, r.preempting, spec.priority_class), amount


def _same_spoke(old: Spoke, new: Spoke) -> bool:
    """Same make-up: everything but the nodes' free devices."""
    return (
        old.id == new.id
        and old.region == new.region
        and old.kind == new.kind
        and old.accepts_work == new.accepts_work
        and old.price_per_gpu_hour == new.price_per_gpu_hour
        and old.reserved_for == new.reserved_for
        and len(old.nodes) == len(new.nodes)
        and old.labels == new.labels
        and old.capabilities == new.capabilities
    )


def _same_node(old: Node, new: Node) -> bool:
    return (
        old.name == new.name
        and old.gpu_model == new.gpu_model
        and old.gpu_count == new.gpu_count
        and old.schedulable == new.schedulable
        and old.labels == new.labels
    )


def _followable(snapshot: Snapshot) -> bool:
    """Whether every node can be found by spoke and name (no name repeats in a spoke)."""
    return all(len({n.name for n in s.nodes}) == len(s.nodes) for s in snapshot.spokes)


def _ids(groups: Mapping[Any, Collection[RunningWorkload]]) -> dict[object, set[str]]:
    return {key: {r.id for r in members} for key, members in groups.items() if members}
