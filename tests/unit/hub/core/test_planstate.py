"""The kept placement state (hub.core.planstate) plans exactly as plan() does from scratch.

Random worlds go through random sequences of submissions, cycles (whose placements start and
whose preemptions begin stopping), ends, stops, capacity changes (a device taken outside the
hub, a spoke that stops accepting work, a node cordoned) and policy changes; after every step
the kept state's plan must equal the from-scratch plan (placements, preemptions, reasons, in
the same order) and its state must equal one set up from scratch. A second kept state is told
only what moved among the running work and what changed in the queue since its last plan, as
the hub's cycle tells it, and must plan the same. Each kept state's `Plan.explained` must list
every explanation that is not the very object its last plan gave that workload (the hub's
cycle writes only those onto its records).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.model import Node, Plan, RunningWorkload, Snapshot, Unplaced, Workload
from hub.core.placement import plan
from hub.core.planstate import PlanState
from hub.core.policy import Policy, Quota, Team
from schemas import Assignment
from tests.unit.hub.core.builders import fleet, node, spec, spoke
from tests.unit.hub.core.test_properties import fleets, policies, shapes

NOW = 50_000.0
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

STEPS = (
    *("submit", "submit", "cycle", "cycle", "cycle", "end", "end"),
    *("stop", "capacity", "policy", "fresh"),
)


@dataclass
class World:
    base: Snapshot  # the fleet with every device free
    policy: Policy
    now: float = NOW
    running: dict[str, RunningWorkload] = field(default_factory=dict)
    pending: dict[str, Workload] = field(default_factory=dict)
    outside: dict[tuple[str, str], set[int]] = field(default_factory=dict)  # not the hub's
    serial: int = 0
    # Node views by content: unchanged nodes are the same objects from snapshot to snapshot.
    views: dict[tuple[object, ...], tuple[Node, Node]] = field(default_factory=dict)
    # Running work that started, ended or began stopping since the last cycle (None: ended).
    moved: dict[str, RunningWorkload | None] = field(default_factory=dict)
    # Pending work queued, placed or changed since the last cycle (None: no longer pending).
    queued: dict[str, Workload | None] = field(default_factory=dict)
    # Per kept state (by id), the explanations its last plan gave, by workload.
    given: dict[int, dict[str, Unplaced]] = field(default_factory=dict)

    def queue(self, w: Workload) -> None:
        self.pending[w.id] = self.queued[w.id] = w

    def snapshot(self) -> Snapshot:
        taken: dict[tuple[str, str], list[Assignment]] = {}
        for r in self.running.values():
            for a in r.assignments:
                taken.setdefault((r.spoke_id, a.node), []).append(a)
        spokes = []
        for s in self.base.spokes:
            nodes = []
            for n in s.nodes:
                free = set(n.free) - self.outside.get((s.id, n.name), set())
                shared: dict[int, float] = {}
                for a in taken.get((s.id, n.name), ()):
                    for d in a.devices:
                        if a.fraction is None:
                            free.discard(d)
                        else:
                            if d in free:
                                free.discard(d)
                                shared[d] = 1.0
                            shared[d] = shared.get(d, 1.0) - a.fraction
                key = (s.id, id(n), tuple(sorted(free)), tuple(sorted(shared.items())))
                seen = self.views.get(key)
                if seen is None or seen[0] is not n:
                    seen = self.views[key] = (
                        n,
                        replace(n, free=tuple(sorted(free)), free_fraction=shared),
                    )
                nodes.append(seen[1])
            spokes.append(replace(s, nodes=tuple(nodes)))
        return Snapshot(tuple(spokes))

    def apply(self, result: Plan) -> None:
        for p in result.placements:
            w = self.pending.pop(p.workload_id)
            self.queued[w.id] = None
            self.running[w.id] = self.moved[w.id] = RunningWorkload(
                w.id, w.spec, p.spoke_id, p.assignments, self.now, attained_gpu_s=w.attained_gpu_s
            )
        for v in result.preemptions:
            r = self.running[v.workload_id]
            self.running[r.id] = self.moved[r.id] = replace(
                r, preempting=True, preempted_for=v.for_workload or None
            )

    def end(self, workload_id: str) -> RunningWorkload:
        self.moved[workload_id] = None
        return self.running.pop(workload_id)


def step(world: World, state: PlanState, told: PlanState, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(STEPS))
    world.now += data.draw(st.sampled_from((0.0, 1.0, 600.0)))
    if kind == "submit":
        for _ in range(data.draw(st.integers(1, 8))):
            world.serial += 1
            wid = f"w{world.serial}"
            world.queue(
                Workload(
                    wid,
                    spec(**data.draw(shapes())),
                    world.now - data.draw(st.sampled_from((0.0, 100.0, 5000.0, 1800.0))),
                    attained_gpu_s=data.draw(st.sampled_from((0.0, 0.0, 30.0, 5000.0))),
                )
            )
    elif kind == "cycle":
        world.apply(check(world, state, told))
    elif kind == "end" and world.running:
        world.end(data.draw(st.sampled_from(sorted(world.running))))
    elif kind == "stop":  # stopping work ends, and comes back to the queue
        for r in [r for r in world.running.values() if r.preempting]:
            world.end(r.id)
            world.queue(Workload(r.id, r.spec, r.started_at, attained_gpu_s=100.0))
            if r.preempted_for in world.pending:
                world.queue(replace(world.pending[r.preempted_for], claims_freed=True))
    elif kind == "capacity":
        world.base = change_fleet(world, data)
    elif kind == "policy":
        world.policy = data.draw(policies())
    elif kind == "fresh":  # equal nodes, new objects: compared by value, not identity
        world.views = {}


def change_fleet(world: World, data: st.DataObject) -> Snapshot:
    spokes = list(world.base.spokes)
    s = data.draw(st.integers(0, len(spokes) - 1))
    spoke = spokes[s]
    what = data.draw(st.sampled_from(("outside", "outside", "accepts", "cordon")))
    if what == "accepts":
        spokes[s] = replace(spoke, accepts_work=not spoke.accepts_work)
    elif what == "cordon":
        nodes = list(spoke.nodes)
        n = data.draw(st.integers(0, len(nodes) - 1))
        nodes[n] = replace(nodes[n], schedulable=not nodes[n].schedulable)
        spokes[s] = replace(spoke, nodes=tuple(nodes))
    else:  # a device taken or given back outside the hub's placements
        node = spoke.nodes[data.draw(st.integers(0, len(spoke.nodes) - 1))]
        outside = world.outside.setdefault((spoke.id, node.name), set())
        device = data.draw(st.integers(0, node.gpu_count - 1))
        outside.symmetric_difference_update({device})
    return Snapshot(tuple(spokes))


def check(world: World, state: PlanState, told: PlanState | None = None) -> Plan:
    """The from-scratch plan, which `state` (and `told`, told what moved) must give too."""
    snapshot = world.snapshot()
    pending = list(world.pending.values())
    running = list(world.running.values())
    expected = plan(snapshot, pending, running, world.policy, world.now)
    assert expected.explained is None  # from scratch: every explanation may be new
    result = state.plan(snapshot, pending, running, world.policy, world.now)
    assert result == expected
    explained_since_last(world, state, result)
    assert state.verify(snapshot, running) == []
    if told is not None:  # never verified between plans: that would read `running` through
        moved, world.moved = world.moved, {}
        queued, world.queued = world.queued, {}
        result = told.plan(snapshot, pending, running, world.policy, world.now, moved, queued)
        assert result == expected
        explained_since_last(world, told, result)
    return expected


def explained_since_last(world: World, state: PlanState, result: Plan) -> None:
    """An explanation `result.explained` leaves out is the object `state`'s last plan gave."""
    assert result.explained is not None
    fresh = {id(u) for u in result.explained}
    assert fresh <= {id(u) for u in result.unplaced}
    given = world.given.setdefault(id(state), {})
    for u in result.unplaced:
        if id(u) not in fresh:
            assert given.get(u.workload_id) is u
    world.given[id(state)] = {u.workload_id: u for u in result.unplaced}


