"""Small builders for placement tests, and the invariants every plan must keep."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from hub.core.consolidate import CONSOLIDATE
from hub.core.model import Node, Plan, RunningWorkload, Snapshot, Spoke, Workload
from hub.core.placement import plan
from hub.core.policy import Policy, quota_for
from schemas import Assignment, RuntimeCapabilities, SpokeKind, WorkloadSpec

EPS = 1e-6


def node(
    name: str,
    model: str = "H100",
    gpus: int = 8,
    free: Sequence[int] | None = None,
    shared: dict[int, float] | None = None,
    **labels: str,
) -> Node:
    return Node(
        name=name,
        gpu_model=model,
        gpu_count=gpus,
        free=tuple(range(gpus)) if free is None else tuple(free),
        free_fraction=shared or {},
        labels=labels,
    )


def spoke(
    sid: str,
    *nodes: Node,
    region: str = "eu",
    cloud: bool = False,
    price: float = 0.0,
    accepts: bool = True,
    reserved_for: tuple[str, ...] = (),
    capabilities: RuntimeCapabilities | None = None,
    **labels: str,
) -> Spoke:
    return Spoke(
        id=sid,
        region=region,
        kind=SpokeKind.CLOUD if cloud else SpokeKind.ONPREM,
        nodes=nodes,
        labels=labels,
        accepts_work=accepts,
        price_per_gpu_hour=price,
        reserved_for=reserved_for,
        capabilities=capabilities or RuntimeCapabilities(),
    )


def fleet(*spokes: Spoke) -> Snapshot:
    return Snapshot(spokes=tuple(spokes))


def spec(
    team: str = "vision",
    cls: str = "batch",
    gpus: int = 1,
    nodes: int = 1,
    models: Sequence[str] = (),
    fraction: float | None = None,
    **affinity: Any,
) -> WorkloadSpec:
    return WorkloadSpec(
        name="job",
        team=team,
        priority_class=cls,
        command=("train",),
        gpus_per_node=gpus,
        nodes=nodes,
        gpu_models=tuple(models),
        gpu_fraction=fraction,
        affinity=affinity,
    )


def pending(wid: str, at: float = 0.0, **kw: Any) -> Workload:
    return Workload(id=wid, spec=spec(**kw), submitted_at=at)


def running(
    wid: str,
    spoke_id: str,
    placed: dict[str, Sequence[int]] | None = None,
    started: float = 0.0,
    fraction: float | None = None,
    preempting: bool = False,
    preempted_for: str | None = None,
    **kw: Any,
) -> RunningWorkload:
    """A running workload; `placed` maps node name -> devices."""
    placed = placed or {}
    if fraction is not None:
        kw["fraction"] = fraction
    else:
        kw.setdefault("gpus", len(next(iter(placed.values()))) if placed else 1)
        kw.setdefault("nodes", len(placed) or 1)
    return RunningWorkload(
        id=wid,
        spec=spec(**kw),
        spoke_id=spoke_id,
        assignments=tuple(
            Assignment(node=n, devices=tuple(d), fraction=fraction) for n, d in placed.items()
        ),
        started_at=started,
        preempting=preempting,
        preempted_for=preempted_for,
    )


def placed(plan: Plan) -> dict[str, tuple[str, tuple[Assignment, ...]]]:
    return {p.workload_id: (p.spoke_id, p.assignments) for p in plan.placements}


def why(plan: Plan) -> dict[str, tuple[str, str]]:
    return {u.workload_id: (u.reason.value, u.message) for u in plan.unplaced}


def victims(plan: Plan) -> list[str]:
    return [p.workload_id for p in plan.preemptions]


def check_invariants(
    snapshot: Snapshot,
    queue: Sequence[Workload],
    active: Sequence[RunningWorkload],
    policy: Policy,
    plan: Plan,
) -> None:
    """What every plan must keep, whatever the input."""
    nodes = {(s.id, n.name): (s, n) for s in snapshot.spokes for n in s.nodes}
    by_id = {w.id: w for w in queue}
    # Every pending workload is decided exactly once.
    decided = [p.workload_id for p in plan.placements] + [u.workload_id for u in plan.unplaced]
    assert sorted(decided) == sorted(by_id), "each pending workload placed or explained once"
    for u in plan.unplaced:
        assert u.message, f"{u.workload_id} has no message"
    whole: set[tuple[str, str, int]] = set()
    share: dict[tuple[str, str, int], float] = defaultdict(float)
    for p in plan.placements:
        w = by_id[p.workload_id]
        s, _ = nodes[(p.spoke_id, p.assignments[0].node)]
        assert s.accepts_work
        models = {nodes[(p.spoke_id, a.node)][1].gpu_model for a in p.assignments}
        assert len(models) == 1, "a gang runs on one GPU model"
        if w.spec.gpu_models:
            assert models <= set(w.spec.gpu_models)
        if w.spec.gpu_fraction is None:
            # Gangs all or nothing: exactly `nodes` distinct nodes with gpus_per_node each.
            assert len(p.assignments) == w.spec.nodes
            assert len({a.node for a in p.assignments}) == w.spec.nodes
            for a in p.assignments:
                _, n = nodes[(p.spoke_id, a.node)]
                assert n.schedulable
                assert len(set(a.devices)) == w.spec.gpus_per_node and a.fraction is None
                for d in a.devices:
                    key = (p.spoke_id, a.node, d)
                    assert d in n.free and d not in n.free_fraction, f"{key} was not free"
                    assert key not in whole, f"{key} given twice"
                    whole.add(key)
        else:
            (a,) = p.assignments
            (d,) = a.devices
            share[(p.spoke_id, a.node, d)] += a.fraction or 0.0
        for k, v in w.spec.affinity.required_labels.items():
            for a in p.assignments:
                _, n = nodes[(p.spoke_id, a.node)]
                assert {**s.labels, **n.labels}.get(k) == v
        if w.spec.affinity.required_regions:
            assert s.region in w.spec.affinity.required_regions
        team = policy.team(w.spec.team)
        if s.kind == SpokeKind.CLOUD:
            assert team.may_burst, "only teams that may burst run on cloud spokes"
        if s.reserved_for:
            assert w.spec.team in s.reserved_for
        assert p.spoke_id not in w.avoid_spokes, "never back to a spoke that refused it"
        names = tuple(a.node for a in p.assignments)
        refusal = s.capabilities.refuses(w.spec.nodes, w.spec.gpu_fraction is not None, names)
        assert refusal is None, f"{p.workload_id} sent where {refusal}"
    for key, total in share.items():
        assert key not in whole, f"{key} shared and given whole"
        _, n = nodes[key[:2]]
        available = n.free_fraction.get(key[2], 1.0 if key[2] in n.free else 0.0)
        assert total <= available + EPS, f"{key} over-committed: {total} > {available}"
    check_limits(snapshot, queue, active, policy, plan)
    # Production (any class never preempted) is never a victim, nor is stopping work.
    run = {r.id: r for r in active}
    for victim in plan.preemptions:
        r = run[victim.workload_id]
        cls = policy.priority_class(r.spec.priority_class)
        assert cls is not None and cls.preemptible, f"{r.id} may not be preempted"
        assert not r.preempting, f"{r.id} was already being preempted"
    assert len({v.workload_id for v in plan.preemptions}) == len(plan.preemptions)
    check_victims(snapshot, queue, active, policy, plan)


def check_victims(
    snapshot: Snapshot,
    queue: Sequence[Workload],
    active: Sequence[RunningWorkload],
    policy: Policy,
    plan: Plan,
) -> None:
    """Own-team victims rank lower; other teams' victims come from teams over guarantee."""
    models = {(s.id, n.name): n.gpu_model for s in snapshot.spokes for n in s.nodes}
    by_id = {w.id: w for w in queue}
    run = {r.id: r for r in active}
    usage: dict[tuple[str, str], float] = defaultdict(float)
    for r in active:
        if r.assignments and not r.preempting:
            usage[(r.spec.team, models[(r.spoke_id, r.assignments[0].node)])] += r.spec.total_gpus
    cloud = {s.id for s in snapshot.spokes if s.kind == SpokeKind.CLOUD}
    for v in plan.preemptions:
        victim = run[v.workload_id]
        if not v.for_workload:  # consolidation: cloud work moved on-prem, for nobody
            assert policy.consolidation.enabled and victim.spoke_id in cloud, v
            assert v.reason.startswith(CONSOLIDATE), v
            continue
        beneficiary = by_id[v.for_workload]
        if victim.spec.team == beneficiary.spec.team:
            assert policy.priority(victim.spec.priority_class) < policy.priority(
                beneficiary.spec.priority_class
            ), f"{victim.id} is not lower priority than {beneficiary.id}"
        else:
            model = models[(victim.spoke_id, victim.assignments[0].node)]
            quota = quota_for(policy.team(victim.spec.team).quotas, model)
            guaranteed = quota.guaranteed if quota is not None else 0.0
            assert usage[(victim.spec.team, model)] > guaranteed + EPS, (
                f"{victim.id} reclaimed from team {victim.spec.team} within its guarantee"
            )


