"""Where a workload's shape fits best, over the pools its constraints allow.

A *signature* is everything that decides which pools a workload may use and how they rank
(GPU models, required/preferred regions and labels, whether its team may burst). Workloads
with the same signature share the eligible pool list and a cache of shapes that did not fit:
free capacity only shrinks while a plan is built, so a shape that failed fails again, and so
does any larger one.

Ranking, best first: on-prem before cloud, then the earlier acceptable GPU model, then least
fragmentation (the node, or for gangs the nodes, with the fewest free GPUs that still fit), then
preferred regions/labels, then price, then spoke id.
"""

from __future__ import annotations

from collections.abc import Iterator

from hub.core.capacity import EPS, Capacity, Pool, Tier
from hub.core.model import SpecLike
from schemas import Assignment

SigKey = tuple[object, ...]


class Sig:
    """Pools a class of workloads may use, in static rank order, plus its failure cache."""

    __slots__ = (
        "by_model",
        "by_spoke",
        "eligible",
        "fail_frac",
        "fail_gang",
        "fail_whole",
        "key",
        "miss",
        "pool_ids",
        "ranked",
        "split",
    )

    def __init__(self, key: SigKey) -> None:
        self.key = key
        self.by_model: dict[str, list[Pool]] = {}
        self.pool_ids: dict[str, set[int]] = {}
        # model -> eligible pools per spoke (`_by_spoke`), made when a gang first looks
        self.by_spoke: dict[str, list[list[Pool]]] = {}
        # model -> its eligible on-prem pools, then its cloud ones (`_split`), made when a
        # single node's shape first reads them
        self.split: dict[str, tuple[list[Pool], list[Pool]]] = {}
        # model -> its on-prem and (when it may burst) cloud `Tier`, when its pools are all of
        # the model's (no affinity, reservation or runtime narrows them)
        self.ranked: dict[str, tuple[Tier, ...]] = {}
        self.miss: dict[int, int] = {}  # pool index -> preferred regions/labels it misses, if any
        self.fail_whole: dict[str, int] = {}  # model -> smallest GPU count that did not fit
        self.fail_frac: dict[str, float] = {}  # model -> smallest fraction that did not fit
        self.fail_gang: dict[str, list[tuple[int, int]]] = {}  # model -> (nodes, gpus)
        self.eligible = False  # any pool at all


class Fit:
    """A spot for one workload: nodes of one spoke, and a rank to compare spots by.

    Read only once made. A plain class, not a frozen dataclass: a plan makes one for every
    spot it finds (about 200 a cycle in bench/placement.py), and a frozen dataclass sets each
    field through `object.__setattr__`."""

    __slots__ = ("device", "fraction", "gpus", "parts", "rank", "spoke_id")

    def __init__(
        self,
        rank: tuple[object, ...],
        spoke_id: str,
        parts: tuple[tuple[Pool, int], ...],
        gpus: int,
        fraction: float | None = None,
        device: int | None = None,
    ) -> None:
        self.rank = rank
        self.spoke_id = spoke_id
        self.parts = parts  # (pool, node index) per node used
        self.gpus = gpus  # whole GPUs per node (0 for a fraction)
        self.fraction = fraction
        self.device = device  # the shared device a fraction goes on (None: a free one)


def capability_needs(
    spec: SpecLike, avoid: frozenset[str], capacity: Capacity
) -> tuple[object, ...]:
    """What narrows a workload's pools beyond models and affinity: runtime limits, refusals.

    Empty (and so no part of the signature) on a fleet whose runtimes all run everything, for
    a workload no spoke has refused.
    """
    if not avoid and not capacity.has_limits:
        return ()
    return (spec.nodes, spec.gpu_fraction is not None, spec.kind, tuple(sorted(avoid)))


def runs_on(pool: Pool, spec: SpecLike, avoid: frozenset[str]) -> bool:
    """Whether the pool's spoke would run `spec`: its runtime can, and it has not refused it."""
    if pool.spoke_id in avoid:
        return False
    names = (pool.nodes[0].name,) if pool.nodes else ()
    caps = pool.spoke.capabilities
    return caps.refuses(spec.nodes, spec.gpu_fraction is not None, names, spec.kind) is None


