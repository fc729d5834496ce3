"""Which replicas of a service to start and stop: scaling, replacing and rolling updates.

Pure: the replicas as the hub sees them, the desired count and the spec's generation in, a
plan out. Rules:

- an unhealthy replica (its health check failed past the threshold, or it ended) is stopped
  and counts for nothing, so the count logic starts its replacement in the same plan;
- a rolling update (replicas of an older generation alive) surges by one: it starts a new
  replica while alive replicas are at most `desired`, and stops an old one only when the
  ready replicas that remain are still at least `desired` (never below the ready count it
  asks for) or that old one was not ready anyway;
- scaling down stops the replicas that are not ready first, then the newest;
- a new replica goes to a region with room for it, the one with the fewest of the service's
  replicas, ties broken by the service's order of preference (`choose_regions`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica: `ready` once healthy; `unhealthy` once it must be replaced."""

    id: str
    generation: int
    started_at: float
    ready: bool = False
    unhealthy: bool = False
    region: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """What to do now: start `start` new replicas (of the current generation), stop `stop`."""

    start: int = 0
    stop: tuple[str, ...] = ()
    replaced: tuple[str, ...] = field(default=())  # of `stop`, the unhealthy ones

    @property
    def idle(self) -> bool:
        return self.start == 0 and not self.stop


def plan_replicas(replicas: tuple[Replica, ...], desired: int, generation: int) -> ReplicaPlan:
    """Starts and stops that move `replicas` towards `desired` of `generation` (module rules)."""
    unhealthy = tuple(r.id for r in replicas if r.unhealthy)
    alive = [r for r in replicas if not r.unhealthy]
    new = [r for r in alive if r.generation == generation]
    old = [r for r in alive if r.generation != generation]
    stop: list[str] = list(unhealthy)
    if not old:
        start = max(0, desired - len(new))
        if len(new) > desired:
            stop.extend(r.id for r in _stop_order(new)[: len(new) - desired])
        return ReplicaPlan(start=start, stop=tuple(stop), replaced=unhealthy)
    # Rolling: old replicas that are not ready serve nobody; they go first, freely.
    stop.extend(r.id for r in old if not r.ready)
    old_ready = [r for r in old if r.ready]
    new_ready = sum(1 for r in new if r.ready)
    ready = len(old_ready) + new_ready
    alive_after = len(new) + len(old_ready)
    start = 0
    if len(new) < desired and alive_after <= desired:
        start = 1  # surge by one
    # Stop old ready replicas while what stays ready still covers `desired`.
    for r in sorted(old_ready, key=lambda r: (r.started_at, r.id)):
        if ready - 1 >= desired:
            stop.append(r.id)
            ready -= 1
    return ReplicaPlan(start=start, stop=tuple(stop), replaced=unhealthy)


def choose_regions(
    existing: list[str | None],
    preferences: tuple[str, ...],
    count: int,
    spread: bool,
    with_room: frozenset[str] = frozenset(),
) -> list[str | None]:
    """For each of `count` new replicas, the region it should go to (None: no preference).

    `existing`: the regions of the service's replicas alive now (None: not placed yet);
    `with_room`: the regions that have room for a replica now. A region with room comes
    before one without; then, with spread, the one with the fewest replicas; then the order of
    `preferences`.
    """
    if not preferences:
        return [None] * count
    counts = Counter(r for r in existing if r is not None)
    rank = {region: i for i, region in enumerate(preferences)}
    out: list[str | None] = []
    for _ in range(count):
        region = min(
            preferences,
            key=lambda r: (r not in with_room, counts[r] if spread else 0, rank[r]),
        )
        out.append(region)
        counts[region] += 1
    return out


def _stop_order(replicas: list[Replica]) -> list[Replica]:
    """Scale-down victims first: not ready, then the newest."""
    return sorted(replicas, key=lambda r: (r.ready, -r.started_at, r.id))
