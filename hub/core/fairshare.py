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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain, islice

from hub.core.model import Unplaced, Workload
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


def with_classes(
    pending: Sequence[Workload], classes: Mapping[str, PriorityClass]
) -> tuple[list[tuple[Workload, PriorityClass]], list[Workload]]:
    """Each workload with its class (`classes`: by name), and those of an unknown class,
    oldest first."""
    entries: list[tuple[Workload, PriorityClass]] = []
    unknown: list[Workload] = []
    for workload in pending:
        cls = classes.get(workload.need.priority_class)
        if cls is None:
            unknown.append(workload)
        else:
            entries.append((workload, cls))
    return entries, oldest_first(unknown)


def oldest_first(workloads: Iterable[Workload]) -> list[Workload]:
    """By age, then id: how workloads the queue cannot rank are listed."""
    return sorted(workloads, key=lambda w: (w.submitted_at, w.id))


def queue_order(
    entries: Sequence[tuple[Workload, PriorityClass]],
    policy: Policy,
    now: float,
    share_of: ShareOf,
) -> Iterator[Entry]:
    """The workloads in the order they get a go; `share_of` is re-read between them.

    Each comes as (submitted_at, id, n, workload, class), `n` its place in `entries`.
    Workloads that claim devices freed for them by preemption go before everything else.
    """
    # Entries sort as tuples: by age, then id, then place (a stable sort by age and id).
    claims = sorted(
        (w.submitted_at, w.id, n, w, cls, Memo())
        for n, (w, cls) in enumerate(entries)
        if w.claims_freed
    )
    bands: dict[int, dict[str, list[Entry]]] = {}
    aging = policy.aging
    ages = aging.step > 0 and aging.interval_s > 0
    cap = policy.aging_cap()
    ordering = policy.ordering
    las = ordering.mode == "las"
    level_of: dict[str, int] = {}  # workload id -> level above 0 (ordering las)
    last: tuple[int, str] | None = None  # the last entry's band and team, and its queue
    last_queue: list[Entry] = []
    for n, (workload, cls) in enumerate(entries):
        if workload.claims_freed:
            continue
        band = cls.value
        level = pending_level(workload, ordering, now) if las else 0
        waited = now - workload.submitted_at
        if level:
            level_of[workload.id] = level  # it ran long: no aging until promoted back to 0
        elif ages and waited > 0 and band < cap:  # queue_priority(), inlined for deep queues
            band += aging.step * int(waited // aging.interval_s)
            if band > cap:
                band = cap
        team = workload.need.team
        if last is None or last[0] != band or last[1] != team:  # a run of one team and band
            last = (band, team)
            last_queue = bands.setdefault(band, {}).setdefault(team, [])
        last_queue.append((workload.submitted_at, workload.id, n, workload, cls, Memo()))
    for queues in bands.values():
        if las:
            for queue in queues.values():
                queue.sort(key=lambda e: (level_of.get(e[1], 0), e[0], e[1], e[2]))
        else:
            for queue in queues.values():
                queue.sort()
    if not las:
        return chain(claims, by_band(bands, share_of))
    levels = {
        band: {team: [level_of.get(e[1], 0) for e in queue] for team, queue in queues.items()}
        for band, queues in bands.items()
    }
    return chain(claims, by_band(bands, share_of, levels))


def by_band(
    bands: dict[int, dict[str, list[Entry]]],
    share_of: ShareOf,
    levels: dict[int, dict[str, list[int]]] | None = None,
) -> Iterator[Entry]:
    """Bands' queues (each team's in order) highest band first, each band's interleaved."""
    return chain.from_iterable(
        interleave(bands[band], share_of, levels[band] if levels is not None else None)
        for band in sorted(bands, reverse=True)
    )


def interleave(
    queues: dict[str, list[Entry]],
    share_of: ShareOf,
    levels: dict[str, list[int]] | None = None,
) -> Iterator[Entry]:
    """One band's teams' queues (each in order, none empty) as one: the team with the lowest
    level (`levels`, ordering las), then the smallest share, then the oldest head goes next.
    Shares are read when the band is reached, and again between its entries."""
    if len(queues) == 1:  # one team: its queue as it is (no share to compare)
        return iter(next(iter(queues.values())))
    return _interleaved(queues, share_of, levels)


def _interleaved(
    queues: dict[str, list[Entry]],
    share_of: ShareOf,
    levels: dict[str, list[int]] | None,
) -> Iterator[Entry]:
    heap: list[tuple[int, tuple[float, float], float, str, str, int]] = []
    for team, queue in queues.items():
        head = queue[0]
        level = levels[team][0] if levels is not None else 0
        heap.append((level, share_of(team), head[0], head[1], team, 0))
    heapq.heapify(heap)
    while heap:
        _, _, _, _, team, at = heapq.heappop(heap)
        queue = queues[team]
        if not heap:  # no other team in this band: the rest of this one, in order
            yield from islice(queue, at, None)
            return
        size = len(queue)
        while True:  # the same team goes on while it stays first (no heap round trip)
            yield queue[at]
            at += 1
            if at == size:
                break
            head = queue[at]
            level = levels[team][at] if levels is not None else 0
            entry = (level, share_of(team), head[0], head[1], team, at)
            if heap[0] < entry:
                heapq.heappush(heap, entry)
                break


class Memo:
    """What a plan worked out for one queue entry, kept for the next plan over the same entry.

    A queue kept between plans (`hub.core.pendingorder.KeptQueue`) keeps its entries while
    their workloads stay the same, and with them this: the next plan reads the workload's
    equivalence class and last explanation here, one object, instead of from its workload,
    spec and the last plan's explanations by id (a deep queue's per-workload cost is memory
    reads).
    """

    __slots__ = ("key", "unplaced")

    def __init__(self) -> None:
        self.key: tuple[object, ...] | None = None  # its class in a plan, where time-free
        self.unplaced: Unplaced | None = None  # what the last plan that looked at it said


#: (submitted_at, id, place, workload, class, memo); age and id never repeat, so entries sort
#: by them alone.
Entry = tuple[float, str, int, Workload, PriorityClass, Memo]
