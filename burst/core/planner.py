"""The burst planner: pending demand and the cloud fleet in, launches and terminations out.

Pure: the clock (`now`), the id prefix and everything remembered between rounds are passed in;
the same input gives the same plan.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from burst.core.budget import initial_budget
from burst.core.model import (
    BurstPlan,
    BurstPolicy,
    CloudInstance,
    Launch,
    MarketPreference,
    Offer,
    OfferCatalog,
    PlannerState,
    Skip,
    SkipReason,
    Terminate,
    TerminateReason,
)
from burst.core.packing import Unit, Work, pack
from schemas.burst import DemandItem, DemandReport, InstanceState, Market
from schemas.common import BURST_ID_PREFIX_PATTERN, PATTERN_MEANINGS

#: Launch ids are `<prefix>-<seq>-<n>-<digest>`: spoke ids, EC2 client tokens and tag values.
ID_PREFIX = re.compile(BURST_ID_PREFIX_PATTERN)


def plan_burst(
    demand: DemandReport,
    fleet: Sequence[CloudInstance],
    catalog: OfferCatalog,
    policy: BurstPolicy,
    state: PlannerState,
    now: float,
    id_prefix: str = "burst",
) -> BurstPlan:
    """Decide which instances to launch for `demand` and which of `fleet` to terminate.

    Launches: demand older than its waiting budget (`burst_after_s` + `wait_per_gpu_s` per
    GPU), not already covered by a live instance launched for it, for allowed teams, outside
    cooldowns, and not work that ran before unless `burst_restarted`; packed (or, with
    `right_size`, one workload per instance) onto the offer that serves the most workloads
    within max_instances and the $/h budgets, then the cheapest in total (spot where the policy
    and the work allow it). Blocked offers (capacity errors) are skipped. Terminations:
    instances idle longer than `idle_ttl_s` and not launched within `cooldown_s`, and instances
    whose spoke never joined within `boot_timeout_s`; never one running non-preemptible work.

    `id_prefix` must differ between processes that reuse `demand.seq` values (e.g. the hub's
    incarnation), since launch ids are idempotency keys.
    """
    if not ID_PREFIX.match(id_prefix):
        meaning = PATTERN_MEANINGS[BURST_ID_PREFIX_PATTERN]
        raise ValueError(f"id_prefix {id_prefix!r} must be {meaning}")
    terminations = _terminations(fleet, policy, state, now)
    # A team losing an instance in this plan gets no new one in it either (no churn).
    released = dict(state.last_terminate_at)
    released.update({termination.team: now for termination in terminations})
    planner = _LaunchPlanner(
        demand, fleet, catalog, policy, replace(state, last_terminate_at=released), now, id_prefix
    )
    planner.run()
    return BurstPlan(tuple(planner.launches), tuple(terminations), tuple(planner.skipped))


def _terminations(
    fleet: Sequence[CloudInstance], policy: BurstPolicy, state: PlannerState, now: float
) -> list[Terminate]:
    found: list[Terminate] = []
    for instance in sorted(fleet, key=lambda i: i.id):
        if instance.runs_non_preemptible:
            continue
        if instance.state is InstanceState.REQUESTED:
            booting = now - instance.launched_at
            if booting >= policy.boot_timeout_s:
                message = f"its spoke has not joined {booting:.0f}s after launch"
                found.append(
                    Terminate(instance.id, instance.team, TerminateReason.BOOT_TIMEOUT, message)
                )
            continue
        if instance.state is not InstanceState.RUNNING or instance.idle_since is None:
            continue
        idle = now - instance.idle_since
        last_launch = max(instance.launched_at, state.last_launch_at.get(instance.team, -math.inf))
        if idle >= policy.idle_ttl_s and now - last_launch >= policy.cooldown_s:
            message = f"idle for {idle:.0f}s (idle_ttl {policy.idle_ttl_s:.0f}s)"
            found.append(Terminate(instance.id, instance.team, TerminateReason.IDLE, message))
    return found


@dataclass(frozen=True, slots=True, order=True)
class _GroupKey:
    """Demand that may share instances: one team, one GPU model (or any), same regions."""

    team: str
    gpu_model: str  # casefolded; "" means any
    regions: tuple[str, ...]
    spot_ok: bool


class _LaunchPlanner:
    """One round of launch decisions; accumulates launches and skips (never touches inputs)."""

    def __init__(
        self,
        demand: DemandReport,
        fleet: Sequence[CloudInstance],
        catalog: OfferCatalog,
        policy: BurstPolicy,
        state: PlannerState,
        now: float,
        id_prefix: str,
    ) -> None:
        self.demand = demand
        self.fleet = fleet
        self.catalog = catalog
        self.offers = catalog.offers()
        self.policy = policy
        self.state = state
        self.now = now
        self.id_prefix = id_prefix
        self.budget = initial_budget(fleet, policy)
        self.launches: list[Launch] = []
        self.skipped: list[Skip] = []

    def run(self) -> None:
        report_age = max(0.0, self.now - self.demand.sent_at)
        items = sorted(
            enumerate(self.demand.items), key=lambda pair: (-pair[1].oldest_age_s, pair[0])
        )
        if report_age > self.policy.demand_stale_s:
            for _, item in items:
                message = f"demand report is {report_age:.0f}s old"
                self._skip(item, SkipReason.STALE_DEMAND, message, item.count, item.workload_ids)
            return
        covered = {
            workload_id
            for instance in self.fleet
            if instance.state in (InstanceState.REQUESTED, InstanceState.RUNNING)
            for workload_id in instance.workload_ids
        }
        groups: dict[_GroupKey, list[tuple[DemandItem, list[str | None]]]] = {}
        for _, item in items:
            todo = self._admit(item, item.oldest_age_s + report_age, covered)
            if todo:
                groups.setdefault(_group_key(item), []).append((item, todo))
        # Oldest demand first: groups keep the order of their oldest item.
        for key, entries in groups.items():
            self._plan_group(key, entries)

    def _admit(self, item: DemandItem, age: float, covered: set[str]) -> list[str | None] | None:
        """The workloads of `item` to launch for (None: an id the hub did not list)."""
        policy = self.policy
        if policy.allowed_teams is not None and item.team not in policy.allowed_teams:
            message = f"team {item.team} may not burst to the cloud"
            self._skip(item, SkipReason.TEAM_NOT_ALLOWED, message, item.count, item.workload_ids)
            return None
        if item.attained_s > 0 and not policy.burst_restarted:
            message = f"ran {item.attained_s:.0f}s before; burst_restarted is off"
            self._skip(item, SkipReason.RESTARTED, message, item.count, item.workload_ids)
            return None
        budget_s = policy.waiting_budget_s(item)
        if age < budget_s:
            message = f"oldest pending {age:.0f}s < waiting budget {budget_s:.0f}s"
            self._skip(item, SkipReason.TOO_YOUNG, message, item.count, item.workload_ids)
            return None
        done = tuple(w for w in item.workload_ids if w in covered)
        if done:
            message = "instances already launched for these workloads"
            self._skip(item, SkipReason.COVERED, message, len(done), done)
        todo: list[str | None] = [w for w in item.workload_ids if w not in covered]
        todo.extend([None] * (item.count - len(item.workload_ids)))
        if not todo:
            return None
        ids = tuple(w for w in todo if w is not None)
        budget = policy.team_budgets.get(item.team)
        spent = self.state.team_spend.get(item.team, 0.0)
        if budget and budget.dollars_total is not None and spent >= budget.dollars_total:
            message = (
                f"team {item.team} has spent its monthly burst budget (the policy's "
                "burst_budget.dollars_per_month)"
                if budget.monthly
                else f"team {item.team} spent ${spent:.2f} of ${budget.dollars_total:.2f}"
            )
            self._skip(item, SkipReason.TEAM_BUDGET_SPENT, message, len(todo), ids)
            return None
        reason = self._cooldown(item)
        if reason:
            self._skip(item, SkipReason.COOLDOWN, reason, len(todo), ids)
            return None
        return todo

    def _cooldown(self, item: DemandItem) -> str | None:
        cooldown = self.policy.cooldown_s
        released = self.state.last_terminate_at.get(item.team)
        if released is not None and self.now - released < cooldown:
            ago = self.now - released
            return f"team released an instance {ago:.0f}s ago (cooldown {cooldown:.0f}s)"
        for instance in sorted(self.fleet, key=lambda i: i.id):
            if (
                instance.state is InstanceState.REQUESTED
                and instance.team == item.team
                and self.now - instance.launched_at < cooldown
                and self._serves(instance, item)
            ):
                age = self.now - instance.launched_at
                return f"instance {instance.id} launched {age:.0f}s ago is still booting"
        return None

    def _serves(self, instance: CloudInstance, item: DemandItem) -> bool:
        if item.regions and instance.region not in item.regions:
            return False
        spec = self.catalog.get(instance.instance_type)
        if item.gpu_model is None or spec is None:
            return True
        return spec.gpu_model.casefold() == item.gpu_model.casefold()

    def _plan_group(
        self, key: _GroupKey, entries: list[tuple[DemandItem, list[str | None]]]
    ) -> None:
        owner: dict[int, int] = {}  # work order -> index of its entry
        pending: list[Work] = []
        for index, (item, todo) in enumerate(entries):
            for workload_id in todo:
                owner[len(pending)] = index
                pending.append(
                    Work(
                        len(pending), workload_id, item.gpus_per_node, item.nodes, item.gpu_fraction
                    )
                )
        fitting = [offer for offer in self.offers if self._fits_group(offer, key)]
        open_offers = [o for o in fitting if self.state.blocked.get(o.key, -math.inf) <= self.now]
        if self.policy.right_size:
            # Each whole-GPU single-node workload on its own cheapest instance where one of
            # exactly its size is offered; where the smallest is bigger (H100 comes in 8s),
            # such work still packs, or the rest of every instance would be billed idle.
            # Fractions share GPUs and gangs of one shape share nodes.
            sizes = {offer.gpu_count for offer in open_offers}
            whole = [w for w in pending if w.nodes == 1 and w.fraction is None]
            batches = [[w] for w in whole if w.gpus_per_node in sizes]
            batches.append([w for w in whole if w.gpus_per_node not in sizes])
            batches.append([w for w in pending if w.fraction is not None])
            batches.append([w for w in pending if w.nodes > 1])
            # Oldest first, so the limits still go to the oldest work.
            batches = sorted((b for b in batches if b), key=lambda b: b[0].order)
        else:
            batches = [pending]
        unserved: list[Work] = []
        for batch in batches:
            unserved.extend(self._serve(key.team, batch, open_offers))
        pending = sorted(unserved, key=lambda w: w.order)
        self._skip_unserved(key.team, pending, entries, owner, fitting, open_offers)

    def _serve(self, team: str, pending: list[Work], offers: list[Offer]) -> list[Work]:
        """Launch for `pending` round by round; returns the works left unserved."""
        while pending:
            choice = self._best(team, pending, offers)
            if choice is None:
                break
            offer, units = choice
            for unit in units:
                self._launch(team, offer, unit)
            served = {work.order for unit in units for work in unit.works}
            pending = [work for work in pending if work.order not in served]
        return pending

    def _fits_group(self, offer: Offer, key: _GroupKey) -> bool:
        if key.gpu_model and offer.gpu_model.casefold() != key.gpu_model:
            return False
        if key.regions and offer.region not in key.regions:
            return False
        if self.policy.regions is not None and offer.region not in self.policy.regions:
            return False
        spot_allowed = key.spot_ok and self.policy.markets is MarketPreference.SPOT_FIRST
        return offer.market is Market.ON_DEMAND or spot_allowed

    def _best(
        self, team: str, pending: list[Work], offers: list[Offer]
    ) -> tuple[Offer, list[Unit]] | None:
        """The offer serving the most workloads within limits, then the cheapest in total.

        Spot only wins on price (or a tie): a preemptible instance that costs more than an
        on-demand one is never worth it.
        """
        best: tuple[tuple[object, ...], Offer, list[Unit]] | None = None
        for offer in offers:
            units, _ = pack(pending, offer.gpu_count)
            scratch = self.budget.copy()
            accepted: list[Unit] = []
            for unit in units:
                if scratch.refusal(team, unit.instances, offer.price_per_hour) is None:
                    scratch.take(team, unit.instances, offer.price_per_hour)
                    accepted.append(unit)
            served = sum(len(unit.works) for unit in accepted)
            if served == 0:
                continue
            total = sum(unit.instances for unit in accepted) * offer.price_per_hour
            market_rank = 0 if offer.market is Market.SPOT else 1
            rank = (-served, round(total, 6), market_rank, offer.price_per_hour, offer.key)
            if best is None or rank < best[0]:
                best = (rank, offer, accepted)
        return None if best is None else (best[1], best[2])

    def _launch(self, team: str, offer: Offer, unit: Unit) -> None:
        ids = tuple(work.workload_id for work in unit.works if work.workload_id is not None)
        self.budget.take(team, unit.instances, offer.price_per_hour)
        for node in range(unit.instances):
            self.launches.append(
                Launch(
                    request_id=self._request_id(team, offer, node, ids),
                    instance_type=offer.instance_type,
                    region=offer.region,
                    market=offer.market,
                    team=team,
                    price_per_hour=offer.price_per_hour,
                    gpu_model=offer.gpu_model,
                    gpu_count=offer.gpu_count,
                    workload_ids=ids,
                )
            )

    def _request_id(self, team: str, offer: Offer, node: int, ids: tuple[str, ...]) -> str:
        # The digest makes ids of different content differ even when seq and index repeat
        # (the same report planned again after some launches went out).
        content = "\x1f".join(
            (offer.instance_type, offer.region, offer.market, team, str(node), *ids)
        )
        digest = hashlib.sha256(content.encode()).hexdigest()[:8]
        return f"{self.id_prefix}-{self.demand.seq}-{len(self.launches)}-{digest}"

    def _skip_unserved(
        self,
        team: str,
        pending: list[Work],
        entries: list[tuple[DemandItem, list[str | None]]],
        owner: Mapping[int, int],
        fitting: list[Offer],
        open_offers: list[Offer],
    ) -> None:
        by_item: dict[tuple[int, SkipReason, str], list[Work]] = {}
        for work in pending:
            model = entries[owner[work.order]][0].gpu_model or ""
            reason, message = self._why_unserved(team, work, model, fitting, open_offers)
            by_item.setdefault((owner[work.order], reason, message), []).append(work)
        for (index, reason, message), works in by_item.items():
            ids = tuple(w.workload_id for w in works if w.workload_id is not None)
            self._skip(entries[index][0], reason, message, len(works), ids)

    def _why_unserved(
        self, team: str, work: Work, model: str, fitting: list[Offer], open_offers: list[Offer]
    ) -> tuple[SkipReason, str]:
        def fits(offer: Offer) -> bool:
            return work.fraction is not None or work.gpus_per_node <= offer.gpu_count

        if not any(fits(offer) for offer in fitting):
            shape = f"{work.nodes}x{work.gpus_per_node} {model} GPUs".replace("  ", " ")
            return SkipReason.NO_OFFER, f"no catalog offer fits {shape} in an allowed region"
        candidates = sorted(
            (o for o in open_offers if fits(o)), key=lambda o: (o.price_per_hour, o.key)
        )
        if not candidates:
            return SkipReason.CAPACITY_BACKOFF, "every fitting offer is blocked by capacity errors"
        offer = candidates[0]
        reason = self.budget.refusal(team, work.nodes, offer.price_per_hour)
        limits = {
            SkipReason.MAX_INSTANCES: f"max_instances {self.policy.max_instances} reached",
            SkipReason.GLOBAL_BUDGET: f"over max ${self.policy.max_dollars_per_hour}/h",
            SkipReason.TEAM_BUDGET: f"over team {team}'s $/h budget",
        }
        if reason is None:  # cannot happen: such work would have been served
            return SkipReason.MAX_INSTANCES, "no room left this round"
        return (
            reason,
            f"{limits[reason]}; cheapest fit {offer.instance_type} ${offer.price_per_hour}/h",
        )

    def _skip(
        self,
        item: DemandItem,
        reason: SkipReason,
        message: str,
        count: int,
        workload_ids: tuple[str, ...],
    ) -> None:
        self.skipped.append(Skip(item, reason, message, count, workload_ids))


def _group_key(item: DemandItem) -> _GroupKey:
    model = item.gpu_model.casefold() if item.gpu_model else ""
    return _GroupKey(item.team, model, tuple(sorted(item.regions)), item.spot_ok)
