"""Hypothesis properties of the burst planner: limits hold, nothing runs away, nothing flaps."""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burst.catalog import load_catalog
from burst.core import (
    BurstPlan,
    BurstPolicy,
    CloudInstance,
    MarketPreference,
    OfferKey,
    PlannerState,
    TeamBudget,
    TerminateReason,
    commit_plan,
    plan_burst,
)
from schemas.burst import DemandItem, DemandReport, InstanceState, Market

CATALOG = load_catalog()
TYPES = [spec.name for spec in CATALOG.instance_types]
REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]
TEAMS = ["ml", "cv", "nlp"]
MODELS = [None, "H100", "h200", "A10G", "L4", "A100", "B200"]
NOW = 50_000.0
EPS = 1e-6

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Case:
    demand: DemandReport
    fleet: list[CloudInstance]
    policy: BurstPolicy
    state: PlannerState

    def plan(self) -> BurstPlan:
        return plan_burst(self.demand, self.fleet, CATALOG, self.policy, self.state, NOW)


@st.composite
def items(draw: st.DrawFn) -> list[DemandItem]:
    found: list[DemandItem] = []
    for n in range(draw(st.integers(0, 5))):
        fraction = draw(st.sampled_from([None, None, None, 0.25, 0.5, 0.3]))
        if fraction is None:
            gpus, nodes = draw(st.integers(1, 9)), draw(st.sampled_from([1, 1, 1, 2, 3]))
        else:
            gpus, nodes = 1, 1
        count = draw(st.integers(1, 5))
        listed = draw(st.sampled_from([count, count, count, max(0, count - 2)]))
        found.append(
            DemandItem(
                team=draw(st.sampled_from(TEAMS)),
                gpu_model=draw(st.sampled_from(MODELS)),
                gpus_per_node=gpus,
                nodes=nodes,
                gpu_fraction=fraction,
                count=count,
                oldest_age_s=draw(st.floats(0, 400)),
                workload_ids=tuple(f"w{n}-{k}" for k in range(listed)),
                regions=tuple(draw(st.sets(st.sampled_from(REGIONS), max_size=2))),
                spot_ok=draw(st.booleans()),
            )
        )
    return found


@st.composite
def cases(draw: st.DrawFn) -> Case:
    demand = draw(items())
    all_ids = [w for item in demand for w in item.workload_ids]
    fleet = []
    for n in range(draw(st.integers(0, 8))):
        status = draw(st.sampled_from(list(InstanceState)))
        fleet.append(
            CloudInstance(
                id=f"i{n}",
                instance_type=draw(st.sampled_from(TYPES)),
                region=draw(st.sampled_from(REGIONS)),
                market=draw(st.sampled_from(list(Market))),
                team=draw(st.sampled_from(TEAMS)),
                state=status,
                launched_at=NOW - draw(st.floats(0, 3000)),
                price_per_hour=draw(st.floats(0.3, 60)),
                idle_since=draw(st.one_of(st.none(), st.floats(NOW - 1000, NOW))),
                runs_non_preemptible=draw(st.booleans()),
                workload_ids=tuple(draw(st.sets(st.sampled_from(all_ids), max_size=3)))
                if all_ids
                else (),
            )
        )
    budgets = {
        team: TeamBudget(
            dollars_per_hour=draw(st.one_of(st.none(), st.floats(0, 80))),
            dollars_total=draw(st.one_of(st.none(), st.floats(0, 100))),
        )
        for team in draw(st.sets(st.sampled_from(TEAMS)))
    }
    policy = BurstPolicy(
        burst_after_s=draw(st.floats(0, 200)),
        idle_ttl_s=draw(st.floats(0, 600)),
        cooldown_s=draw(st.floats(0, 300)),
        boot_timeout_s=draw(st.floats(0, 3000)),
        max_instances=draw(st.one_of(st.none(), st.integers(0, 12))),
        max_dollars_per_hour=draw(st.one_of(st.none(), st.floats(0, 200))),
        team_budgets=budgets,
        allowed_teams=draw(st.one_of(st.none(), st.frozensets(st.sampled_from(TEAMS)))),
        markets=draw(st.sampled_from(list(MarketPreference))),
        regions=draw(st.one_of(st.none(), st.frozensets(st.sampled_from(REGIONS), min_size=1))),
    )
    blocked = {
        OfferKey(draw(st.sampled_from(TYPES)), draw(st.sampled_from(REGIONS)), market): NOW
        + draw(st.floats(-100, 100))
        for market in draw(st.lists(st.sampled_from(list(Market)), max_size=6))
    }
    state = PlannerState(
        last_launch_at={
            t: NOW - draw(st.floats(0, 600)) for t in draw(st.sets(st.sampled_from(TEAMS)))
        },
        last_terminate_at={
            t: NOW - draw(st.floats(0, 600)) for t in draw(st.sets(st.sampled_from(TEAMS)))
        },
        blocked=blocked,
        team_spend={t: draw(st.floats(0, 150)) for t in draw(st.sets(st.sampled_from(TEAMS)))},
    )
    report = DemandReport(
        items=tuple(demand), sent_at=NOW - draw(st.sampled_from([0.0, 5.0, 30.0])), seq=3
    )
    return Case(report, fleet, policy, state)


