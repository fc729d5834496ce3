"""Why a workload cannot run, in words a person can act on.

`never_fits` finds the reasons that no amount of waiting fixes (no spoke, wrong region, model,
labels, a cloud-only match for a team that may not burst, a shape no node or spoke has), in
the order a person would check them. `no_room` words the transient one: the shape fits the
fleet, just not the free devices right now.
"""

from __future__ import annotations

from collections.abc import Iterable

from hub.core.capacity import Capacity, Pool
from hub.core.fit import runs_on
from hub.core.model import Reason, SpecLike
from hub.core.policy import Team

Why = tuple[Reason, str]


def never_fits(
    spec: SpecLike,
    team: Team,
    capacity: Capacity,
    eligible: list[Pool],
    avoid: frozenset[str] = frozenset(),
) -> Why | None:
    """The reason `spec` can never be placed on this fleet, or None when it could be.

    `eligible`: the pools its constraints allow (all models); when there are some, only the
    shape can be at fault.
    """
    if eligible:
        return None if _shape_exists(spec, eligible) else _never(spec, eligible)
    if not capacity.snapshot.spokes:
        return (Reason.NO_SPOKES, "no spoke has reported capacity yet")
    if not capacity.pools:
        return (Reason.NO_SPOKES, "no spoke accepting work has a schedulable GPU node")
    aff = spec.affinity
    pools = capacity.pools
    where = _where(spec)
    if aff.required_regions:
        pools = [p for p in pools if p.region in aff.required_regions]
        if not pools:
            regions = ", ".join(aff.required_regions)
            return (
                Reason.NO_MATCHING_REGION,
                f"no spoke accepting work in region {regions}"
                f" (regions: {_names(p.region for p in capacity.pools)})",
            )
    if spec.gpu_models:
        there = pools
        pools = [p for p in pools if p.model in spec.gpu_models]
        if not pools:  # the models there are, so a misspelt one (h100, A100s) is seen as such
            return (
                Reason.NO_MATCHING_MODEL,
                f"no schedulable node{where} has {models_text(spec)} GPUs"
                f" (models: {_names(p.model for p in there)})",
            )
    required = aff.required_labels
    if required:
        pools = [p for p in pools if all(p.labels.get(k) == v for k, v in required.items())]
        if not pools:
            return (
                Reason.NO_MATCHING_LABELS,
                f"no {_prefix(spec)}node{where} has labels {_labels(required)}",
            )
    if not team.may_burst:
        onprem = [p for p in pools if not p.cloud]
        if not onprem:
            return (
                Reason.BURST_NOT_ALLOWED,
                f"only cloud spokes{where} have {_gpus(spec)} and team "
                f"{spec.team} may not burst to the cloud",
            )
        pools = onprem
    open_pools = [p for p in pools if not p.spoke.reserved_for or spec.team in p.spoke.reserved_for]
    if not open_pools:
        return (
            Reason.RESERVED_FOR_OTHER_TEAMS,
            f"the spokes{where} with {_gpus(spec)} are reserved for other teams",
        )
    runnable = [p for p in open_pools if runs_on(p, spec, avoid)]
    if not runnable:
        return _refused(spec, open_pools, avoid)
    return None if _shape_exists(spec, runnable) else _never(spec, runnable)


def _refused(spec: SpecLike, pools: list[Pool], avoid: frozenset[str]) -> Why:
    where = _where(spec)
    if all(p.spoke_id in avoid for p in pools):
        spokes = ", ".join(sorted({p.spoke_id for p in pools}))
        return (
            Reason.RUNTIME_REFUSES,
            f"every spoke{where} that could run it refused it: {spokes}",
        )
    pool = next(p for p in pools if p.spoke_id not in avoid)
    names = (pool.nodes[0].name,) if pool.nodes else ()
    why = pool.spoke.capabilities.refuses(
        spec.nodes, spec.gpu_fraction is not None, names, spec.kind
    )
    return (Reason.RUNTIME_REFUSES, f"no spoke{where} with {_gpus(spec)} runs it: {why}")


