"""Making room for a pending workload: wait for stopping work, or choose victims.

Three rules choose victims, and a class that is never preempted (production) is never one:

- **reclaim**: a workload that fits entirely within its team's unfilled guarantee (counting
  only work of its priority or higher, see `quotas`) may evict other teams' *borrowed* work;
- **priority**: a workload may evict lower-priority work of its own team (class values; aging
  does not count). This also frees the team's quota when it is at its limit;
- **least attained service** (ordering `las` only, `hub.core.ordering`): a workload may evict
  other teams' borrowed work that has run longer (a higher level), never below their guarantee.

Devices of work already being preempted count as about to be free: a pending workload first
waits on those (the ones preempted for it first, see `RunningWorkload.preempted_for`) before
choosing anyone new, and devices it waits on are not counted again for anyone else in the same
plan. Free devices it will need are held for it for the rest of the plan.

Candidates are considered lowest priority first, then newest first; the first way to make
room is pruned to the victims it really needs, and a bounded look further (same priority
only) may find one with fewer victims or less run time lost. Ways compare by highest victim
priority, then number of victims, then run time lost, then placement rank. The workload
itself stays pending until the devices are free.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from heapq import merge
from itertools import chain

from hub.core.capacity import EPS, Pool
from hub.core.fit import Fit, Sig, free_counts
from hub.core.holdings import VICTIM_ORDER, Holding
from hub.core.model import SpecLike, Workload
from hub.core.policy import PriorityClass
from hub.core.quotas import Ledger
from hub.core.victims import Victims

Node = tuple[Pool, int]
Hold = tuple[Pool, int, int]  # keep `count` free devices of node `index` in `pool`

#: Candidates looked at past the first way to make room, for one with fewer victims.
_LOOKAHEAD = 256


@dataclass(frozen=True, slots=True)
class Rescue:
    """How a pending workload gets room: whom to wait for, whom to evict, what to hold."""

    model: str
    cost: tuple[object, ...]  # lower is better: see the module docstring
    waits: tuple[Holding, ...]  # already stopping
    victims: tuple[Holding, ...]  # to preempt now
    hold: tuple[Hold, ...]


def rescue(
    workload: Workload,
    cls: PriorityClass,
    sig: Sig,
    model: str,
    rank: int,
    capacity_fit: Fit | None,
    victims: Victims,
    ledger: Ledger,
    now: float,
    las: Iterable[Holding] = (),
) -> Rescue | None:
    """A way to make room for `workload` on `model` GPUs, or None when there is none.

    `capacity_fit` is where it would fit if quota allowed (then only quota needs room). `las`:
    more candidates in victim order, other teams' borrowed work `hub.core.ordering` lets it
    take (empty under ordering `fifo`).
    """
    spec = workload.need
    team = spec.team
    amount = spec.total_gpus
    limited = ledger.limited
    if limited and not cls.may_borrow and ledger.exceeds_room(team, model, cls.value, amount):
        return None  # only its own class or higher fill that guarantee: nobody to evict
    reclaim = (
        limited
        and capacity_fit is None
        and victims.may_have_borrowed(model, team)
        and amount > EPS
        and not ledger.exceeds_room(team, model, cls.value, amount)
    )
    stopping = victims.stopping(model)
    if stopping:
        stopping = [h for h in stopping if victims.may_wait_on(h, workload.id)]
    las = () if capacity_fit is not None else las
    if not stopping and not reclaim and not las and not ledger.has_below(team, model, cls.value):
        return None
    stopping.sort(key=lambda h: (h.workload.preempted_for != workload.id, h.id))
    own_stopping = [h for h in stopping if h.team == team]
    limit_gap = max(0.0, amount - ledger.limit_room(team, model))
    can_free = victims.own_amount(team, model, cls.value) + sum(h.amount for h in own_stopping)
    if limit_gap > can_free + EPS:
        return None
    if capacity_fit is not None:
        waits: list[Holding] = []
        evict: list[Holding] = []
        hold: list[Hold] = []
        if capacity_fit.fraction is None:
            hold = [(pool, i, capacity_fit.gpus) for pool, i in capacity_fit.parts]
        static: tuple[object, ...] = capacity_fit.rank
    else:
        las = list(las)  # read twice
        spokes = {pool.spoke_id for pool in sig.by_model.get(model, ())}
        if not (
            any(h.spoke_id in spokes for h in chain(stopping, las))
            or victims.may_list_on(spokes, team, model, cls.value, reclaim)
        ):
            return None  # `_scan` would pass over every candidate: none is on its spokes
        own = victims.own(team, model, cls.value)
        if reclaim:
            own = merge(own, victims.borrowed(model, team), key=VICTIM_ORDER)
        if las:
            own = _unique(merge(own, las, key=_value))  # reclaim may list them too
        found = _scan(spec, sig, model, rank, chain(stopping, own), now)
        if found is None:
            return None
        waits, evict, hold, static = found
    own = victims.own(team, model, cls.value)
    if not _top_up(waits, evict, own_stopping, own, limit_gap, team):
        return None
    if not waits and not evict:
        return None
    cost = (*_cost([*waits, *evict], now), *static)
    return Rescue(model, cost, tuple(waits), tuple(evict), tuple(hold))


def claim(found: Rescue, victims: Victims) -> None:
    """Record a rescue: its victims and waits are not counted again, its devices are held."""
    victims.chosen.update(h.id for h in found.victims)
    victims.claimed.update(h.id for h in found.waits)
    for pool, i, count in found.hold:
        if count:
            pool.take_whole(i, count)


def _value(h: Holding) -> int:
    return h.value


def _unique(candidates: Iterable[Holding]) -> Iterator[Holding]:
    seen: set[str] = set()
    for h in candidates:
        if h.id not in seen:
            seen.add(h.id)
            yield h


_Room = tuple[list[Holding], list[Holding], list[Hold], tuple[object, ...]]


class _NodeState:
    """Candidates added to one node so far, and whether the workload fits there now."""

    __slots__ = ("added", "devices", "mixed", "solved")

    def __init__(self, pool: Pool, i: int) -> None:
        self.added: list[Holding] = []
        self.devices = len(pool.free[i])  # wholly free once `added` stop
        self.mixed = False  # fractional work added: count device by device
        self.solved: list[Holding] | None = None


def _scan(
    spec: SpecLike,
    sig: Sig,
    model: str,
    rank: int,
    candidates: Iterable[Holding],
    now: float,
) -> _Room | None:
    """Go through candidates cheapest first, adding each to its nodes, until the shape fits.

    After the first fit it looks a little further (`_LOOKAHEAD` candidates, never past that
    priority level: later ones only cost more) for a way with fewer victims.
    """
    eligible = sig.pool_ids.get(model, set())
    spokes_ok = {pool.spoke_id for pool in sig.by_model.get(model, ())}
    g = spec.gpus_per_node
    fraction = spec.gpu_fraction
    states: dict[Node, _NodeState] = {}
    spokes: dict[str, list[tuple[tuple[object, ...], int, int, Node]]] = {}  # gangs
    best: tuple[tuple[object, ...], list[Holding], list[Node]] | None = None
    best_top = 0  # highest victim priority of `best` (-1: waiting only)
    best_victims = 0
    lookahead = _LOOKAHEAD
    for h in candidates:
        level = -1 if h.preempting else h.value
        if best is not None:
            lookahead -= 1
            if level > best_top or lookahead < 0:
                break
        if h.spoke_id not in spokes_ok:
            continue
        for pool, i, a in h.where:
            if pool.index not in eligible:
                continue
            node = (pool, i)
            state = states.get(node)
            if state is None:
                state = states[node] = _NodeState(pool, i)
            if state.solved is not None:
                continue
            state.added.append(h)
            if a.fraction is None:
                state.devices += len(a.devices)
            else:
                state.mixed = True
            state.solved = _solve(node, state, g, fraction)
            if state.solved is None:
                continue
            if spec.nodes == 1:
                price = _cost(state.solved, now)
                cost = (*price, *_static(node, sig, rank))
                if best is None or cost < best[0]:
                    best = (cost, state.solved, [node])
                    best_top, best_victims = price[0], price[1]
            else:
                found = _gang_at(pool.spoke_id, node, spokes, states, spec, sig, model, rank, now)
                if found is not None and (best is None or found[0] < best[0]):
                    best = found
                    price = _cost(found[1], now)
                    best_top, best_victims = price[0], price[1]
        if best is not None and best_victims <= 1:
            break  # later candidates of this level are older: one of them costs more
    if best is None:
        return None
    _, chosen, nodes = best
    hold = [] if fraction is not None else [(p, i, min(g, len(p.free[i]))) for p, i in nodes]
    waits = [h for h in chosen if h.preempting]
    evict = [h for h in chosen if not h.preempting]
    return waits, evict, hold, best[0][4:]


def _solve(node: Node, state: _NodeState, g: int, fraction: float | None) -> list[Holding] | None:
    """The fewest of the node's added candidates that make the shape fit, or None."""
    if fraction is None and not state.mixed:
        if state.devices < g:
            return None
        chosen = list(state.added)
        spare = state.devices - g
        for h in sorted(chosen, key=_expense):  # drop unneeded ones, the dearest first
            freed = sum(len(a.devices) for p, i, a in h.where if (p, i) == node)
            if freed <= spare:
                chosen.remove(h)
                spare -= freed
        return chosen
    if not _fits(node, state.added, g, fraction):
        return None
    chosen = list(state.added)
    for h in sorted(chosen, key=_expense):
        trial = [c for c in chosen if c is not h]
        if _fits(node, trial, g, fraction):
            chosen = trial
    return chosen