def live(case: Case, team: str | None = None) -> list[CloudInstance]:
    return [i for i in case.fleet if i.state.active and (team is None or i.team == team)]


@FAST
@given(cases())
def test_budgets_and_instance_limits_are_never_exceeded(case: Case) -> None:
    plan = case.plan()
    policy = case.policy
    if plan.launches and policy.max_instances is not None:
        assert len(live(case)) + len(plan.launches) <= policy.max_instances
    if plan.launches and policy.max_dollars_per_hour is not None:
        rate = sum(i.price_per_hour for i in live(case)) + plan.dollars_per_hour
        assert rate <= policy.max_dollars_per_hour + EPS
    for team, budget in policy.team_budgets.items():
        added = sum(x.price_per_hour for x in plan.launches if x.team == team)
        if added and budget.dollars_per_hour is not None:
            assert sum(i.price_per_hour for i in live(case, team)) + added <= (
                budget.dollars_per_hour + EPS
            )
        spent = case.state.team_spend.get(team, 0.0)
        if budget.dollars_total is not None and spent >= budget.dollars_total:
            assert added == 0


@FAST
@given(cases())
def test_launches_only_for_old_uncovered_allowed_demand(case: Case) -> None:
    plan = case.plan()
    policy = case.policy
    report_age = NOW - case.demand.sent_at
    covered = {
        w
        for i in case.fleet
        if i.state in (InstanceState.REQUESTED, InstanceState.RUNNING)
        for w in i.workload_ids
    }
    owner = {w: item for item in case.demand.items for w in item.workload_ids}
    eligible_teams = {
        item.team
        for item in case.demand.items
        if item.oldest_age_s + report_age >= policy.burst_after_s
        and (policy.allowed_teams is None or item.team in policy.allowed_teams)
        and item.count > len([w for w in item.workload_ids if w in covered])
    }
    for launch in plan.launches:
        assert launch.team in eligible_teams
        for workload_id in launch.workload_ids:
            assert workload_id not in covered
            assert owner[workload_id].team == launch.team
            assert owner[workload_id].oldest_age_s + report_age >= policy.burst_after_s


@FAST
@given(cases())
def test_every_launch_fits_its_workloads_and_offers(case: Case) -> None:
    plan = case.plan()
    owner = {w: item for item in case.demand.items for w in item.workload_ids}
    placements: Counter[str] = Counter()
    for launch in plan.launches:
        assert case.state.blocked.get(launch.offer, -math.inf) <= NOW
        assert case.policy.regions is None or launch.region in case.policy.regions
        gpus = 0.0
        for workload_id in launch.workload_ids:
            item = owner[workload_id]
            placements[workload_id] += 1
            if item.gpu_model is not None:
                assert launch.gpu_model.casefold() == item.gpu_model.casefold()
            assert not item.regions or launch.region in item.regions
            if launch.market is Market.SPOT:
                assert item.spot_ok
                assert case.policy.markets is MarketPreference.SPOT_FIRST
            gpus += item.gpu_fraction or item.gpus_per_node
        assert gpus <= launch.gpu_count + EPS
    for workload_id, times in placements.items():
        assert times == owner[workload_id].nodes  # one instance per node of a gang


@FAST
@given(cases())
def test_every_listed_workload_gets_exactly_one_outcome(case: Case) -> None:
    plan = case.plan()
    # a gang's id is on each of its instances: one outcome still
    outcomes: Counter[str] = Counter({w for launch in plan.launches for w in launch.workload_ids})
    for skip in plan.skipped:
        outcomes.update(skip.workload_ids)
    for item in case.demand.items:
        for workload_id in item.workload_ids:
            assert outcomes[workload_id] == 1, workload_id


@FAST
@given(cases())
def test_terminations_never_touch_protected_instances(case: Case) -> None:
    plan = case.plan()
    by_id = {i.id: i for i in case.fleet}
    assert len({t.instance_id for t in plan.terminations}) == len(plan.terminations)
    for termination in plan.terminations:
        instance = by_id[termination.instance_id]
        assert not instance.runs_non_preemptible
        if termination.reason is TerminateReason.IDLE:
            assert instance.state is InstanceState.RUNNING
            assert instance.idle_since is not None
            assert NOW - instance.idle_since >= case.policy.idle_ttl_s
            last = max(instance.launched_at, case.state.last_launch_at.get(instance.team, 0.0))
            assert NOW - last >= case.policy.cooldown_s
        else:
            assert instance.state is InstanceState.REQUESTED
            assert NOW - instance.launched_at >= case.policy.boot_timeout_s
    # and, unless cooldowns are off, a team losing an instance gets none in the same plan
    if case.policy.cooldown_s > 0:
        assert not {t.team for t in plan.terminations} & {x.team for x in plan.launches}


