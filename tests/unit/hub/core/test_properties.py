"""Properties of plan() over random fleets, policies and workloads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.model import Node, RunningWorkload, Snapshot, Spoke, Workload
from hub.core.placement import plan
from hub.core.policy import Consolidation, Department, Ordering, Policy, Quota, Team
from schemas import Assignment, RuntimeCapabilities, SpokeKind
from tests.unit.hub.core.builders import check_invariants, occupy, spec

MODELS = ("H100", "A100")
TEAMS = ("t0", "t1", "t2", "t3")
CLASSES = ("production", "training", "dev", "batch")
NOW = 50_000.0
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


#: Runtimes as spokes report them: everything, Kubernetes (no fractions), no or small gangs.
RUNTIMES = (
    RuntimeCapabilities(),
    RuntimeCapabilities(),
    RuntimeCapabilities(fractions=False),
    RuntimeCapabilities(gangs=False),
    RuntimeCapabilities(max_gang_nodes=2),
)


@st.composite
def fleets(draw: st.DrawFn) -> Snapshot:
    spokes = []
    for s in range(draw(st.integers(1, 4))):
        nodes = []
        for n in range(draw(st.integers(1, 4))):
            gpus = draw(st.sampled_from((1, 2, 4, 8)))
            nodes.append(
                Node(
                    name=f"n{n}",
                    gpu_model=draw(st.sampled_from(MODELS)),
                    gpu_count=gpus,
                    free=tuple(range(gpus)),
                    labels={"ib": "true"} if draw(st.booleans()) else {},
                    schedulable=draw(st.integers(0, 9)) > 0,
                )
            )
        spokes.append(
            Spoke(
                id=f"s{s}",
                region=draw(st.sampled_from(("eu", "us"))),
                kind=SpokeKind.CLOUD if draw(st.integers(0, 3)) == 0 else SpokeKind.ONPREM,
                nodes=tuple(nodes),
                accepts_work=draw(st.integers(0, 9)) > 0,
                price_per_gpu_hour=draw(st.sampled_from((0.0, 1.0, 2.5))),
                capabilities=draw(st.sampled_from(RUNTIMES)),
            )
        )
    return Snapshot(tuple(spokes))


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    ordering = Ordering()
    if draw(st.booleans()):  # least attained service, with levels low enough to matter here
        steps = draw(st.sampled_from(((60.0,), (10.0, 1000.0), (3600.0,))))
        ordering = Ordering(
            "las",
            steps,
            exempt_gpus=draw(st.sampled_from((0, 16))),
            patience_s=draw(st.sampled_from((0.0, 100.0))),
        )
    moves = Consolidation(draw(st.booleans()), draw(st.sampled_from((0.0, 100.0))))
    if draw(st.integers(0, 4)) == 0:
        return Policy(ordering=ordering, consolidation=moves)
    dept = draw(st.booleans())
    teams = []
    for name in TEAMS:
        quotas = {}
        for model in draw(st.sets(st.sampled_from((*MODELS, "*")))):
            guaranteed = draw(st.sampled_from((0, 1, 2, 4, 8)))
            limit = draw(st.sampled_from((None, 0, 4, 8, 16)))
            if limit is not None:
                limit = max(limit, guaranteed)
            quotas[model] = Quota(guaranteed, limit)
        teams.append(
            Team(
                name,
                department="d" if dept and name in ("t0", "t1") else None,
                quotas=quotas,
                weight=draw(st.sampled_from((0.5, 1.0, 2.0))),
                may_burst=draw(st.booleans()),
            )
        )
    departments: tuple[Department, ...] = ()
    if dept:
        own = sum(q.guaranteed for t in teams[:2] for m, q in t.quotas.items() if m == "H100")
        limit = draw(st.sampled_from((None, 8, 24)))
        departments = (Department("d", {"H100": Quota(own + 4, limit and max(limit, own + 4))}),)
    return Policy(
        teams=tuple(teams), departments=departments, ordering=ordering, consolidation=moves
    )


@st.composite
def shapes(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.integers(0, 5))
    shape: dict[str, Any]
    if kind == 0:
        shape = {"fraction": draw(st.sampled_from((0.25, 0.5, 0.75)))}
    elif kind == 1:
        shape = {"gpus": draw(st.sampled_from((1, 2, 4, 8))), "nodes": draw(st.integers(2, 3))}
    else:
        shape = {"gpus": draw(st.sampled_from((1, 2, 4, 8)))}
    shape["team"] = draw(st.sampled_from((*TEAMS, "stranger")))
    shape["cls"] = draw(st.sampled_from((*CLASSES, *CLASSES, "unknown")))
    shape["models"] = draw(st.sampled_from(((), ("H100",), ("A100", "H100"))))
    if draw(st.integers(0, 4)) == 0:
        shape["required_regions"] = ("eu",)
    if draw(st.integers(0, 4)) == 0:
        shape["preferred_labels"] = {"ib": "true"}
    if draw(st.integers(0, 6)) == 0:
        shape["required_labels"] = {"ib": "true"}
    return shape


@dataclass
class World:
    snapshot: Snapshot
    running: tuple[RunningWorkload, ...]
    pending: tuple[Workload, ...]
    policy: Policy


def _put(
    snapshot: Snapshot, taken: dict[tuple[str, str], dict[int, float]], shape: dict[str, Any]
) -> tuple[str, tuple[Assignment, ...]] | None:
    """First fit of a running workload's shape into what is still untaken (test set-up only)."""
    fraction = shape.get("fraction")
    gpus = shape.get("gpus", 1)
    count = shape.get("nodes", 1)
    for s in snapshot.spokes:
        chosen = []
        for n in s.nodes:
            used = taken.setdefault((s.id, n.name), {})
            if fraction is not None:
                for d in range(n.gpu_count):
                    if used.get(d, 0.0) + fraction <= 1.0 + 1e-9:
                        used[d] = used.get(d, 0.0) + fraction
                        return s.id, (Assignment(node=n.name, devices=(d,), fraction=fraction),)
                continue
            devices = [d for d in range(n.gpu_count) if d not in used][:gpus]
            if len(devices) == gpus:
                chosen.append((n.name, devices))
            if len(chosen) == count:
                for name, ds in chosen:
                    for d in ds:
                        taken[(s.id, name)][d] = 1.0
                return s.id, tuple(Assignment(node=name, devices=tuple(ds)) for name, ds in chosen)
    return None


