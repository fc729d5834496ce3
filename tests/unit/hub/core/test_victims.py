"""Other teams' borrowed work, as preemption reads it (hub.core.victims).

Borrowed work is what a team runs beyond its own guarantee, counted from the end of its victim
order (lowest priority, then newest first); a department's members first fill the
department's shared pool, in the same order across them. Read through a plan's own sorting or
through the order kept across plans (`KeptOrder`): the same order, item for item.
"""

from __future__ import annotations

from heapq import merge

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.capacity import EPS, Capacity
from hub.core.holdings import KeptOrder
from hub.core.model import RunningWorkload
from hub.core.policy import DEFAULT_CLASSES, Department, Policy, PriorityClass, Quota, Team
from hub.core.quotas import Ledger
from hub.core.victims import Victims, tally
from schemas import Assignment
from tests.unit.hub.core.builders import fleet, node, spec, spoke

TEAMS = ("t0", "t1", "t2", "t3", "t4")
CLASSES = ("production", "training", "dev", "batch", "odd")  # "odd": not in the policy


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Policy, list[RunningWorkload]]:
    dept = draw(st.booleans())
    teams = tuple(
        Team(
            name,
            department="d" if dept and name in ("t0", "t1", "t2") else None,
            quotas={"H100": Quota(draw(st.sampled_from((0, 8, 40, 120, 300))))},
        )
        for name in TEAMS
    )
    classes = DEFAULT_CLASSES
    if draw(st.booleans()):  # two classes of one value: a team's work is not in victim order
        classes = (*classes, PriorityClass("also-dev", 300))
    departments = (Department("d", {"H100": Quota(draw(st.sampled_from((0, 100, 400))))}),)
    policy = Policy(teams=teams, departments=departments if dept else (), classes=classes)
    running = []
    for i in range(draw(st.integers(0, 400))):
        shape = draw(st.sampled_from(((1, None), (2, None), (8, None), (1, 0.25), (1, 0.5))))
        cls = draw(st.sampled_from((*CLASSES, *(c.name for c in classes[4:]))))
        work = spec(
            team=draw(st.sampled_from(TEAMS)),
            cls=cls,
            gpus=shape[0],
            fraction=shape[1],
            models=("H100",),
        )
        started = draw(st.sampled_from((0.0, 10.0, 20.0, float(i))))  # ties, broken by id
        placed = (Assignment(node="n0", devices=(0,), fraction=shape[1]),)
        running.append(RunningWorkload(f"w{i:03d}", work, "s0", placed, started))
    return policy, running


def expected(policy: Policy, running: list[RunningWorkload], team: str) -> list[str]:
    """Borrowed work by the rule, the slow way: ids in victim order."""

    def order(r: RunningWorkload) -> tuple[int, float, str]:
        cls = policy.priority_class(r.spec.priority_class)
        return (cls.value if cls else 0, -r.started_at, r.id)

    def victim_order(work: list[RunningWorkload]) -> list[RunningWorkload]:
        by_class: dict[tuple[int, str], list[RunningWorkload]] = {}
        for r in work:
            by_class.setdefault((order(r)[0], r.spec.priority_class), []).append(r)
        return [r for key in sorted(by_class) for r in sorted(by_class[key], key=order)]

    def beyond_own(t: Team) -> list[tuple[RunningWorkload, float]]:
        work = [r for r in running if r.spec.team == t.name]
        over = sum(r.spec.total_gpus for r in work) - t.quotas["H100"].guaranteed
        out, counted = [], 0.0
        for r in victim_order(work):
            if counted >= over - EPS:
                break
            out.append((r, min(r.spec.total_gpus, over - counted)))
            counted += r.spec.total_gpus
        return out

    streams = [[r for r, _ in beyond_own(t)] for t in policy.teams if t.department is None]
    members = [t for t in policy.teams if t.department == "d"]
    if members:
        over = 0.0
        for t in members:
            work = sum(r.spec.total_gpus for r in running if r.spec.team == t.name)
            if work - t.quotas["H100"].guaranteed > EPS:
                over += work - t.quotas["H100"].guaranteed
        parts = [beyond_own(t) for t in members]
        pool = policy.departments[0].quotas["H100"].guaranteed
        pool -= sum(t.quotas["H100"].guaranteed for t in members)
        beyond = over - max(0.0, pool)
        cut, counted = [], 0.0
        for r, part in merge(*parts, key=lambda e: order(e[0])):
            if counted >= beyond - EPS:
                break
            cut.append(r)
            counted += part
        streams.append(cut)
    found = []
    for r in merge(*streams, key=order):
        cls = policy.priority_class(r.spec.priority_class)
        if cls is not None and cls.preemptible and r.spec.team != team:
            found.append(r.id)
    return found


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.sampled_from((*TEAMS, "t-none")), st.booleans())
def test_borrowed_work_is_every_other_teams_work_beyond_its_guarantee_in_victim_order(
    world: tuple[Policy, list[RunningWorkload]], team: str, kept: bool
) -> None:
    policy, running = world
    capacity = Capacity(fleet(spoke("s0", node("n0", "H100", 8))))
    work = tally(running, capacity.model_of)
    ledger = Ledger(policy, capacity.total_by_model)
    order = KeptOrder() if kept else None
    victims = Victims(work, capacity, ledger, policy, order)
    want = expected(policy, running, team)
    assert [h.id for h in victims.borrowed("H100", team)] == want
    # Read again (a later search in the same plan), and by a fresh index on the kept order.
    assert [h.id for h in victims.borrowed("H100", team)] == want
    again = Victims(work, capacity, ledger, policy, order)
    assert [h.id for h in again.borrowed("H100", team)] == want


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    worlds(),
    st.sampled_from((*TEAMS, "t-none")),
    st.sampled_from((0, 100, 200, 300, 1000)),
    st.booleans(),
    st.data(),
)
def test_a_search_on_few_spokes_is_told_when_no_candidate_runs_there(
    world: tuple[Policy, list[RunningWorkload]],
    team: str,
    below: int,
    borrowed: bool,
    data: st.DataObject,
) -> None:
    """`may_list_on` says False exactly when neither the team's own lower-priority work nor
    (when asked) other teams' borrowed work lists anything on the spokes; borrowed work reads
    the same afterwards."""
    policy, running = world
    spokes = tuple(f"s{i}" for i in range(12))  # a search on one spoke of 12 sees few
    running = [
        RunningWorkload(
            r.id, r.spec, data.draw(st.sampled_from(spokes)), r.assignments, r.started_at
        )
        for r in running
    ]
    capacity = Capacity(fleet(spoke("s0", node("n0", "H100", 8))))
    work = tally(running, capacity.model_of)
    victims = Victims(work, capacity, Ledger(policy, capacity.total_by_model), policy, None)
    own = list(victims.own(team, "H100", below))
    victims.chosen.update(data.draw(st.sets(st.sampled_from([r.id for r in running] or ["-"]))))
    others = list(victims.borrowed("H100", team)) if borrowed else []
    fresh = Victims(work, capacity, Ledger(policy, capacity.total_by_model), policy, None)
    fresh.chosen = victims.chosen
    wanted = set(data.draw(st.sets(st.sampled_from(spokes), max_size=2)))
    want = any(h.workload.spoke_id in wanted for h in (*own, *others))
    assert fresh.may_list_on(wanted, team, "H100", below, borrowed) == want
    left = [i for i in expected(policy, running, team) if i not in fresh.chosen]
    assert [h.id for h in fresh.borrowed("H100", team)] == left