@FAST
@given(cases())
def test_same_input_same_plan_and_inputs_untouched(case: Case) -> None:
    before = copy.deepcopy(case)
    assert case.plan() == case.plan()
    assert case == before


# -- flapping ---------------------------------------------------------------------------------


def simulate(
    pattern: list[bool], policy: BurstPolicy, boot_s: float, step_s: float
) -> list[tuple[str, float]]:
    """A hub with one team whose single 8xH100 job comes and goes with `pattern`.

    Booted instances take the pending job when they are idle (the hub places it), so demand only
    reaches the planner when no idle instance can serve it. Returns ("launch"|"terminate", t).
    """
    fleet: dict[str, CloudInstance] = {}
    busy: set[str] = set()
    state = PlannerState()
    events: list[tuple[str, float]] = []
    pending: str | None = None
    jobs = 0
    for step, on in enumerate(pattern):
        now = NOW + step * step_s
        for iid, inst in list(fleet.items()):
            if inst.state is InstanceState.REQUESTED and now - inst.launched_at >= boot_s:
                fleet[iid] = replace(inst, state=InstanceState.RUNNING, idle_since=now)
        if not on:
            pending = None
            for iid in busy:
                fleet[iid] = replace(fleet[iid], idle_since=now)
            busy.clear()
        else:
            if pending is None and not busy:
                jobs += 1
                pending = f"job{jobs}"
            idle = sorted(
                i for i, x in fleet.items() if x.state is InstanceState.RUNNING and i not in busy
            )
            if pending is not None and idle:
                busy.add(idle[0])
                fleet[idle[0]] = replace(fleet[idle[0]], idle_since=None)
                pending = None
        demand = tuple(
            DemandItem(
                team="ml",
                gpu_model="H100",
                gpus_per_node=8,
                oldest_age_s=step_s,
                workload_ids=(job,),
            )
            for job in ([pending] if pending else [])
        )
        report = DemandReport(items=demand, sent_at=now, seq=step)
        plan = plan_burst(report, list(fleet.values()), CATALOG, policy, state, now)
        for termination in plan.terminations:
            del fleet[termination.instance_id]
            busy.discard(termination.instance_id)
            events.append(("terminate", now))
        for launch in plan.launches:
            fleet[launch.request_id] = CloudInstance(
                id=launch.request_id,
                instance_type=launch.instance_type,
                region=launch.region,
                market=launch.market,
                team=launch.team,
                state=InstanceState.REQUESTED,
                launched_at=now,
                price_per_hour=launch.price_per_hour,
                workload_ids=launch.workload_ids,
            )
            events.append(("launch", now))
        state = commit_plan(state, plan, now)
    return events


def flaps(events: list[tuple[str, float]], cooldown: float) -> int:
    """Terminations with a launch less than `cooldown` before or after them."""
    launches = [t for kind, t in events if kind == "launch"]
    return sum(
        1
        for kind, t in events
        if kind == "terminate" and any(abs(t - launch) < cooldown for launch in launches)
    )


@settings(max_examples=100, deadline=None)
@given(
    pattern=st.lists(st.booleans(), min_size=10, max_size=80),
    cooldown=st.floats(1, 300),
    idle_ttl=st.floats(0, 400),
    boot_s=st.floats(1, 200),
    step_s=st.floats(5, 60),
)
def test_oscillating_demand_does_not_flap(
    pattern: list[bool], cooldown: float, idle_ttl: float, boot_s: float, step_s: float
) -> None:
    policy = BurstPolicy(
        burst_after_s=0, idle_ttl_s=idle_ttl, cooldown_s=cooldown, boot_timeout_s=1e9
    )
    assert flaps(simulate(pattern, policy, boot_s, step_s), cooldown) == 0


def test_demand_toggling_every_step_launches_once() -> None:
    policy = BurstPolicy(burst_after_s=0)
    events = simulate([True, False] * 100, policy, boot_s=90, step_s=20)
    assert [kind for kind, _ in events] == ["launch"]


def test_without_cooldown_and_idle_ttl_the_same_demand_churns() -> None:
    # The simulation can see flapping: with no damping, instances come and go.
    churn = BurstPolicy(burst_after_s=0, idle_ttl_s=0, cooldown_s=0)
    events = simulate([True, True, True, False] * 20, churn, boot_s=30, step_s=20)
    assert flaps(events, cooldown=120) > 5