def check_limits(
    snapshot: Snapshot,
    queue: Sequence[Workload],
    active: Sequence[RunningWorkload],
    policy: Policy,
    plan: Plan,
) -> None:
    """No team (or department) goes over a limit it was within before the plan."""
    models = {(s.id, n.name): n.gpu_model for s in snapshot.spokes for n in s.nodes}
    by_id = {w.id: w for w in queue}
    before: dict[tuple[str, str], float] = defaultdict(float)
    for r in active:
        model = models.get((r.spoke_id, r.assignments[0].node)) if r.assignments else None
        if model is not None:
            before[(r.spec.team, model)] += r.spec.total_gpus
    after = dict(before)
    for p in plan.placements:
        w = by_id[p.workload_id]
        key = (w.spec.team, models[(p.spoke_id, p.assignments[0].node)])
        after[key] = after.get(key, 0.0) + w.spec.total_gpus
    dept_before: dict[tuple[str, str], float] = defaultdict(float)
    dept_after: dict[tuple[str, str], float] = defaultdict(float)
    for (team, model), used in after.items():
        quota = quota_for(policy.team(team).quotas, model)
        if (
            quota is not None
            and quota.limit is not None
            and after[(team, model)] > before.get((team, model), 0.0)
        ):
            assert used <= quota.limit + EPS, f"team {team} over its {model} limit"
        dept = policy.team(team).department
        if dept is not None:
            dept_after[(dept, model)] += used
            dept_before[(dept, model)] += before.get((team, model), 0.0)
    for (dept, model), used in dept_after.items():
        d = policy.department(dept)
        quota = quota_for(d.quotas, model) if d is not None else None
        if quota is not None and quota.limit is not None and used > dept_before[(dept, model)]:
            assert used <= quota.limit + EPS, f"department {dept} over its {model} limit"