def sig_key(
    spec: SpecLike,
    may_burst: bool,
    team: str,
    needs: tuple[object, ...] = (),
    akey: tuple[object, ...] | None = None,
) -> SigKey:
    """What makes two workloads compete for the same pools in the same order (`akey`: the
    spec's `affinity_key`, when known)."""
    if akey is None:
        akey = affinity_key(spec)
    return (spec.gpu_models, akey, may_burst, team, needs)


def affinity_key(spec: SpecLike) -> tuple[object, ...]:
    """The part of a signature its affinity decides."""
    aff = spec.affinity
    if aff.required_regions or aff.preferred_regions or aff.required_labels or aff.preferred_labels:
        return (
            aff.required_regions,
            tuple(sorted(aff.required_labels.items())),
            aff.preferred_regions,
            tuple(sorted(aff.preferred_labels.items())),
        )
    return ()


def build_sig(
    key: SigKey,
    spec: SpecLike,
    capacity: Capacity,
    may_burst: bool,
    team: str,
    avoid: frozenset[str] = frozenset(),
) -> Sig:
    """The eligible pools of each acceptable model, best static rank first."""
    sig = Sig(key)
    aff = spec.affinity
    regions = set(aff.required_regions)
    required = aff.required_labels
    preferred_regions = set(aff.preferred_regions)
    preferred = aff.preferred_labels
    plain = not (regions or required or preferred or preferred_regions)
    limited = bool(key[-1])  # capability_needs: some runtime refuses some shapes
    for model in spec.gpu_models or capacity.models:
        if model in sig.by_model:
            continue
        if plain and not capacity.has_reserved and not limited:
            sig.by_model[model], sig.pool_ids[model] = capacity.view(model, may_burst)
            onprem = capacity.tiers.get((model, False))
            if onprem is not None:
                cloud = capacity.tiers[(model, True)]
                sig.ranked[model] = (onprem, cloud) if may_burst else (onprem,)
            continue
        eligible = []
        for pool in capacity.view(model, may_burst)[0]:
            if regions and pool.region not in regions:
                continue
            if limited and not runs_on(pool, spec, avoid):
                continue
            reserved = pool.spoke.reserved_for
            if reserved and team not in reserved:
                continue
            labels = pool.labels
            if required and any(labels.get(k) != v for k, v in required.items()):
                continue
            miss = sum(1 for k, v in preferred.items() if labels.get(k) != v)
            if preferred_regions and pool.region not in preferred_regions:
                miss += 1
            if miss:
                sig.miss[pool.index] = miss
            eligible.append(pool)
        if sig.miss:
            # Stable: pools keep their (price, spoke) order within the same misses.
            eligible.sort(key=lambda p: (p.cloud, sig.miss.get(p.index, 0)))
        sig.by_model[model] = eligible
        sig.pool_ids[model] = {p.index for p in eligible}
    sig.eligible = any(sig.by_model.values())
    return sig


def fresh_sig(static: Sig) -> Sig:
    """A signature with `static`'s pools and empty failure caches (for a new plan)."""
    sig = Sig(static.key)
    sig.by_model = static.by_model
    sig.by_spoke = static.by_spoke
    sig.split = static.split
    sig.ranked = static.ranked
    sig.pool_ids = static.pool_ids
    sig.miss = static.miss
    sig.eligible = static.eligible
    return sig


def model_rank(spec: SpecLike, model: str) -> int:
    """0 for the most preferred acceptable model; every model ranks 0 when any will do."""
    return spec.gpu_models.index(model) if spec.gpu_models else 0


def find(sig: Sig, spec: SpecLike, model: str, rank: int) -> Fit | None:
    """The best spot for `spec` on `model` GPUs, or None (remembered for the cycle)."""
    if spec.gpu_fraction is not None:
        failed_f = sig.fail_frac.get(model)
        if failed_f is not None and spec.gpu_fraction >= failed_f - EPS:
            return None
        fit = _find_fraction(sig, model, rank, spec.gpu_fraction)
        if fit is None:
            sig.fail_frac[model] = min(spec.gpu_fraction, failed_f or 1.0)
        return fit
    g = spec.gpus_per_node
    if spec.nodes == 1:
        failed = sig.fail_whole.get(model)
        if failed is not None and g >= failed:
            return None
        fit = _find_whole(sig, model, rank, g)
        if fit is None:
            sig.fail_whole[model] = g if failed is None else min(g, failed)
        return fit
    failures = sig.fail_gang.setdefault(model, [])
    if any(spec.nodes >= n and g >= m for n, m in failures):
        return None
    fit = _find_gang(sig, model, rank, spec.nodes, g)
    if fit is None:
        failures.append((spec.nodes, g))
    return fit