def _never(spec: SpecLike, pools: list[Pool]) -> Why:
    """The shape is too big for `pools` (those it may use): say how big a shape they hold, so
    the person can resize it (fewer GPUs a node, or the gang split differently)."""
    where = _where(spec)
    g = spec.gpus_per_node
    largest = max((node.gpu_count for pool in pools for node in pool.nodes), default=0)
    most_here = f" (the most on one node is {largest})" if largest else ""
    if spec.nodes > 1:
        text = f"no spoke{where} has {spec.nodes} nodes with {g} {_gpus(spec)} each"
        counts = _nodes_per_spoke(g, pools)
        if counts:
            most, spoke_id = min((-count, sid) for sid, count in counts.items())
            text += f" (at most {-most}, on {spoke_id})" if most else most_here
    else:
        text = f"no node{where} has {g} {_gpus(spec)}{most_here}"
    return (Reason.SHAPE_NEVER_FITS, text)


def no_room(spec: SpecLike) -> Why:
    """The shape fits the fleet but not the devices free right now."""
    where = _where(spec)
    models = models_text(spec) or "GPUs"
    if spec.gpu_fraction is not None:
        text = f"no {_prefix(spec)}GPU{where} has {spec.gpu_fraction:g} of a device free"
    elif spec.nodes > 1:
        text = (
            f"no spoke{where} has {spec.nodes} nodes with {spec.gpus_per_node} free {models} each"
        )
    else:
        text = f"no node{where} has {spec.gpus_per_node} free {models}"
    if spec.affinity.required_labels:
        text += f" with labels {_labels(spec.affinity.required_labels)}"
    return (Reason.INSUFFICIENT_FREE, text)


def waiting(count: int) -> Why:
    """The workload waits for preempted work to stop."""
    noun = "workload" if count == 1 else "workloads"
    return (Reason.WAITING_FOR_PREEMPTION, f"waiting for {count} preempted {noun} to stop")


def unknown_class(name: str) -> Why:
    return (
        Reason.UNKNOWN_PRIORITY_CLASS,
        f"priority class '{name}' is not defined; ask an admin or use a defined one",
    )


def models_text(spec: SpecLike) -> str:
    """'H100', 'H100 or A100', or '' when any model will do."""
    if not spec.gpu_models:
        return ""
    if len(spec.gpu_models) == 1:
        return spec.gpu_models[0]
    return ", ".join(spec.gpu_models[:-1]) + " or " + spec.gpu_models[-1]


def _gpus(spec: SpecLike) -> str:
    models = models_text(spec)
    return f"{models} GPUs" if models else "GPUs"


def _prefix(spec: SpecLike) -> str:
    models = models_text(spec)
    return f"{models} " if models else ""


def _where(spec: SpecLike) -> str:
    regions = spec.affinity.required_regions
    return f" in region {', '.join(regions)}" if regions else ""


def _names(names: Iterable[str]) -> str:
    """Each of `names` once, sorted, comma-separated (`-` for one not given)."""
    return ", ".join(sorted({name or "-" for name in names}))


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _shape_exists(spec: SpecLike, pools: list[Pool]) -> bool:
    g = spec.gpus_per_node
    if spec.nodes == 1:
        return any(pool.nodes_with(g) for pool in pools)
    return any(count >= spec.nodes for count in _nodes_per_spoke(g, pools).values())


def _nodes_per_spoke(g: int, pools: list[Pool]) -> dict[str, int]:
    """Per spoke, its most nodes of one GPU model with at least `g` GPUs (a gang's nodes are
    of one spoke and one model)."""
    per_model: dict[tuple[str, str], int] = {}
    for pool in pools:
        key = (pool.spoke_id, pool.model)
        per_model[key] = per_model.get(key, 0) + pool.nodes_with(g)
    most: dict[str, int] = {}
    for (spoke_id, _), count in per_model.items():
        most[spoke_id] = max(most.get(spoke_id, 0), count)
    return most