def _gang_at(
    spoke_id: str,
    node: Node,
    spokes: dict[str, list[tuple[tuple[object, ...], int, int, Node]]],
    states: dict[Node, _NodeState],
    spec: SpecLike,
    sig: Sig,
    model: str,
    rank: int,
    now: float,
) -> tuple[tuple[object, ...], list[Holding], list[Node]] | None:
    """A gang on `spoke_id` once `node` fits too: its cheapest nodes, free ones first."""
    g = spec.gpus_per_node
    fitting = spokes.get(spoke_id)
    if fitting is None:
        free_cost = _cost([], now)
        fitting = spokes[spoke_id] = [
            (free_cost, pool.index, i, (pool, i))
            for pool in sig.by_model.get(model, ())
            if pool.spoke_id == spoke_id
            for k in free_counts(pool.mask, g)
            for i in pool.by_k[k]
        ]
        fitting.sort(key=lambda e: e[:3])
    if not any(e[3] == node for e in fitting):  # a node free enough already is listed
        insort(fitting, (_cost(states[node].solved or [], now), node[0].index, node[1], node))
    elif len(fitting) < spec.nodes:
        return None
    if len(fitting) < spec.nodes:
        return None
    picked = [e[3] for e in fitting[: spec.nodes]]
    union: dict[str, Holding] = {}
    for n in picked:
        state = states.get(n)
        if state is not None and state.solved:
            for h in state.solved:
                union[h.id] = h
    chosen = list(union.values())
    first = picked[0][0]
    miss = sum(sig.miss.get(n[0].index, 0) for n in picked)
    static = (first.cloud, rank, miss, first.price, first.spoke_id, 0)
    return ((*_cost(chosen, now), *static), chosen, picked)


