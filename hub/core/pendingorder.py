"""The pending queue kept in order between plans: `fairshare.queue_order`'s order for the cost
of what changed.

`queue_order` sorts the whole queue every plan. At 10,000 pending that was a third of a plan
(`bench/placement_bulk.py`), although between two plans only the workloads submitted, placed
or changed since then move. `KeptQueue` keeps each team's and class's pending workloads as
queue entries sorted by age and id, and files in and takes out only those that changed:

- **Bands.** A team's list of one class splits into aging bands where its aged priority
  drops. A younger workload never has a higher aged priority than an older one of its class,
  so each band is a run of the list: its end is guessed by a bisection on age (in C) and then
  checked, and moved if need be, with `fairshare.queue_priority`, the arithmetic
  `queue_order` uses, so rounding in the guess cannot put a workload in another band.
- **Teams.** Within a band a team's queue is its lists' slices (merged by age and id when
  two classes meet in one band), and the band's teams are interleaved by `fairshare.interleave`
  as in `queue_order`. Workloads that claim devices freed for them go first, in age order.
- **What changed.** A caller that knows which pending workloads changed since its last plan
  says so (`told`, as `hub.cycle` does); otherwise the queue is read through and compared by
  identity. A count that does not match the queue's reads it through as well.

Ordering `las` ranks by levels that change with time: that order is worked out afresh
(`queue_order`). Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, compress
from operator import attrgetter, is_not, not_

from hub.core.fairshare import Entry, Memo, ShareOf, by_band, oldest_first, queue_priority
from hub.core.model import Workload
from hub.core.policy import Policy, PriorityClass

_Group = tuple[str, str]  # team, priority class name

_ID = attrgetter("id")

_LAST = chr(0x10FFFF)  # after every id: (age, _LAST) sorts after every entry of that age

#: More new entries than this in one list: filed in by one sort, not one by one.
_MANY = 32


class KeptQueue:
    """Pending workloads with a known class, sorted by age and id per team and class."""

    __slots__ = ("_claims", "_classes", "_groups", "_of", "_unknown", "_views", "untold")

    def __init__(self) -> None:
        self._classes: dict[str, PriorityClass] | None = None  # what the entries were made with
        self._views: dict[str, Workload] = {}  # id -> every pending workload (read in C)
        # id -> the queue entry of one with a known class, and its list (None: a claim)
        self._of: dict[str, tuple[Entry, _Group | None]] = {}
        self._groups: dict[_Group, list[Entry]] = {}
        self._claims: dict[str, Entry] = {}  # those that claim devices freed for them
        self._unknown: dict[str, Workload] = {}  # those whose class the policy does not know
        self.untold = 0  # times a `told` missed something (the queue was read through)

    def sync(
        self,
        pending: Sequence[Workload],
        classes: dict[str, PriorityClass],
        told: Mapping[str, Workload | None] | None = None,
    ) -> bool:
        """Make the kept queue `pending`'s; False when it cannot be (an id repeats).

        `classes`: the policy's classes by name. `told`: for each pending workload that
        changed since the last sync, what it is now (None: no longer pending).
        """
        if classes != self._classes:
            self.clear()
            self._classes = classes
            told = None
        if told is not None:
            self._apply(told.items())
            if len(self._views) == len(pending):
                return True
            self.untold += 1
        if not self._read_through(pending):
            self.clear()
            return False
        return True

    def clear(self) -> None:
        """Forget every entry: the next sync reads its queue through."""
        self._classes = None
        self._of = {}
        self._views = {}
        self._groups = {}
        self._claims = {}
        self._unknown = {}

    def unknown(self) -> list[Workload]:
        """The pending workloads whose class the policy does not know, oldest first."""
        return oldest_first(self._unknown.values())

    def has(self, workload_id: str) -> bool:
        """Whether the workload is in the queue with a class the policy knows."""
        return workload_id in self._of

    def order(self, policy: Policy, now: float, share_of: ShareOf) -> Iterator[Entry]:
        """The entries in `fairshare.queue_order`'s order (ordering `fifo`)."""
        parts: dict[int, dict[str, list[list[Entry]]]] = {}  # band -> team -> runs in it
        for (team, _), items in self._groups.items():
            for band, start, stop in _splits(items, policy, now):
                run = items if start == 0 and stop == len(items) else items[start:stop]
                parts.setdefault(band, {}).setdefault(team, []).append(run)
        bands = {  # a team's one run is read as it is (the kept list itself when whole)
            band: {t: r[0] if len(r) == 1 else sorted(chain(*r)) for t, r in teams.items()}
            for band, teams in parts.items()
        }
        return chain(sorted(self._claims.values()), by_band(bands, share_of))

    def _read_through(self, pending: Sequence[Workload]) -> bool:
        """Compare `pending` with the kept queue by identity (in C: no Python per workload);
        False, with nothing filed, when an id repeats."""
        ids = list(map(_ID, pending))
        present = set(ids)
        if len(present) != len(ids):
            return False
        views = self._views
        self._apply((w.id, w) for w in compress(pending, map(is_not, map(views.get, ids), pending)))
        if len(views) != len(pending):  # some left the queue
            self._apply((wid, None) for wid in views.keys() - present)
        return True

    def _apply(self, changes: Iterable[tuple[str, Workload | None]]) -> None:
        """File in or take out each (id, workload now or None); ids do not repeat."""
        classes = self._classes or {}
        of, views, groups = self._of, self._views, self._groups
        gone: dict[_Group, list[Entry]] = {}
        new: dict[_Group, list[Entry]] = {}
        for wid, w in changes:
            was = views.get(wid)
            if was is w:
                continue
            if was is not None:
                del views[wid]
                found = of.pop(wid, None)
                if found is None:
                    del self._unknown[wid]
                elif found[1] is None:
                    del self._claims[wid]
                else:
                    gone.setdefault(found[1], []).append(found[0])
            if w is None:
                continue
            views[wid] = w
            cls = classes.get(w.need.priority_class)
            if cls is None:
                self._unknown[wid] = w
                continue
            entry = (w.submitted_at, wid, 0, w, cls, Memo())  # place 0: ids never repeat
            if w.claims_freed:
                self._claims[wid] = entry
                of[wid] = (entry, None)
            else:
                group = (w.need.team, cls.name)
                new.setdefault(group, []).append(entry)
                of[wid] = (entry, group)
        for group, entries in gone.items():
            _take_out(groups[group], entries)
            if not groups[group]:
                del groups[group]
        for group, entries in new.items():
            items = groups.setdefault(group, [])
            if len(entries) > _MANY:
                items.extend(entries)
                items.sort()
            else:
                for entry in entries:
                    insort(items, entry)


