"""A working copy of the fleet's free devices, indexed so best-fit search is cheap.

Nodes of one spoke with the same GPU model and labels form a *pool*. A pool files its nodes by
how many wholly free devices they have (`by_k[k]`, with a bit mask of the non-empty counts),
and keeps its shared devices sorted by the share still free. Finding the fullest node that still
fits `g` GPUs is then a shift and a bit trick per pool, not a scan of nodes. Each model's
on-prem pools, and its cloud ones, are filed the same way one level up (`Tier`), so a shape
that may use any of the model's pools finds the best of them without reading each.

The snapshot is never mutated: free tuples are replaced, shared maps are copied on setup.

A `Capacity` may outlive one plan (`hub.core.planstate` keeps one across cycles): `begin()`
makes every pool note a node's free devices before a plan first changes them, `rollback()`
puts them back, and `set_free()` applies a node's new free devices from a later snapshot.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping

from hub.core.model import Node, Snapshot, Spoke
from schemas import RuntimeCapabilities, SpokeKind

EPS = 1e-9


class Pool:
    """Schedulable nodes of one accepting spoke with one GPU model and the same labels."""

    __slots__ = (
        "_sizes",
        "by_k",
        "cloud",
        "free",
        "index",
        "labels",
        "mask",
        "model",
        "nodes",
        "price",
        "region",
        "saved",
        "shared",
        "shared_sorted",
        "spoke",
        "spoke_id",
        "tier",
        "tier_pos",
        "total",
    )

    def __init__(self, index: int, spoke: Spoke, model: str, labels: Mapping[str, str]) -> None:
        self.index = index
        self.spoke = spoke
        self.spoke_id = spoke.id
        self.region = spoke.region
        self.cloud = spoke.kind == SpokeKind.CLOUD
        self.price = spoke.price_per_gpu_hour
        self.model = model
        self.labels = labels
        self.nodes: list[Node] = []
        self.free: list[tuple[int, ...]] = []  # wholly free devices per node
        self.shared: dict[int, dict[int, float]] = {}  # node -> device -> free share
        self.shared_sorted: list[tuple[float, int, int]] = []  # (free share, node, device)
        self.by_k: dict[int, set[int]] = {}  # wholly free count -> nodes
        self.mask = 0  # bit k set when by_k[k] is non-empty
        self.total = 0  # GPUs in the pool
        self._sizes: dict[int, int] | None = None  # GPUs per node -> nodes
        # While a plan runs on a kept Capacity: node -> (free, shares) before the plan took any.
        self.saved: dict[int, tuple[tuple[int, ...], dict[int, float] | None]] | None = None
        self.tier: Tier | None = None  # its model's on-prem or cloud pools (`Capacity.tiers`)
        self.tier_pos = 0  # its place in the tier's rank order

    def nodes_with(self, g: int) -> int:
        """How many nodes of the pool have at least `g` GPUs in all (free or not)."""
        counts = self._sizes
        if counts is None:
            counts = self._sizes = {}
            for node in self.nodes:
                counts[node.gpu_count] = counts.get(node.gpu_count, 0) + 1
        return sum(n for size, n in counts.items() if size >= g)

    def best_k(self, g: int) -> int:
        """Fewest wholly free devices (>= g) any node of the pool has; 0 when none fits."""
        m = self.mask >> g
        if not m:
            return 0
        return g + (m & -m).bit_length() - 1

    def take_whole(self, i: int, g: int) -> tuple[int, ...]:
        """Give away the `g` lowest free devices of node `i`."""
        if self.saved is not None:
            self._save(i)
        free = self.free[i]
        k = len(free)
        self.free[i] = free[g:]
        self._move(i, k, k - g)
        return free[:g]

    def best_shared(self, fraction: float) -> tuple[float, int, int] | None:
        """The shared device with the least free share that still holds `fraction`."""
        at = bisect_left(self.shared_sorted, (fraction - EPS, -1, -1))
        if at == len(self.shared_sorted):
            return None
        return self.shared_sorted[at]

    def take_share(self, i: int, device: int, fraction: float) -> None:
        """Give `fraction` of shared device `device` of node `i`."""
        if self.saved is not None:
            self._save(i)
        shares = self.shared[i]
        left = shares[device]
        if left > EPS:
            del self.shared_sorted[bisect_left(self.shared_sorted, (left, i, device))]
        left = max(0.0, left - fraction)
        shares[device] = left
        if left > EPS:
            insort(self.shared_sorted, (left, i, device))

    def share_whole(self, i: int, fraction: float) -> int:
        """Turn the lowest free device of node `i` into a shared one and give `fraction` of it."""
        if self.saved is not None:
            self._save(i)
        (device,) = self.take_whole(i, 1)
        self.shared.setdefault(i, {})[device] = 1.0
        insort(self.shared_sorted, (1.0, i, device))
        self.take_share(i, device, fraction)
        return device

    def set_free(self, i: int, free: tuple[int, ...], shares: dict[int, float] | None) -> None:
        """Make node `i`'s free devices `free` and its shared ones `shares` (a map this pool
        may keep), as setting the pool up from a snapshot with them would have."""
        old = self.shared.get(i)
        if old:
            for device, left in old.items():
                if left > EPS:
                    del self.shared_sorted[bisect_left(self.shared_sorted, (left, i, device))]
        if shares is None:
            self.shared.pop(i, None)
        else:
            self.shared[i] = shares
            for device, left in shares.items():
                if left > EPS:
                    insort(self.shared_sorted, (left, i, device))
        k = len(self.free[i])
        self.free[i] = free
        if k != len(free):
            self._move(i, k, len(free))

    def _save(self, i: int) -> None:
        saved = self.saved
        if saved is not None and i not in saved:
            shares = self.shared.get(i)
            saved[i] = (self.free[i], None if shares is None else dict(shares))

    def _move(self, i: int, old: int, new: int) -> None:
        if old > 0:
            bucket = self.by_k[old]
            bucket.discard(i)
            if not bucket:
                del self.by_k[old]
                self.mask &= ~(1 << old)
                if self.tier is not None:
                    self.tier.clear(self.tier_pos, old)
        if new > 0:
            into = self.by_k.get(new)
            if into is None:
                into = self.by_k[new] = set()
                self.mask |= 1 << new
                if self.tier is not None:
                    self.tier.set(self.tier_pos, new)
            into.add(i)


class Tier:
    """One model's on-prem (or cloud) pools in rank order, filed by the free counts their
    nodes have: the pool a single node's shape fits best is then a bit trick and a `min`, not
    a read of every pool (`hub.core.fit`).

    `at[k]` holds the rank positions of the pools with a node of exactly `k` wholly free
    devices; bit k of `mask` is set while it is non-empty. Pools keep it current as their own
    counts change (`Pool._move`).
    """

    __slots__ = ("at", "mask", "pools")

    def __init__(self, pools: list[Pool]) -> None:
        self.pools = pools
        self.at: dict[int, set[int]] = {}
        self.mask = 0
        for pos, pool in enumerate(pools):
            pool.tier, pool.tier_pos = self, pos
            for k in pool.by_k:  # the counts its mask has
                self.set(pos, k)

    def set(self, pos: int, k: int) -> None:
        found = self.at.get(k)
        if found is None:
            found = self.at[k] = set()
            self.mask |= 1 << k
        found.add(pos)

    def clear(self, pos: int, k: int) -> None:
        found = self.at[k]
        found.discard(pos)
        if not found:
            del self.at[k]
            self.mask &= ~(1 << k)


class Capacity:
    """Free capacity of the accepting spokes, changed as the plan gives devices away."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.pools: list[Pool] = []
        self.pools_by_model: dict[str, list[Pool]] = {}
        self.total_by_model: dict[str, float] = {}
        self._where: dict[str, dict[str, tuple[Pool, int]]] = {}
        self._spoke_pools: dict[str, list[Pool]] = {}
        self._views: dict[tuple[str, bool], tuple[list[Pool], set[int]]] = {}
        self.model_of: dict[str, dict[str, str]] = {}  # spoke -> node -> GPU model, all spokes
        for spoke in snapshot.spokes:
            if spoke.accepts_work:
                self._add_spoke(spoke)
            else:
                self.model_of[spoke.id] = {node.name: node.gpu_model for node in spoke.nodes}
        for pool in self.pools:
            self.total_by_model[pool.model] = self.total_by_model.get(pool.model, 0) + pool.total
        self.models: tuple[str, ...] = tuple(sorted(self.pools_by_model))
        # (model, cloud) -> its pools of that kind, in `view` order
        self.tiers: dict[tuple[str, bool], Tier] = {}
        for model in self.models:
            ranked = self.view(model, True)[0]
            for cloud in (False, True):
                self.tiers[(model, cloud)] = Tier([p for p in ranked if p.cloud == cloud])
        self.has_reserved = any(spoke.reserved_for for spoke in snapshot.spokes)
        unlimited = RuntimeCapabilities()
        self.has_limits = any(
            spoke.capabilities.model_copy(update={"mig_profiles": ()}) != unlimited
            for spoke in snapshot.spokes
        )

    def begin(self) -> None:
        """From now on every pool notes a node's free devices before it first changes them."""
        for pool in self.pools:
            pool.saved = {}

    def rollback(self) -> None:
        """Put back what changed since `begin()`: the plan's takes never outlive it."""
        for pool in self.pools:
            saved = pool.saved
            pool.saved = None
            if saved:
                for i, (free, shares) in saved.items():
                    pool.set_free(i, free, shares)

    def view(self, model: str, cloud: bool) -> tuple[list[Pool], set[int]]:
        """Pools of `model` (on-prem only unless `cloud`) in static rank order, and their ids.

        Rank: on-prem first, then cheaper, then spoke id. Shared between callers: read only.
        """
        found = self._views.get((model, cloud))
        if found is None:
            pools = sorted(
                (p for p in self.pools_by_model.get(model, ()) if cloud or not p.cloud),
                key=lambda p: (p.cloud, p.price, p.spoke_id, p.index),
            )
            found = self._views[(model, cloud)] = (pools, {p.index for p in pools})
        return found

    def locate(self, spoke_id: str, node: str) -> tuple[Pool, int] | None:
        """The pool and index of a node, or None when it cannot take work."""
        nodes = self._where.get(spoke_id)
        if nodes is None:
            nodes = self._where[spoke_id] = {
                name: (pool, i)
                for pool in self._spoke_pools.get(spoke_id, ())
                for i, name in enumerate(n.name for n in pool.nodes)
            }
        return nodes.get(node)

    def _add_spoke(self, spoke: Spoke) -> None:
        plain: dict[str, Pool] = {}  # model -> pool of nodes with no labels of their own
        labelled: dict[tuple[str, tuple[tuple[str, str], ...]], Pool] = {}
        spoke_labels = dict(spoke.labels)
        models = self.model_of[spoke.id] = {}
        for node in spoke.nodes:
            model = node.gpu_model
            models[node.name] = model
            if not node.schedulable:
                continue
            if node.labels:
                merged = {**spoke_labels, **node.labels}
                key = (model, tuple(sorted(merged.items())))
                pool = labelled.get(key)
                if pool is None:
                    pool = labelled[key] = self._new_pool(spoke, model, merged)
            else:
                pool = plain.get(model)
                if pool is None:
                    pool = plain[model] = self._new_pool(spoke, model, spoke_labels)
            i = len(pool.nodes)
            pool.nodes.append(node)
            pool.total += node.gpu_count
            free, shares = node_free(node)
            if shares is not None:
                pool.shared[i] = shares
                for device, left in shares.items():
                    if left > EPS:
                        insort(pool.shared_sorted, (left, i, device))
            pool.free.append(free)
            k = len(free)
            if k:
                bucket = pool.by_k.get(k)
                if bucket is None:
                    bucket = pool.by_k[k] = set()
                    pool.mask |= 1 << k
                bucket.add(i)

    def _new_pool(self, spoke: Spoke, model: str, labels: Mapping[str, str]) -> Pool:
        pool = Pool(len(self.pools), spoke, model, labels)
        self.pools.append(pool)
        self._spoke_pools.setdefault(spoke.id, []).append(pool)
        self.pools_by_model.setdefault(model, []).append(pool)
        return pool


def node_free(node: Node) -> tuple[tuple[int, ...], dict[int, float] | None]:
    """A node's wholly free devices and its shared ones (None when it shares none)."""
    if not node.free_fraction:
        return node.free, None
    # A device listed both as free and as shared counts as shared: never over-commit.
    shares = {d: min(1.0, max(0.0, left)) for d, left in node.free_fraction.items()}
    return tuple(d for d in node.free if d not in shares), shares