@SETTINGS
@given(fleets(), policies(), st.data())
def test_kept_state_plans_as_from_scratch(
    base: Snapshot, policy: Policy, data: st.DataObject
) -> None:
    world = World(base, policy)
    state, told = PlanState(), PlanState()
    for _ in range(data.draw(st.integers(1, 24))):
        step(world, state, told, data)
        check(world, state, told)
    assert told.verify(world.snapshot(), list(world.running.values())) == []
    assert told.untold == 0


def test_kept_state_is_not_set_up_again_while_only_free_devices_change() -> None:
    world = World(fleet(spoke("s0", node("n0", "H100", 8), node("n1", "H100", 8))), Policy())
    state = PlanState()
    for i in range(6):
        world.pending[f"w{i}"] = Workload(f"w{i}", spec(gpus=4), NOW)
        world.apply(check(world, state))
        if i % 2:
            del world.running[f"w{i}"]
    assert len(world.running) == 3
    assert state.rebuilds == 1


def test_a_list_of_what_moved_that_misses_an_end_is_not_trusted() -> None:
    """Told of a start but not of an end, the kept state counts more running work than it is
    given, reads the running work through, and no longer counts the ended workload's GPUs
    against its team's limit."""
    team = Team("vision", quotas={"H100": Quota(guaranteed=8, limit=8)})
    world = World(
        fleet(spoke("s0", node("n0", "H100", 8), node("n1", "H100", 8))), Policy(teams=(team,))
    )
    told = PlanState()
    world.pending["a"] = Workload("a", spec(gpus=8), NOW)
    world.apply(check(world, told))
    world.pending["b"] = Workload("b", spec(gpus=8), NOW)
    moved, world.moved = world.moved, {}  # a started: told
    assert (
        told.plan(
            world.snapshot(), [world.pending["b"]], [world.running["a"]], world.policy, NOW, moved
        ).placements
        == ()
    )
    world.end("a")  # not told
    snapshot, pending = world.snapshot(), list(world.pending.values())
    result = told.plan(snapshot, pending, [], world.policy, NOW, {})
    assert [p.workload_id for p in result.placements] == ["b"]
    assert told.untold == 1


def test_a_plan_that_raises_leaves_no_devices_taken() -> None:
    world = World(fleet(spoke("s0", node("n0", "H100", 8))), Policy())
    world.pending["w"] = Workload("w", spec(gpus=4), NOW)
    state = PlanState()

    class Boom(Exception):
        pass

    class BadPending(list[Workload]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from super().__iter__()
            raise Boom

    with pytest.raises(Boom):
        state.plan(world.snapshot(), BadPending(world.pending.values()), [], world.policy, NOW)
    assert check(world, state).placements  # the 8 GPUs are all there again