def free_counts(mask: int, g: int) -> Iterator[int]:
    """The free counts >= g present in a pool's mask, ascending."""
    m = mask >> g
    k = g
    while m:
        if m & 1:
            yield k
        m >>= 1
        k += 1


def take(fit: Fit) -> tuple[Assignment, ...]:
    """Give the fit's devices away in the working copy; the assignments that say which."""
    if fit.fraction is not None:
        ((pool, i),) = fit.parts
        if fit.device is None:
            device = pool.share_whole(i, fit.fraction)
        else:
            device = fit.device
            pool.take_share(i, device, fit.fraction)
        return (_assignment(pool.nodes[i].name, (device,), fit.fraction),)
    return tuple(
        _assignment(pool.nodes[i].name, pool.take_whole(i, fit.gpus)) for pool, i in fit.parts
    )


#: Assignment's defaults (constants), looked up once rather than on every placement.
_DEFAULTS = {
    name: field.default
    for name, field in Assignment.model_fields.items()
    if not field.is_required() and field.default_factory is None
}
_SCHEMA_VERSION = _DEFAULTS["schema_version"]
_new = Assignment.__new__
_set = object.__setattr__


def _assignment(node: str, devices: tuple[int, ...], fraction: float | None = None) -> Assignment:
    """`Assignment.model_construct(node=, devices=[, fraction=])`: the same object, field for
    field and in the fields it says were set, set up as `model_construct` sets it up
    (`__dict__` in field order, the set fields, no extra, no private attributes) without
    pydantic's per-field resolution on every placement (`tests/unit/hub/core/test_fit.py`
    compares the two)."""
    a = _new(Assignment)
    _set(
        a,
        "__dict__",
        {"schema_version": _SCHEMA_VERSION, "node": node, "devices": devices, "fraction": fraction},
    )
    fields = {"node", "devices"} if fraction is None else {"node", "devices", "fraction"}
    _set(a, "__pydantic_fields_set__", fields)
    _set(a, "__pydantic_extra__", None)
    _set(a, "__pydantic_private__", None)
    return a


def _find_whole(sig: Sig, model: str, rank: int, g: int) -> Fit | None:
    """The pool with the fullest node that still fits `g`, on-prem first: cloud pools rank
    below any on-prem one, so they are read only when no on-prem pool fits."""
    ranked = sig.ranked.get(model)
    if ranked is not None:  # all of the model's pools: their tiers know where g fits best
        for tier in ranked:
            m = tier.mask >> g
            if m:
                k = g + (m & -m).bit_length() - 1
                return _whole_fit(sig, tier.pools[min(tier.at[k])], k, rank, g)
        return None
    split = sig.split.get(model)
    if split is None:
        split = sig.split[model] = _split(sig.by_model.get(model, []))
    for pools in split:
        best: Pool | None = None
        best_k = 1 << 30
        for pool in pools:
            m = pool.mask >> g
            if m:
                k = g + (m & -m).bit_length() - 1
                if k < best_k:
                    best, best_k = pool, k
                    if k == g:
                        break
        if best is not None:
            return _whole_fit(sig, best, best_k, rank, g)
    return None


def _whole_fit(sig: Sig, pool: Pool, k: int, rank: int, g: int) -> Fit:
    """`g` devices of the lowest-numbered node of `pool` that has `k` free."""
    i = min(pool.by_k[k])
    rank_key = (pool.cloud, rank, k, sig.miss.get(pool.index, 0), pool.price, pool.spoke_id)
    return Fit(rank_key, pool.spoke_id, ((pool, i),), g)


def _split(pools: list[Pool]) -> tuple[list[Pool], list[Pool]]:
    """Eligible pools (on-prem first, `Capacity.view`) split into on-prem and cloud."""
    return [p for p in pools if not p.cloud], [p for p in pools if p.cloud]