@st.composite
def worlds(draw: st.DrawFn) -> World:
    base = draw(fleets())
    policy = draw(policies())
    taken: dict[tuple[str, str], dict[int, float]] = {}
    active = []
    for i in range(draw(st.integers(0, 10))):
        shape = draw(shapes())
        if shape["cls"] == "unknown":
            shape["cls"] = "batch"
        where = _put(base, taken, shape)
        if where is None:
            continue
        shape.pop("required_regions", None)
        shape.pop("required_labels", None)
        shape.pop("preferred_labels", None)
        active.append(
            RunningWorkload(
                id=f"r{i}",
                spec=spec(**shape),
                spoke_id=where[0],
                assignments=where[1],
                started_at=draw(st.floats(0, NOW)),
                preempting=draw(st.integers(0, 5)) == 0,
            )
        )
    queue = tuple(
        Workload(
            f"w{i}",
            spec(**draw(shapes())),
            draw(st.floats(0, NOW)),
            attained_gpu_s=draw(st.sampled_from((0.0, 0.0, 30.0, 5000.0))),
        )
        for i in range(draw(st.integers(0, 12)))
    )
    return World(occupy(base, active), tuple(active), queue, policy)


@SETTINGS
@given(worlds())
def test_every_plan_keeps_the_invariants(world: World) -> None:
    result = plan(world.snapshot, world.pending, world.running, world.policy, NOW)
    check_invariants(world.snapshot, world.pending, world.running, world.policy, result)


@SETTINGS
@given(worlds())
def test_same_input_same_plan_and_inputs_untouched(world: World) -> None:
    before = (world.snapshot, world.pending, world.running)
    copies = repr(before)
    first = plan(world.snapshot, world.pending, world.running, world.policy, NOW)
    assert repr(before) == copies
    assert plan(world.snapshot, world.pending, world.running, world.policy, NOW) == first


@st.composite
def reclaimable(draw: st.DrawFn) -> World:
    """A (nearly) full fleet: some nodes run a team's guaranteed work, the rest borrowed work.

    A third team, under its guarantee, has one workload pending.
    """
    base = draw(fleets())
    base = Snapshot(
        tuple(
            Spoke(s.id, s.region, SpokeKind.ONPREM, s.nodes, accepts_work=True) for s in base.spokes
        )
    )
    shape = draw(shapes())
    shape.update(team="owner", cls=draw(st.sampled_from(CLASSES)))
    shape.pop("required_labels", None)
    shape.pop("required_regions", None)
    fraction = shape.get("fraction")
    size = fraction or int(shape.get("gpus", 1)) * int(shape.get("nodes", 1))
    active = []
    steady = 0.0
    for i, (s, n) in enumerate((sp, n) for sp in base.spokes for n in sp.nodes):
        team = draw(st.sampled_from(("borrower", "borrower", "steady")))
        for d in range(n.gpu_count):
            # Nearly every device taken, whole or by two halves.
            if draw(st.integers(0, 9)) == 0:
                continue
            fraction = draw(st.sampled_from((None, None, 0.5)))
            for part in range(1 if fraction is None else 2):
                active.append(
                    RunningWorkload(
                        id=f"r{i}-{d}-{part}",
                        spec=spec(team=team, cls="batch", fraction=fraction),
                        spoke_id=s.id,
                        assignments=(Assignment(node=n.name, devices=(d,), fraction=fraction),),
                        started_at=float(d),
                    )
                )
            if team == "steady":
                steady += 1.0
    policy = Policy(
        teams=(
            Team("owner", quotas={"*": Quota(float(size) + draw(st.sampled_from((0, 4))))}),
            Team("borrower", quotas={"*": Quota(0)}),
            Team("steady", quotas={"*": Quota(steady)}),
        )
    )
    queue = (Workload("w", spec(**shape), 0.0),)
    return World(occupy(base, active), tuple(active), queue, policy)


def _fits_once_borrowed_work_stops(world: World) -> bool:
    staying = [r for r in world.running if r.spec.team != "borrower"]
    empty = Snapshot(
        tuple(
            Spoke(
                s.id,
                s.region,
                s.kind,
                tuple(
                    Node(n.name, n.gpu_model, n.gpu_count, tuple(range(n.gpu_count)), {}, n.labels)
                    for n in s.nodes
                ),
            )
            for s in world.snapshot.spokes
        )
    )
    return bool(plan(occupy(empty, staying), world.pending, [], world.policy, NOW).placements)


@SETTINGS
@given(reclaimable())
def test_guarantee_is_honoured_when_borrowed_work_can_be_reclaimed(world: World) -> None:
    result = plan(world.snapshot, world.pending, world.running, world.policy, NOW)
    check_invariants(world.snapshot, world.pending, world.running, world.policy, result)
    if not _fits_once_borrowed_work_stops(world):
        return  # nothing borrowed to reclaim would make it fit
    (workload,) = world.pending
    assert result.placements or any(p.for_workload == workload.id for p in result.preemptions), (
        result
    )
