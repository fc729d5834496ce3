"""One placement cycle: admit, order, fit, preempt and explain.

`plan()` is the hub's whole scheduling decision. It goes through the pending workloads in queue
order (`fairshare`), checks each against its team's quota (`quotas`), gives it the best-ranked
free devices (`fit`), and when none are free, looks for running work it may wait for or evict
(`preemption`). Whatever stays pending gets a reason code and a sentence (`explain`).

Placements made earlier in the plan take their devices off the working copy of the fleet
(`capacity`) and count toward their team's usage, so nothing is booked twice within a plan.
What the plan leaves free may then take work back from cloud spokes (`consolidate`, off by
default).

A deep queue costs little: a workload whose team, class and shape class (signature and shape)
already failed in this plan, with nothing booked or freed for anyone since (`gen`), gets the
same reason without a search. Capacity, quota room and victims only change when something is
booked (a placement or a preemption) or when the plan passes a workload that stopping work
was preempted for, so the answer would be the same. With the queue kept between plans
(`Kept`), each entry keeps that class and its last explanation (`fairshare.Memo`): such a
workload costs one read of its entry, and the plan lists apart the explanations that are not
the very objects the last plan gave (`Plan.explained`), all a caller that applied it must write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from hub.core import explain
from hub.core.capacity import EPS, Capacity
from hub.core.consolidate import consolidate
from hub.core.fairshare import Entry, Memo, queue_order, with_classes
from hub.core.fit import (
    Fit,
    Sig,
    SigKey,
    build_sig,
    capability_needs,
    find,
    fresh_sig,
    model_rank,
    sig_key,
    take,
)
from hub.core.kept import Kept, SpecInfo
from hub.core.model import (
    Placement,
    Plan,
    Preemption,
    RunningWorkload,
    Snapshot,
    SpecLike,
    Unplaced,
    Workload,
)
from hub.core.ordering import las_victims, pending_level, rescue_level
from hub.core.policy import Policy, PriorityClass, Team
from hub.core.preemption import Rescue, claim, rescue
from hub.core.quotas import Block, Ledger
from hub.core.reserve import hold, oldest_starts
from hub.core.victims import Tally, Victims, tally


def plan(
    snapshot: Snapshot,
    pending: Sequence[Workload],
    running: Sequence[RunningWorkload],
    policy: Policy,
    now: float,
) -> Plan:
    """Place what fits, preempt where the rules allow, explain the rest.

    Pure: reads only its arguments and never mutates them; the same arguments give the same
    plan. This is the reference: `hub.core.planstate.PlanState` gives the same plan from state
    it keeps between cycles.
    """
    capacity = Capacity(snapshot)
    work = tally(running, capacity.model_of)
    return plan_on(capacity, work, pending, running, policy, now)


def plan_on(
    capacity: Capacity,
    work: Tally,
    pending: Sequence[Workload],
    running: Sequence[RunningWorkload],
    policy: Policy,
    now: float,
    kept: Kept | None = None,
    told: Mapping[str, Workload | None] | None = None,
) -> Plan:
    """`plan()` on a fleet and a tally of `running` built already (and changed by the plan).

    `kept`: what depends only on the fleet's make-up (not its free devices), carried from
    earlier plans on the same `capacity`, with the pending queue in order. `told`: what
    changed in `pending` since the last plan with `kept` (`KeptQueue.sync`).
    """
    return _Planner(capacity, work, running, policy, now, kept).run(pending, told)


class _Planner:
    """The working state of one plan() call."""

    def __init__(
        self,
        capacity: Capacity,
        work: Tally,
        running: Sequence[RunningWorkload],
        policy: Policy,
        now: float,
        kept: Kept | None,
    ) -> None:
        self.policy = policy
        self.now = now
        self.running = running
        self.capacity = capacity
        self.models = self.capacity.model_of
        self.ledger = Ledger(policy, self.capacity.total_by_model)
        self.tally = work
        self.kept = kept
        self.ledger.load(work.sums, work.ordered())
        self.sigs: dict[object, Sig] = {}
        self.specs: dict[int, SpecInfo] = {} if kept is None else kept.specs
        self.kinds: dict[tuple[object, ...], int] = {} if kept is None else kept.kinds
        self.never: dict[tuple[object, ...], explain.Why | None] = (
            {} if kept is None else kept.never
        )
        # (team, signature, model, level) -> (class value, shape) that found no room by
        # preemption; a plan has one Sig per signature key, so the Sig itself stands for it
        self.no_rescue: dict[tuple[str, Sig, str, int], list[tuple[int, _Shape]]] = {}
        self._victims: Victims | None = None
        self.undecided: set[str] = set()
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.unplaced: list[Unplaced] = []
        self.fresh: list[Unplaced] = []  # of those, the ones not handed out by the last plan
        self.holds = 0  # wide gangs holding nodes in this plan (hub.core.reserve)
        self.oldest: dict[tuple[str, str], float] | None = None
        # Equivalence classes that failed since the last booking: key -> (reason, message).
        self.gen = 0
        self.failed: dict[tuple[object, ...], tuple[int, Unplaced]] = {}
        self.earmarked = {
            r.preempted_for
            for stopping in self.tally.stopping.values()
            for r in stopping
            if r.preempted_for is not None
        }

    def run(
        self, pending: Sequence[Workload], told: Mapping[str, Workload | None] | None = None
    ) -> Plan:
        # policy.priority_class, as a dict (the first of a name, as it answers)
        classes = {c.name: c for c in reversed(self.policy.classes)}
        earmarked = self.earmarked
        queue = self.kept.queue if self.kept is not None else None
        if queue is not None and (
            self.policy.ordering.mode == "las" or not queue.sync(pending, classes, told)
        ):
            queue.clear()  # levels change with time, or an id repeats: ordered afresh
            queue = None
        order: Iterator[Entry]
        if queue is not None:
            unknown = queue.unknown()
            if earmarked:  # only these are ever asked about (`Victims.may_wait_on`)
                self.undecided.update(wid for wid in earmarked if queue.has(wid))
            order = queue.order(self.policy, self.now, self.ledger.share)
        else:
            entries, unknown = with_classes(pending, classes)
            if earmarked:
                self.undecided.update(w.id for w, _ in entries if w.id in earmarked)
            order = queue_order(entries, self.policy, self.now, self.ledger.share)
        for workload in unknown:  # first, oldest first
            why = explain.unknown_class(workload.need.priority_class)
            self.unplaced.append(Unplaced(workload.id, *why))
        failed = self.failed
        unplaced = self.unplaced
        fresh = self.fresh = unplaced[:]  # the explanations not handed out again as they were
        for entry in order:
            # A workload planned before comes with its class in its entry's memo: nothing else
            # of it is read unless something was booked since its class last failed.
            memo = entry[5]
            key = memo.key
            if key is None or (earmarked and entry[1] in earmarked):
                _, wid, _, workload, cls, _ = entry
                if workload.claims_freed or (earmarked and wid in earmarked):
                    self.undecided.discard(wid)
                    self.gen += 1  # stopping work preempted for it becomes others' room after it
                    count = len(unplaced)
                    self._decide(workload, cls)
                    fresh += unplaced[count:]
                    continue
                key = self._key(workload, cls, memo)
            seen = failed.get(key)
            if seen is not None and seen[0] == self.gen:
                same = seen[1]
                prev = memo.unplaced  # an equal object from the last plan costs less
                if (
                    prev is None
                    or prev.reason is not same.reason
                    or prev.message != same.message
                    or prev.waiting_for
                ):
                    prev = memo.unplaced = Unplaced(entry[1], same.reason, same.message)
                    fresh.append(prev)
                unplaced.append(prev)
                continue
            gen, count = self.gen, len(unplaced)
            self._decide(entry[3], entry[4])
            if len(unplaced) > count:
                last, prev = unplaced[-1], memo.unplaced
                if (  # the first of its class says what it said last time
                    prev is not None
                    and prev.reason is last.reason
                    and prev.message == last.message
                    and prev.waiting_for == last.waiting_for
                ):
                    unplaced[-1] = last = prev
                else:
                    memo.unplaced = last
                    fresh.append(last)
                if self.gen == gen and not last.waiting_for:
                    failed[key] = (gen, last)
            else:  # placed: an explanation it had is not the last plan's
                memo.unplaced = None
        if self.kept is not None and len(self.specs) > 2 * len(pending) + 1024:
            queued = {id(w.need) for w in pending}  # forget the specs no longer queued
            self.kept.specs = {k: v for k, v in self.specs.items() if k in queued}
        taken = frozenset(p.workload_id for p in self.preemptions)
        moves = consolidate(self.capacity, self.running, self.policy, self.now, self._onprem, taken)
        self.preemptions.extend(moves)
        return Plan(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            unplaced=tuple(self.unplaced),
            explained=tuple(fresh) if self.kept is not None else None,
        )

    def _key(self, workload: Workload, cls: PriorityClass, memo: Memo) -> tuple[object, ...]:
        """The workload's equivalence class in this plan: workloads of one class get the same
        answer while nothing is booked. Kept in `memo` unless it changes with time."""
        spec = workload.need
        info = self.specs.get(id(spec))
        if info is None or info.spec is not spec:
            info = self._spec(spec)
        key: tuple[object, ...]
        if workload.attained_gpu_s:  # another level may take other victims (ordering)
            key = (cls.value, info.kind, pending_level(workload, self.policy.ordering, self.now))
        else:
            key = (cls.value, info.kind)
        if workload.avoid_spokes:  # fewer spokes than alike work: maybe none at all
            key = (*key, workload.avoid_spokes)
        if not workload.attained_gpu_s:
            memo.key = key
        return key

    def _decide(self, workload: Workload, cls: PriorityClass) -> None:
        """Place, preempt for or explain one workload."""
        spec = workload.need
        info = self.specs.get(id(spec))
        if info is None or info.spec is not spec:
            info = self._spec(spec)
        team = self.policy.team(spec.team)
        reserved_key = spec.team if self.capacity.has_reserved else ""
        avoid = workload.avoid_spokes
        needs = capability_needs(spec, avoid, self.capacity)
        key = sig_key(spec, team.may_burst, reserved_key, needs, info.akey)
        sig = self.sigs.get(key)
        if sig is None:
            sig = self.sigs[key] = self._sig(key, spec, team.may_burst, avoid)
        amount = spec.total_gpus
        best: Fit | None = None
        best_model = ""
        blocked: list[tuple[str, int, Block]] = []
        for model in sig.by_model:
            rank = model_rank(spec, model)
            block = self.ledger.admit(spec.team, cls, model, amount)
            if block is not None:
                blocked.append((model, rank, block))
                continue
            fit = find(sig, spec, model, rank)
            if fit is not None and (best is None or fit.rank < best.rank):
                best, best_model = fit, model
        if best is not None:
            assignments = take(best)
            self.ledger.add(spec.team, best_model, amount, cls.value)
            self.gen += 1
            self.placements.append(Placement(workload.id, best.spoke_id, assignments))
            return
        why = self._never_fits(spec, sig, team, avoid)
        if why is not None:
            self.unplaced.append(Unplaced(workload.id, *why))
            return
        quota_fits = {m: find(sig, spec, m, rank) for m, rank, _ in blocked}
        found = self._rescue(workload, cls, sig, quota_fits)
        if found is not None:
            self._apply(workload, cls, found)
            return
        for model, _, block in blocked:
            if quota_fits[model] is not None:
                self.unplaced.append(Unplaced(workload.id, block.reason, block.message))
                return
        if blocked and len(blocked) == len(sig.by_model):
            block = blocked[0][2]
            self.unplaced.append(Unplaced(workload.id, block.reason, block.message))
            return
        if info.no_room is None:
            info.no_room = explain.no_room(spec)
        reason, message = info.no_room
        if self._may_hold(workload):
            if self.oldest is None:
                self.oldest = oldest_starts(self.running)
            spoke = hold(sig, spec, self.oldest, self.now)
            if spoke is not None:
                self.holds += 1
                self.gen += 1  # not the same answer for the next gang of this class
                message += f"; holding {spec.nodes} nodes of spoke {spoke} for it"
        self.unplaced.append(Unplaced(workload.id, reason, message))

    def _spec(self, spec: SpecLike) -> SpecInfo:
        """What is worked out from `spec` (a view's `need`) alone, once while it is queued."""
        found = self.specs.get(id(spec))
        if found is None or found.spec is not spec:  # new, or the id of a spec gone since
            found = self.specs[id(spec)] = SpecInfo(spec)
            found.kind = self._kind(spec, found)
        return found

    def _kind(self, spec: SpecLike, info: SpecInfo) -> int:
        """A number for the spec's team, shape and signature (the same for equal ones)."""
        shape = (spec.nodes, spec.gpus_per_node, spec.gpu_fraction)
        key = (spec.team, shape, sig_key(spec, False, "", (), info.akey))
        kind = self.kinds.get(key)
        if kind is None:
            kind = self.kinds[key] = len(self.kinds)
        return kind

    def _onprem(self, spec: SpecLike) -> Sig:
        """`spec`'s pools without cloud spokes (where consolidated work goes)."""
        reserved_key = spec.team if self.capacity.has_reserved else ""
        needs = capability_needs(spec, frozenset(), self.capacity)
        key = sig_key(spec, False, reserved_key, needs)
        sig = self.sigs.get(key)
        if sig is None:
            sig = self.sigs[key] = self._sig(key, spec, False, frozenset())
        return sig

    def _sig(self, key: SigKey, spec: SpecLike, may_burst: bool, avoid: frozenset[str]) -> Sig:
        """A signature with fresh failure caches (free devices change between plans)."""
        kept = self.kept
        static = kept.sigs.get(key) if kept is not None else None
        if static is None:
            static = build_sig(key, spec, self.capacity, may_burst, spec.team, avoid)
            if kept is not None:
                kept.sigs[key] = static
                static = fresh_sig(static)
            return static
        return fresh_sig(static)

    def _may_hold(self, workload: Workload) -> bool:
        """A wide gang that waited long enough, while this plan may still hold nodes."""
        rule, spec = self.policy.reservation, workload.need
        return (
            0 < rule.min_gpus <= spec.total_gpus
            and spec.gpu_fraction is None
            and self.holds < rule.max_gangs
            and self.now - workload.submitted_at >= rule.after_s
        )

    def _never_fits(
        self, spec: SpecLike, sig: Sig, team: Team, avoid: frozenset[str]
    ) -> explain.Why | None:
        """Why `spec` can never fit, remembered per signature and shape (and team)."""
        shape = (spec.nodes, spec.gpus_per_node, spec.gpu_fraction is None)
        key = (sig.key, shape) if sig.eligible else (sig.key, shape, spec.team)
        if key not in self.never:
            eligible = [p for pools in sig.by_model.values() for p in pools]
            self.never[key] = explain.never_fits(spec, team, self.capacity, eligible, avoid)
        return self.never[key]

    def _rescue(
        self,
        workload: Workload,
        cls: PriorityClass,
        sig: Sig,
        quota_fits: dict[str, Fit | None],
    ) -> Rescue | None:
        """The cheapest way over all acceptable models to make room by preemption."""
        if not self.running:
            return None
        spec = workload.need
        victims = self._victims_index()
        best: Rescue | None = None
        shape = (spec.nodes, spec.gpus_per_node, spec.gpu_fraction)
        ordering = self.policy.ordering
        level = rescue_level(workload, ordering, self.now)
        # las_victims() has none to give under fifo or at the top level
        las_on = ordering.mode == "las" and level + 1 <= len(ordering.thresholds_gpu_s)
        earmarked = workload.id in victims.earmarked  # work stopping for it: look again
        for model in sig.by_model:
            failed = self.no_rescue.setdefault((spec.team, sig, model, level), [])
            if failed and not earmarked and any(_dominates(f, cls.value, shape) for f in failed):
                continue
            if not sig.by_model[model]:
                # No eligible pool: no room anywhere (rescue() would read every candidate
                # victim to find that out).
                failed.append((cls.value, shape))
                continue
            rank = model_rank(spec, model)
            las = (
                list(las_victims(victims, model, spec.team, level, cls.value, ordering, self.now))
                if las_on
                else []
            )
            found = rescue(
                workload,
                cls,
                sig,
                model,
                rank,
                quota_fits.get(model),
                victims,
                self.ledger,
                self.now,
                las,
            )
            if found is None:
                failed.append((cls.value, shape))
            elif best is None or found.cost < best.cost:
                best = found
        return best

    def _apply(self, workload: Workload, cls: PriorityClass, found: Rescue) -> None:
        spec = workload.need
        claim(found, self._victims_index())
        room = self.ledger.room(spec.team, found.model, cls.value)
        reclaims = spec.total_gpus <= room + EPS  # else other teams' work is taken for LAS
        self.ledger.add(spec.team, found.model, spec.total_gpus, cls.value)
        self.gen += 1
        for h in found.victims:
            if h.team == spec.team:
                text = (
                    f"preempted for higher-priority {cls.name} workload {workload.id} "
                    f"of team {spec.team}"
                )
            elif not reclaims:
                text = (
                    f"borrowed {found.model} GPUs passed to workload {workload.id} of team "
                    f"{spec.team}, which has run less (least attained service)"
                )
            else:
                text = (
                    f"reclaimed for team {spec.team}'s guaranteed {found.model} "
                    f"(workload {workload.id})"
                )
                if self.policy.window is not None:
                    text += f" under policy window {self.policy.window}"
            self.preemptions.append(Preemption(h.id, h.spoke_id, text, for_workload=workload.id))
        waiting_for = tuple(h.id for h in (*found.waits, *found.victims))
        reason, message = explain.waiting(len(waiting_for))
        self.unplaced.append(Unplaced(workload.id, reason, message, waiting_for))

    def _victims_index(self) -> Victims:
        if self._victims is None:
            order = self.kept.order if self.kept is not None else None
            self._victims = Victims(self.tally, self.capacity, self.ledger, self.policy, order)
            self._victims.undecided = self.undecided
        return self._victims


_Shape = tuple[int, int, float | None]  # nodes, GPUs per node, fraction


def _dominates(failed: tuple[int, _Shape], value: int, shape: _Shape) -> bool:
    """A failed search for room implies this one fails too.

    Free devices, unchosen victims and guarantee room only shrink within a plan; a lower
    priority may evict less, and a bigger shape needs more.
    """
    failed_value, (nodes, gpus, fraction) = failed
    if value > failed_value:
        return False
    if fraction is not None or shape[2] is not None:
        return fraction is not None and shape[2] is not None and shape[2] >= fraction
    return shape[0] >= nodes and shape[1] >= gpus