def _find_fraction(sig: Sig, model: str, rank: int, fraction: float) -> Fit | None:
    """Pack onto the fullest shared device that holds it; else the fullest node's free one."""
    pools = sig.by_model.get(model, ())
    for cloud in (False, True):
        best: tuple[float, Pool, int, int] | None = None
        for pool in pools:
            if pool.cloud != cloud:
                continue
            hit = pool.best_shared(fraction)
            if hit is not None and (best is None or hit[0] < best[0] - EPS):
                best = (hit[0], pool, hit[1], hit[2])
        if best is not None:
            left, pool, i, device = best
            rank_key = (
                cloud,
                rank,
                0,
                left,
                sig.miss.get(pool.index, 0),
                pool.price,
                pool.spoke_id,
            )
            return Fit(rank_key, pool.spoke_id, ((pool, i),), 0, fraction, device)
        whole_pool: Pool | None = None
        best_k = 1 << 30
        for pool in pools:
            if pool.cloud != cloud:
                continue
            k = pool.best_k(1)
            if k and k < best_k:
                whole_pool, best_k = pool, k
        if whole_pool is not None:
            i = min(whole_pool.by_k[best_k])
            rank_key = (
                cloud,
                rank,
                1,
                best_k,
                sig.miss.get(whole_pool.index, 0),
                whole_pool.price,
                whole_pool.spoke_id,
            )
            return Fit(rank_key, whole_pool.spoke_id, ((whole_pool, i),), 0, fraction)
    return None


def _find_gang(sig: Sig, model: str, rank: int, nodes: int, g: int) -> Fit | None:
    """N nodes of one spoke with g free GPUs each; the spoke whose fitting nodes are fullest."""
    best: Fit | None = None
    best_sum = 1 << 30
    groups = sig.by_spoke.get(model)
    if groups is None:
        groups = sig.by_spoke[model] = _by_spoke(sig.by_model.get(model, []))
    ranked = sig.ranked.get(model)
    fitting = None if ranked is None else _fitting_nodes(ranked, g)
    if fitting is not None and not fitting:
        return None
    for spoke_pools in groups:
        first = spoke_pools[0]
        if best is not None and first.cloud != best.rank[0]:
            break
        if fitting is not None:
            if fitting.get(first.spoke_id, 0) < nodes:
                continue
        else:
            count = 0  # nodes with g free or more, up to `nodes`
            for pool in spoke_pools:
                for k in free_counts(pool.mask, g):
                    count += len(pool.by_k[k])
                if count >= nodes:
                    break
            if count < nodes:
                continue
        chosen: list[tuple[int, Pool, int]] = []
        for k in sorted({k for pool in spoke_pools for k in free_counts(pool.mask, g)}):
            for pool in spoke_pools:
                bucket = pool.by_k.get(k)
                if bucket:
                    chosen.extend((k, pool, i) for i in sorted(bucket))
            if len(chosen) >= nodes:
                break
        chosen = chosen[:nodes]
        total = sum(k for k, _, _ in chosen)
        if total < best_sum:
            miss = sum(sig.miss.get(p.index, 0) for _, p, _ in chosen)
            rank_key = (first.cloud, rank, total, miss, first.price, first.spoke_id)
            parts = tuple((p, i) for _, p, i in chosen)
            best, best_sum = Fit(rank_key, first.spoke_id, parts, g), total
            if total == nodes * g:
                break
    return best


def _fitting_nodes(tiers: tuple[Tier, ...], g: int) -> dict[str, int]:
    """Per spoke, its nodes with `g` or more wholly free devices, read from the model's tiers
    (only pools that have such a node are looked at)."""
    found: dict[str, int] = {}
    for tier in tiers:
        for k in free_counts(tier.mask, g):
            for pos in tier.at[k]:
                pool = tier.pools[pos]
                found[pool.spoke_id] = found.get(pool.spoke_id, 0) + len(pool.by_k[k])
    return found


def _by_spoke(pools: list[Pool]) -> list[list[Pool]]:
    """Eligible pools grouped per spoke, groups in the order of their best pool."""
    groups: dict[str, list[Pool]] = {}
    for pool in pools:
        groups.setdefault(pool.spoke_id, []).append(pool)
    return list(groups.values())
