"""Hold nodes for a wide gang that has waited too long (`Policy.reservation`).

Best fit with skip-ahead starves wide gangs: every GPU freed is taken at once by a smaller job
further back, so a gang's nodes never all empty together. A gang that has waited past the
threshold therefore *holds* the nodes it would need, on the on-prem spoke closest to fitting
it: the free devices of those nodes are taken off this plan's working copy of the fleet, so
nothing later in the plan lands on them. Nothing is booked and nothing is preempted; the
holding is re-derived every plan.

Which nodes, without knowing run times: job run times are heavy-tailed, so the work that has
run longest is the likeliest to run on longest. A node is expected to empty after about as
long as its oldest (not stopping) work has run already; the gang holds the nodes expected to
empty first (empty nodes first), on the spoke where the last of them is expected soonest.
Held nodes only gain free devices and age evenly, so the choice stays put from plan to plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hub.core.capacity import Pool
from hub.core.fit import Sig
from hub.core.model import RunningWorkload, SpecLike


def oldest_starts(running: Iterable[RunningWorkload]) -> dict[tuple[str, str], float]:
    """(spoke, node) -> when its longest-running work (not being stopped) started."""
    found: dict[tuple[str, str], float] = {}
    for r in running:
        if r.preempting:
            continue
        for a in r.assignments:
            key = (r.spoke_id, a.node)
            start = found.get(key)
            if start is None or r.started_at < start:
                found[key] = r.started_at
    return found


def hold(
    sig: Sig, spec: SpecLike, oldest: Mapping[tuple[str, str], float], now: float
) -> str | None:
    """Take the free devices of the nodes `spec` would need off the plan; the spoke, or None.

    Over the acceptable models in preference order, the on-prem spoke whose `nodes` nodes
    (with at least `gpus_per_node` GPUs in all) expected to empty first are expected to have
    emptied soonest; ties to more free GPUs.
    """
    g, nodes = spec.gpus_per_node, spec.nodes
    best: tuple[tuple[float, int], str, list[tuple[Pool, int]]] | None = None
    for pools in sig.by_model.values():
        by_spoke: dict[str, list[tuple[float, int, int, int, Pool]]] = {}
        for pool in pools:
            if pool.cloud:
                continue
            spoke_nodes = by_spoke.setdefault(pool.spoke_id, [])
            for i, node in enumerate(pool.nodes):
                if node.gpu_count < g:
                    continue
                free = len(pool.free[i])
                start = oldest.get((pool.spoke_id, node.name))
                age = 0.0 if free >= node.gpu_count or start is None else max(0.0, now - start)
                spoke_nodes.append((age, -free, pool.index, i, pool))
        for spoke_id, candidates in sorted(by_spoke.items()):
            if len(candidates) < nodes:
                continue
            candidates.sort(key=lambda c: c[:4])
            chosen = candidates[:nodes]
            score = (chosen[-1][0], sum(c[1] for c in chosen))
            if best is None or score < best[0]:
                best = (score, spoke_id, [(c[4], c[3]) for c in chosen])
        if best is not None:
            break  # the most preferred model with a spoke big enough
    if best is None:
        return None
    for pool, i in best[2]:
        count = min(g, len(pool.free[i]))
        if count:
            pool.take_whole(i, count)
    return best[1]
