"""The schedulers a replay compares: gpufed's plan(), static partitions, and global FIFO.

- `gpufed`: `hub.core.placement.plan()` with the policy in force at each cycle
  (`hub.core.windows.policy_at`, virtual time 0 being the replay's `start`), so time windows
  apply as in the hub.
- `static`: today's manual allocation. Each team with a guarantee gets its own partition of the
  fleet, whole devices carved out in fleet order and sized exactly by its guarantees (one spoke
  per team, reserved for it), and only runs there; plan() schedules inside each partition with
  no quotas (priority, then age). GPUs outside every guarantee stay unused, and a team without
  a guarantee has nowhere to run: its jobs wait forever and are reported as never started.
- `fifo`: one global queue in submit order, no quotas, no preemption. The head of the queue
  goes on the first node (spoke by spoke, on-prem first) with room; when the head does not fit,
  nothing behind it starts either (head-of-line blocking). A job too big for the empty fleet
  would block the queue for ever: it is set aside and reported instead.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from gpufed.replay.fleet import Fleet, NodeSpec, SpokeSpec
from gpufed.replay.simulator import Scheduler
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
from hub.core.placement import plan
from hub.core.policy import Policy, quota_for
from hub.core.windows import active_window, apply_window, next_change
from schemas import Assignment, SpokeKind, WorkloadSpec

SCHEDULERS = ("gpufed", "static", "fifo")
_EPS = 1e-9


def gpufed_scheduler(policy: Policy, start: float = 0.0) -> Scheduler:
    """gpufed's own placement: plan() with the policy in force at `start` + virtual time."""
    cache: dict[str | None, Policy] = {}

    def schedule(
        snapshot: Snapshot,
        pending: Collection[Workload],
        running: Collection[RunningWorkload],
        now: float,
    ) -> Plan:
        in_force = policy
        if policy.windows:
            window = active_window(policy, start + now)
            key = window.name if window is not None else None
            if key not in cache:
                cache[key] = apply_window(policy, window)
            in_force = cache[key]
        return plan(snapshot, list(pending), list(running), in_force, now)

    return schedule


def window_wakeup(policy: Policy, start: float) -> Callable[[float], float | None] | None:
    """When the policy next changes by itself, in virtual time; None for a policy without
    windows. The simulator runs a cycle there, as the hub does at a window boundary."""
    if not policy.windows:
        return None

    def wakeup(now: float) -> float | None:
        change = next_change(policy, start + now)
        return None if change is None else change - start

    return wakeup


def static_partition(fleet: Fleet, policy: Policy) -> tuple[Fleet, float]:
    """The fleet cut into one spoke per team with a guarantee, sized by its guarantees.

    Devices are taken in fleet order (on-prem spokes, their nodes, their devices), a node split
    between teams where a guarantee ends inside it. Cloud spokes are left out. Returns the
    partitioned fleet and the GPUs no guarantee covers (unused under `static`).
    """
    free: list[tuple[SpokeSpec, NodeSpec, int]] = [
        (s, n, n.gpu_count) for s in fleet.spokes if s.kind is SpokeKind.ONPREM for n in s.nodes
    ]
    spokes: list[SpokeSpec] = []
    for team in policy.teams:
        nodes: list[NodeSpec] = []
        first: SpokeSpec | None = None
        for model in sorted({n.gpu_model for _, n, _ in free}):
            quota = quota_for(team.quotas, model)
            want = int(quota.guaranteed) if quota is not None else 0
            for k, (spoke, node, left) in enumerate(free):
                if want <= 0:
                    break
                if node.gpu_model != model or left == 0:
                    continue
                got = min(left, want)
                want -= got
                free[k] = (spoke, node, left - got)
                first = first or spoke
                nodes.append(NodeSpec(f"{spoke.id}.{node.name}.{team.name}", model, got))
        if nodes and first is not None:
            spokes.append(
                SpokeSpec(
                    id=f"static-{team.name}",
                    region=first.region,
                    kind=SpokeKind.ONPREM,
                    nodes=tuple(nodes),
                    labels=dict(first.labels),
                    reserved_for=(team.name,),
                )
            )
    unused = float(sum(left for _, _, left in free))
    return Fleet(tuple(spokes)), unused


