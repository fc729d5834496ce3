"""The garbage collector of a long-running hub or spoke process."""

from __future__ import annotations

import gc

#: Allocations (net of frees) between young collections: the default 700 ran one every few
#: workloads under load, each reading every young object. Each older generation is collected
#: after 20 of the one below (the default is 10).
YOUNG_THRESHOLD = 50_000
OLDER_AFTER = 20


def settle() -> None:
    """Move what exists once the process has started (modules, classes, settings, the loaded
    state) out of the collector's way, and collect the young generation less often.

    A full collection reads every tracked object: over a spoke's or a hub's start-up heap it
    paused the process 30-70 ms, inside a scheduling cycle or a run of workload starts. Frozen
    objects are never read again (nor freed if they become cyclic garbage: they are the ones
    that live as long as the process)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, OLDER_AFTER, OLDER_AFTER)
