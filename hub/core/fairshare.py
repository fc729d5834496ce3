"""Queue order: priority (aged), then weighted dominant-resource fair share, then age.

Aging: a workload's queue priority is its class value plus `aging.step` for every full
`aging.interval_s` it has waited, capped just below the lowest never-preempted class, so old
batch work eventually goes before fresh training work but never before production. Aging only
orders the queue; preemption compares class values.

Within one aged priority, the team with the smallest weighted dominant share goes next (its
share above guarantee first, then of everything it uses; see `Ledger.share`), and within a
team the oldest workload. Shares are re-read after every decision, so a team that just got
GPUs steps back behind teams that have fewer. Under ordering `las` a workload's level of
attained service (`hub.core.ordering`) comes first within a band: fresh work before work
that already ran long, which does not age until the starvation guard puts it back on level 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

from hub.core.model import Workload
from hub.core.ordering import pending_level
from hub.core.policy import Policy, PriorityClass

ShareOf = Callable[[str], tuple[float, float]]


def queue_priority(cls: PriorityClass, waited: float, policy: Policy) -> int:
    """A class value raised by waiting, never above the aging cap (or below the value)."""
    aging = policy.aging
    if aging.step <= 0 or waited <= 0 or aging.interval_s <= 0:
        return cls.value
    cap = policy.aging_cap()
    if cls.value >= cap:
        return cls.value
    return min(cap, cls.value + aging.step * int(waited // aging.interval_s))


def queue_order(
    entries: Sequence[tuple[Workload, PriorityClass]],
    policy: Policy,
    now: float,
    share_of: ShareOf,
) -> Iterator[tuple[Workload, PriorityClass]]:
    """Yield workloads in the order they get a go; `share_of` is re-read between yields.

    Workloads that claim devices freed for them by preemption go before everything else.
    """
    claims = sorted(
        (e for e in entries if e[0].claims_freed), key=lambda e: (e[0].submitted_at, e[0].id)
    )
    yield from claims
    bands: dict[int, dict[str, list[tuple[Workload, PriorityClass]]]] = {}
    aging = policy.aging
    ages = aging.step > 0 and aging.interval_s > 0
    cap = policy.aging_cap()
    ordering = policy.ordering
    las = ordering.mode == "las"
    level_of: dict[str, int] = {}  # workload id -> level above 0 (ordering las)
    for workload, cls in entries:
        if workload.claims_freed:
            continue
        band = cls.value
        level = pending_level(workload, ordering, now) if las else 0
        waited = now - workload.submitted_at
        if level:
            level_of[workload.id] = level  # it ran long: no aging until promoted back to 0
        elif ages and waited > 0 and band < cap:  # queue_priority(), inlined for deep queues
            band = min(cap, band + aging.step * int(waited // aging.interval_s))
        bands.setdefault(band, {}).setdefault(workload.spec.team, []).append((workload, cls))
    for band in sorted(bands, reverse=True):
        queues = bands[band]
        levels: dict[str, list[int]] = {}  # team -> its queue's levels (ordering las)
        heap: list[tuple[int, tuple[float, float], float, str, str, int]] = []
        for team, queue in queues.items():
            if las:
                keyed = sorted(
                    ((level_of.get(e[0].id, 0), e[0].submitted_at, e[0].id), e) for e in queue
                )
                queue[:] = [e for _, e in keyed]
                levels[team] = [k[0] for k, _ in keyed]
            else:
                queue.sort(key=lambda e: (e[0].submitted_at, e[0].id))
            head = queue[0][0]
            level = levels[team][0] if las else 0
            heap.append((level, share_of(team), head.submitted_at, head.id, team, 0))
        heapq.heapify(heap)
        while heap:
            _, _, _, _, team, at = heapq.heappop(heap)
            queue = queues[team]
            size = len(queue)
            while True:  # the same team goes on while it stays first (no heap round trip)
                yield queue[at]
                at += 1
                if at == size:
                    break
                head = queue[at][0]
                level = levels[team][at] if las else 0
                entry = (level, share_of(team), head.submitted_at, head.id, team, at)
                if heap and heap[0] < entry:
                    heapq.heappush(heap, entry)
                    break