class StaticScheduler:
    """plan() over a partitioned fleet, with the teams' quotas and departments dropped.

    Partitions never interact, so a team whose spokes and queue did not change since the
    last cycle would get the same decisions again (nothing placed: everything it queues was
    tried against at least the room it has now). Only the other teams' work is planned: the
    same outcome as planning everything, for a fraction of the time on a long backlog. With
    `incremental=False` every cycle plans every queue (cloud burst needs every cycle's demand).
    """

    def __init__(self, policy: Policy, *, incremental: bool = True) -> None:
        self.incremental = incremental
        teams = tuple(replace(t, quotas={}, department=None) for t in policy.teams)
        self.policy = Policy(
            classes=policy.classes,
            teams=teams,
            default_team=replace(policy.default_team, quotas={}, department=None),
            aging=policy.aging,
        )
        self._seen: dict[str, tuple[tuple[Spoke, ...], int]] = {}

    def __call__(
        self,
        snapshot: Snapshot,
        pending: Collection[Workload],
        running: Collection[RunningWorkload],
        now: float,
    ) -> Plan:
        """Plan the queues of the teams whose partition or queue changed."""
        spokes: dict[str, list[Spoke]] = {}
        for spoke in snapshot.spokes:
            for team in spoke.reserved_for:
                spokes.setdefault(team, []).append(spoke)
        queues: dict[str, list[Workload]] = {}
        for workload in pending:
            queues.setdefault(workload.spec.team, []).append(workload)
        chosen: list[Workload] = []
        teams: set[str] = set()
        for team, queue in queues.items():
            state = (tuple(spokes.get(team, ())), len(queue))
            seen = self._seen.get(team)
            unchanged = seen is not None and seen[1] == state[1] and _same(seen[0], state[0])
            if unchanged and self.incremental:
                continue
            self._seen[team] = state
            chosen += queue
            teams.add(team)
        if not chosen:
            return Plan()
        if self.incremental:
            # Only the chosen teams' partitions and running work can matter to their queues.
            parts = tuple(s for t in sorted(teams) for s in spokes.get(t, ()))
            snapshot = Snapshot(parts)
            running = [r for r in running if r.spec.team in teams]
        return plan(snapshot, chosen, list(running), self.policy, now)


def _same(a: tuple[Spoke, ...], b: tuple[Spoke, ...]) -> bool:
    """The same spoke views: the simulator rebuilds a spoke's view whenever it changes."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class FifoScheduler:
    """One global queue, first fit, head-of-line blocking (see the module docstring)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._never: dict[tuple[object, ...], bool] = {}
        self.set_aside: set[str] = set()

    def __call__(
        self,
        snapshot: Snapshot,
        pending: Collection[Workload],
        running: Collection[RunningWorkload],
        now: float,
    ) -> Plan:
        """Place from the head of the queue until the head does not fit."""
        free = _FreeView(snapshot)
        placements: list[Placement] = []
        unplaced: list[Unplaced] = []
        # The simulator keeps the queue in arrival order and FIFO never preempts (so never
        # requeues): walking it from the front is walking it in submit order.
        for workload in pending:
            spec = workload.spec
            if workload.id in self.set_aside:
                continue
            if self._never_fits(snapshot, spec):
                self.set_aside.add(workload.id)
                message = "no spoke can ever hold this shape"
                unplaced.append(Unplaced(workload.id, Reason.SHAPE_NEVER_FITS, message))
                continue
            found = free.first_fit(spec, self._may_burst(spec.team))
            if found is None:
                # Head-of-line blocking: nothing behind the head starts (nor is it looked at).
                message = "the head of the queue does not fit yet"
                unplaced.append(Unplaced(workload.id, Reason.INSUFFICIENT_FREE, message))
                break
            placements.append(Placement(workload.id, *found))
        return Plan(placements=tuple(placements), unplaced=tuple(unplaced))

    def _may_burst(self, team: str) -> bool:
        return self.policy.team(team).may_burst

    def _never_fits(self, snapshot: Snapshot, spec: WorkloadSpec) -> bool:
        spokes = tuple(s.id for s in snapshot.spokes)
        key = (
            spec.team,
            spec.nodes,
            spec.gpus_per_node,
            spec.gpu_fraction,
            spec.gpu_models,
            spokes,
        )
        never = self._never.get(key)
        if never is None:
            never = self._never[key] = not any(
                _usable(spoke, spec.team, self._may_burst(spec.team))
                and sum(
                    1
                    for n in spoke.nodes
                    if n.schedulable
                    and _model_ok(spec, n.gpu_model)
                    and n.gpu_count >= spec.gpus_per_node
                )
                >= spec.nodes
                for spoke in snapshot.spokes
            )
        return never