def _fits(node: Node, freed: list[Holding], g: int, fraction: float | None) -> bool:
    """Device by device: does the shape fit once `freed` stop?"""
    pool, i = node
    free = set(pool.free[i])
    shared = dict(pool.shared.get(i, {}))
    for h in freed:
        for p, j, a in h.where:
            if p is not pool or j != i:
                continue
            for device in a.devices:
                if a.fraction is None:
                    free.add(device)
                    shared.pop(device, None)
                    continue
                left = shared.get(device, 0.0) + a.fraction
                if left >= 1.0 - EPS:
                    shared.pop(device, None)
                    free.add(device)
                else:
                    shared[device] = left
    if fraction is None:
        return len(free) >= g
    return bool(free) or any(left >= fraction - EPS for left in shared.values())


def _expense(h: Holding) -> tuple[bool, int, float]:
    """Dearest first: new victims before stopping work, higher priority, then older."""
    return (h.preempting, -h.value, h.started_at)


def _cost(chosen: list[Holding], now: float) -> tuple[int, int, float, int]:
    """(highest victim priority or -1, victims, run time lost, stopping work waited on)."""
    new = [h for h in chosen if not h.preempting]
    top = max((h.value for h in new), default=-1)
    lost = sum(max(0.0, now - h.started_at) for h in new)
    return (top, len(new), lost, len(chosen) - len(new))


def _static(node: Node, sig: Sig, rank: int) -> tuple[object, ...]:
    pool, i = node
    return (pool.cloud, rank, sig.miss.get(pool.index, 0), pool.price, pool.spoke_id, i)


def _top_up(
    waits: list[Holding],
    evict: list[Holding],
    own_stopping: list[Holding],
    own: Iterable[Holding],
    limit_gap: float,
    team: str,
) -> bool:
    """Add own-team work until the team's limits have room too; False when they cannot."""
    limit_gap -= sum(h.amount for h in (*waits, *evict) if h.team == team)
    taken = {h.id for h in (*waits, *evict)}
    for h in chain(own_stopping, own):
        if limit_gap <= EPS:
            break
        if h.id not in taken:
            (waits if h.preempting else evict).append(h)
            taken.add(h.id)
            limit_gap -= h.amount
    return limit_gap <= EPS