def occupy(snapshot: Snapshot, active: Sequence[RunningWorkload]) -> Snapshot:
    """The snapshot with the devices `active` holds taken off its free devices."""
    taken: dict[tuple[str, str], list[tuple[int, float | None]]] = defaultdict(list)
    for r in active:
        for a in r.assignments:
            for d in a.devices:
                taken[(r.spoke_id, a.node)].append((d, a.fraction))
    spokes = []
    for s in snapshot.spokes:
        nodes = []
        for n in s.nodes:
            free = set(n.free)
            shared = dict(n.free_fraction)
            for d, fraction in taken.get((s.id, n.name), ()):
                if fraction is None:
                    free.discard(d)
                    shared.pop(d, None)
                else:
                    if d in free:
                        free.discard(d)
                        shared[d] = 1.0
                    shared[d] = shared.get(d, 0.0) - fraction
            nodes.append(
                Node(n.name, n.gpu_model, n.gpu_count, tuple(sorted(free)), shared, n.labels)
            )
        spokes.append(
            Spoke(
                s.id,
                s.region,
                s.kind,
                tuple(nodes),
                s.labels,
                s.accepts_work,
                s.price_per_gpu_hour,
                s.reserved_for,
            )
        )
    return Snapshot(tuple(spokes))


def checked_plan(
    base: Snapshot,
    queue: Sequence[Workload],
    active: Sequence[RunningWorkload],
    policy: Policy,
    now: float,
) -> Plan:
    """`plan()` on `base` with `active` holding its devices, its invariants checked."""
    snapshot = occupy(base, active)
    result = plan(snapshot, queue, active, policy, now)
    check_invariants(snapshot, queue, active, policy, result)
    return result
