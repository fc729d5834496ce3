"""Cloud burst in the replay: instances that boot, join as cloud spokes, and are billed.

Three settings:

- `none`: no cloud.
- `immediate`: after every cycle, each job the plan could not place for lack of capacity (a
  burstable reason, a team that may burst) and that no booting instance was launched for gets
  its own instance(s) at once: one per node, the cheapest catalog offer that holds it. An
  instance is released as soon as a cycle leaves it idle. No waiting, no packing, no reuse.
- `gpufed`: the burst service's planner, `burst.core.plan_burst`, on the hub's demand
  (`hub.core.demand.unplaceable_demand` of the last cycle) after every cycle and whenever one
  of its timers (burst_after, cooldown, idle_ttl) runs out, with its state kept by
  `commit_plan` and `accrue_spend` as the controller does.

A launched instance joins `boot_s` later as a cloud spoke of one node (the offer's GPUs),
reserved for its team, priced per GPU-hour, as the local provider's spokes are. Billing runs
from launch to termination. Each instance is its own spoke, as in the real system; plan() puts
a gang's nodes on one spoke, so a multi-node job cannot use the instances launched for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from burst.catalog import Catalog
from burst.core import (
    BurstPlan,
    BurstPolicy,
    CloudInstance,
    Launch,
    MarketPreference,
    Offer,
    PlannerState,
    SkipReason,
    accrue_spend,
    commit_plan,
    plan_burst,
)
from gpufed.replay.fleet import NodeSpec, SpokeSpec
from gpufed.replay.simulator import Simulator
from hub.core.demand import BURSTABLE, unplaceable_demand
from hub.core.model import Plan, Unplaced
from hub.core.policy import Policy
from schemas import SpokeKind, WorkloadSpec
from schemas.burst import DemandReport, InstanceState, Market

BURSTS = ("none", "immediate", "gpufed")
#: Added to timer wake-ups so that `now - since >= ttl` holds despite float rounding.
_NUDGE = 1e-6


@dataclass(slots=True)
class Instance:
    """One simulated cloud instance and its bill."""

    id: str
    team: str
    instance_type: str
    region: str
    market: Market
    price_per_hour: float
    gpu_model: str
    gpu_count: int
    launched_at: float
    workload_ids: tuple[str, ...] = ()
    joined_at: float | None = None
    terminated_at: float | None = None
    idle_since: float | None = None
    placed: int = 0  # workloads it ever ran

    def cost(self, until: float) -> float:
        """Dollars billed from launch to termination (or `until` while live)."""
        end = self.terminated_at if self.terminated_at is not None else until
        return self.price_per_hour * max(0.0, end - self.launched_at) / 3600.0


@dataclass(slots=True)
class CloudBurst:
    """Shared book-keeping of the burst settings; `none` is this class doing nothing."""

    policy: Policy
    catalog: Catalog
    burst_policy: BurstPolicy = field(default_factory=BurstPolicy)
    boot_s: float = 120.0
    live: dict[str, Instance] = field(default_factory=dict)
    ended: list[Instance] = field(default_factory=list)

    @property
    def instances(self) -> list[Instance]:
        """Every instance launched, ended ones first."""
        return [*self.ended, *self.live.values()]

    def after_cycle(self, sim: Simulator, now: float, plan: Plan) -> None:
        """React to a scheduling cycle (nothing to do without burst)."""

    def on_event(self, sim: Simulator, now: float, payload: object) -> None:
        """A booting instance joins; a timer of the subclass runs out."""
        if isinstance(payload, tuple) and payload[0] == "join":
            self._join(sim, now, str(payload[1]))

    def on_load(self, sim: Simulator, now: float, spoke_id: str, workloads: int) -> None:
        """Track when each instance went idle (and how much it ran)."""
        instance = self.live.get(spoke_id)
        if instance is None:
            return
        if workloads == 0:
            instance.idle_since = now
        else:
            instance.idle_since = None
            instance.placed += 1

    def launch(self, sim: Simulator, now: float, launch: Launch) -> None:
        """Start an instance; it joins `boot_s` later."""
        instance = Instance(
            id=launch.request_id,
            team=launch.team,
            instance_type=launch.instance_type,
            region=launch.region,
            market=launch.market,
            price_per_hour=launch.price_per_hour,
            gpu_model=launch.gpu_model,
            gpu_count=launch.gpu_count,
            launched_at=now,
            workload_ids=launch.workload_ids,
        )
        self.live[instance.id] = instance
        sim.schedule(now + self.boot_s, ("join", instance.id))

    def terminate(self, sim: Simulator, now: float, instance_id: str) -> bool:
        """Stop an idle instance; False (and nothing done) while it runs work."""
        instance = self.live.get(instance_id)
        if instance is None:
            return False
        if instance.joined_at is not None:
            if sim.cluster.spokes[instance_id].workloads:
                return False
            sim.cluster.remove(instance_id)
        instance.terminated_at = now
        self.ended.append(self.live.pop(instance_id))
        return True

    def _join(self, sim: Simulator, now: float, instance_id: str) -> None:
        instance = self.live.get(instance_id)
        if instance is None or instance.joined_at is not None:
            return  # terminated while booting
        instance.joined_at = instance.idle_since = now
        price = instance.price_per_hour / instance.gpu_count
        node = NodeSpec("gpu-node", instance.gpu_model, instance.gpu_count)
        sim.cluster.add(
            SpokeSpec(
                id=instance.id,
                region=instance.region,
                kind=SpokeKind.CLOUD,
                nodes=(node,),
                labels={"burst-team": instance.team, "instance-type": instance.instance_type},
                price_per_gpu_hour=price,
                reserved_for=(instance.team,),
            )
        )
        sim.changed()


@dataclass(slots=True)
class ImmediateBurst(CloudBurst):
    """An instance per unplaceable job at once; released when a cycle leaves it idle."""

    _seq: int = 0
    _offers: dict[tuple[str, int, bool], Offer | None] = field(default_factory=dict)

    def after_cycle(self, sim: Simulator, now: float, plan: Plan) -> None:
        """Release idle instances, then launch for every unplaceable job not yet covered."""
        for instance in list(self.live.values()):
            if instance.joined_at is not None and instance.idle_since is not None:
                self.terminate(sim, now, instance.id)
        booting = {wid for i in self.live.values() if i.joined_at is None for wid in i.workload_ids}
        for unplaced in plan.unplaced:
            if unplaced.reason not in BURSTABLE or unplaced.workload_id in booting:
                continue
            workload = sim.pending.get(unplaced.workload_id)
            if workload is None or not self.policy.team(workload.spec.team).may_burst:
                continue
            offer = self._offer(workload.spec)
            if offer is None:
                continue
            for _ in range(workload.spec.nodes):
                self._seq += 1
                launch = Launch(
                    request_id=f"imm-{self._seq}",
                    instance_type=offer.instance_type,
                    region=offer.region,
                    market=offer.market,
                    team=workload.spec.team,
                    price_per_hour=offer.price_per_hour,
                    gpu_model=offer.gpu_model,
                    gpu_count=offer.gpu_count,
                    workload_ids=(workload.id,),
                )
                self.launch(sim, now, launch)

    def _offer(self, spec: WorkloadSpec) -> Offer | None:
        """The cheapest offer one node of `spec` fits on (spot where the burst policy allows)."""
        cls = self.policy.priority_class(spec.priority_class)
        spot_ok = cls is None or cls.preemptible
        model = spec.gpu_models[0].casefold() if spec.gpu_models else ""
        key = (model, spec.gpus_per_node, spot_ok)
        if key not in self._offers:
            markets = self.burst_policy.markets
            regions = self.burst_policy.regions
            fitting = [
                o
                for o in self.catalog.offers()
                if (not model or o.gpu_model.casefold() == model)
                and o.gpu_count >= spec.gpus_per_node
                and (regions is None or o.region in regions)
                and (
                    o.market is Market.ON_DEMAND
                    or (spot_ok and markets is MarketPreference.SPOT_FIRST)
                )
            ]
            self._offers[key] = min(fitting, key=lambda o: (o.price_per_hour, o.key), default=None)
        return self._offers[key]


@dataclass(slots=True)
class GpufedBurst(CloudBurst):
    """gpufed's burst planner driven like the controller: a round after every cycle and timer."""

    state: PlannerState = field(default_factory=PlannerState)
    id_prefix: str = "replay"
    _unplaced: tuple[Unplaced, ...] = ()
    _seq: int = 0
    _accrued_at: float = 0.0
    _wake_at: float | None = None

    def after_cycle(self, sim: Simulator, now: float, plan: Plan) -> None:
        """Take the cycle's demand (nothing pending: none) and run a round."""
        self._unplaced = plan.unplaced
        self._round(sim, now)

    def on_event(self, sim: Simulator, now: float, payload: object) -> None:
        """Joins as in CloudBurst; a due timer runs a round."""
        if payload == "wake":
            if self._wake_at is not None and now >= self._wake_at:
                self._wake_at = None
                self._round(sim, now)
            return
        CloudBurst.on_event(self, sim, now, payload)

    def _round(self, sim: Simulator, now: float) -> None:
        if not self._unplaced and not self.live:
            return
        fleet = [self._view(i) for i in self.live.values()]
        self.state = accrue_spend(self.state, fleet, now - self._accrued_at)
        self._accrued_at = now
        self._seq += 1
        unplaced = [u for u in self._unplaced if u.workload_id in sim.pending]
        if unplaced:
            demand = unplaceable_demand(unplaced, sim.pending, self.policy, now, self._seq)
        else:
            demand = DemandReport(items=(), sent_at=now, seq=self._seq)
        result = plan_burst(
            demand, fleet, self.catalog, self.burst_policy, self.state, now, self.id_prefix
        )
        launched = [x for x in result.launches if x.request_id not in self.live]
        for launch in launched:
            self.launch(sim, now, launch)
        done = [t for t in result.terminations if self.terminate(sim, now, t.instance_id)]
        self.state = commit_plan(self.state, BurstPlan(tuple(launched), tuple(done)), now)
        self._schedule_wake(sim, now, result)

    def _view(self, instance: Instance) -> CloudInstance:
        # runs_non_preemptible stays False: it only guards instances the planner would stop,
        # and those (booting or idle) run nothing.
        state = InstanceState.REQUESTED if instance.joined_at is None else InstanceState.RUNNING
        return CloudInstance(
            id=instance.id,
            instance_type=instance.instance_type,
            region=instance.region,
            market=instance.market,
            team=instance.team,
            state=state,
            launched_at=instance.launched_at,
            price_per_hour=instance.price_per_hour,
            idle_since=instance.idle_since,
            workload_ids=instance.workload_ids,
        )

    def _schedule_wake(self, sim: Simulator, now: float, result: BurstPlan) -> None:
        """Wake at the first time a timer could change the plan: demand old enough, a cooldown
        over, an idle instance past its idle_ttl."""
        policy, times = self.burst_policy, []
        for skip in result.skipped:
            if skip.reason is SkipReason.TOO_YOUNG:
                times.append(now + policy.burst_after_s - skip.item.oldest_age_s)
            elif skip.reason is SkipReason.COOLDOWN:
                released = self.state.last_terminate_at.get(skip.item.team)
                if released is not None:
                    times.append(released + policy.cooldown_s)
                times += [
                    i.launched_at + policy.cooldown_s
                    for i in self.live.values()
                    if i.team == skip.item.team and i.joined_at is None
                ]
        for i in self.live.values():
            if i.idle_since is not None and i.joined_at is not None:
                last = max(i.launched_at, self.state.last_launch_at.get(i.team, i.launched_at))
                times.append(max(i.idle_since + policy.idle_ttl_s, last + policy.cooldown_s))
        future = [t + _NUDGE for t in times if t + _NUDGE > now]
        if not future:
            return
        wake = min(future)
        if self._wake_at is None or wake < self._wake_at:
            self._wake_at = wake
            sim.schedule(wake, "wake")


def make_burst(
    setting: str,
    policy: Policy,
    catalog: Catalog,
    burst_policy: BurstPolicy,
    boot_s: float,
) -> CloudBurst:
    """The burst side for `setting` (one of BURSTS)."""
    kinds: dict[str, type[CloudBurst]] = {
        "none": CloudBurst,
        "immediate": ImmediateBurst,
        "gpufed": GpufedBurst,
    }
    if setting not in kinds:
        raise ValueError(f"unknown burst setting {setting!r}; use one of {', '.join(BURSTS)}")
    return kinds[setting](policy, catalog, burst_policy, boot_s)