class _FreeView:
    """Free devices of a snapshot, taken as a plan gives them away (copied per node)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.spokes = sorted(snapshot.spokes, key=lambda s: s.kind is SpokeKind.CLOUD)
        self.free: dict[tuple[str, str], list[int]] = {}
        self.shared: dict[tuple[str, str], dict[int, float]] = {}

    def first_fit(
        self, spec: WorkloadSpec, may_burst: bool
    ) -> tuple[str, tuple[Assignment, ...]] | None:
        """The first spoke and nodes with room for `spec`, taken; None when nothing fits."""
        for spoke in self.spokes:
            if not _usable(spoke, spec.team, may_burst):
                continue
            if spec.gpu_fraction is not None:
                found = self._fraction(spoke, spec, spec.gpu_fraction)
                if found is not None:
                    return spoke.id, (found,)
                continue
            chosen = []
            for n in spoke.nodes:
                if (
                    n.schedulable
                    and len(self._free(spoke.id, n)) >= spec.gpus_per_node
                    and _model_ok(spec, n.gpu_model)
                ):
                    chosen.append(n)
                    if len(chosen) == spec.nodes:
                        break
            if len(chosen) == spec.nodes:
                return spoke.id, tuple(self._take(spoke.id, n, spec.gpus_per_node) for n in chosen)
        return None

    def _fraction(self, spoke: Spoke, spec: WorkloadSpec, fraction: float) -> Assignment | None:
        for n in spoke.nodes:
            if not n.schedulable or not _model_ok(spec, n.gpu_model):
                continue
            shared = self._shared(spoke.id, n)
            for device, left in sorted(shared.items()):
                if left >= fraction - _EPS:
                    shared[device] = left - fraction
                    return Assignment(node=n.name, devices=(device,), fraction=fraction)
            free = self._free(spoke.id, n)
            if free:
                device = free.pop(0)
                shared[device] = 1.0 - fraction
                return Assignment(node=n.name, devices=(device,), fraction=fraction)
        return None

    def _free(self, spoke_id: str, node: Node) -> list[int]:
        key = (spoke_id, node.name)
        free = self.free.get(key)
        if free is None:
            free = self.free[key] = list(node.free)
        return free

    def _shared(self, spoke_id: str, node: Node) -> dict[int, float]:
        key = (spoke_id, node.name)
        shared = self.shared.get(key)
        if shared is None:
            shared = self.shared[key] = dict(node.free_fraction)
        return shared

    def _take(self, spoke_id: str, node: Node, gpus: int) -> Assignment:
        free = self._free(spoke_id, node)
        devices = tuple(free[:gpus])
        del free[:gpus]
        return Assignment(node=node.name, devices=devices)


def _usable(spoke: Spoke, team: str, may_burst: bool) -> bool:
    if not spoke.accepts_work:
        return False
    if spoke.reserved_for and team not in spoke.reserved_for:
        return False
    return spoke.kind is not SpokeKind.CLOUD or may_burst


def _model_ok(spec: WorkloadSpec, model: str) -> bool:
    return not spec.gpu_models or model in spec.gpu_models