def _take_out(items: list[Entry], entries: list[Entry]) -> None:
    """Remove `entries` (each in `items` once) from the sorted `items`."""
    if len(entries) > len(items) >> 3:  # most of it: one pass over the list, in C
        out = set(map(id, entries))
        items[:] = compress(items, map(not_, map(out.__contains__, map(id, items))))
        return
    for entry in entries:  # a bisection and a move of pointers each
        del items[bisect_left(items, entry[:2])]


def _splits(items: list[Entry], policy: Policy, now: float) -> Iterator[tuple[int, int, int]]:
    """`items` (one class, by age) as runs of one aged priority: (priority, start, stop).

    Where a run ends is first guessed from the age at which the priority drops, by a bisection
    on the entries' ages (in C), then checked with `queue_priority` on either side of it and
    moved until right: rounding in the guess may put it an entry or two off.
    """
    size = len(items)
    youngest = _priority(items[-1], policy, now)
    aging = policy.aging
    cap = policy.aging_cap()
    start = 0
    while True:
        first = items[start]
        band = _priority(first, policy, now)
        if band == youngest:  # the rest alike (with aging off, or in one interval: at once)
            yield band, start, size
            return
        value = first[4].value
        steps = (band - value) // aging.step if band < cap else -((value - cap) // aging.step)
        stop = max(start + 1, bisect_right(items, (now - steps * aging.interval_s, _LAST), start))
        while stop > start + 1 and _priority(items[stop - 1], policy, now) < band:
            stop -= 1
        while _priority(items[stop], policy, now) == band:  # the youngest's is lower: it ends
            stop += 1
        yield band, start, stop
        start = stop


def _priority(entry: Entry, policy: Policy, now: float) -> int:
    return queue_priority(entry[4], now - entry[0], policy)
