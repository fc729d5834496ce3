"""Queue order: priority (aged), then weighted dominant-resource fair share, then age.

Aging: a workload's queue priority is its class value plus `aging.step` for every full
`aging.interval_s` it has waited, capped just below the lowest never-preempted class, so old
batch work eventually goes before fresh training work but never before production. Aging only
orders the queue; preemption compares class values.

Within one aged priority, the team with the smallest weighted dominant share goes next (its
share above guarantee first, then of everything it uses; see `Ledger.share`), and within a
team the oldest workload. Shares are re-read after every decision, so a team that just got
GPUs steps back behind teams that have fewer.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

from hub.core.model import Workload
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
    for workload, cls in entries:
        if workload.claims_freed:
            continue
        band = cls.value
        waited = now - workload.submitted_at
        if ages and waited > 0 and band < cap:  # queue_priority(), inlined for deep queues
            band = min(cap, band + aging.step * int(waited // aging.interval_s))
        bands.setdefault(band, {}).setdefault(workload.spec.team, []).append((workload, cls))
    for band in sorted(bands, reverse=True):
        queues = bands[band]
        heap: list[tuple[tuple[float, float], float, str, str, int]] = []
        for team, queue in queues.items():
            queue.sort(key=lambda e: (e[0].submitted_at, e[0].id))
            head = queue[0][0]
            heap.append((share_of(team), head.submitted_at, head.id, team, 0))
        heapq.heapify(heap)
        while heap:
            _, _, _, team, at = heapq.heappop(heap)
            queue = queues[team]
            size = len(queue)
            while True:  # the same team goes on while it stays first (no heap round trip)
                yield queue[at]
                at += 1
                if at == size:
                    break
                head = queue[at][0]
                entry = (share_of(team), head.submitted_at, head.id, team, at)
                if heap and heap[0] < entry:
                    heapq.heappush(heap, entry)
                    break
