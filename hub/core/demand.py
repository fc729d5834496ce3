"""Unplaceable demand for the burst planner: what no spoke the hub has can serve.

Pure: built from the plan's explanations, the pending workloads and the policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hub.core.model import Reason, SpecLike, Unplaced, Workload
from hub.core.policy import Policy
from schemas.burst import MAX_DEMAND_ITEMS, MAX_WORKLOAD_IDS, DemandItem, DemandReport

#: Reasons that more capacity would cure. Work waiting on its team's limit, on preemption of
#: others, or on a class the policy does not know is not demand for the cloud.
BURSTABLE = frozenset(
    {
        Reason.NO_SPOKES,
        Reason.NO_MATCHING_MODEL,
        Reason.NO_MATCHING_REGION,
        Reason.INSUFFICIENT_FREE,
        Reason.SHAPE_NEVER_FITS,
        Reason.RESERVED_FOR_OTHER_TEAMS,
    }
)

_Key = tuple[str, str | None, int, int, float | None, tuple[str, ...], bool]


def unplaceable_demand(
    unplaced: Sequence[Unplaced],
    pending: Mapping[str, Workload],
    policy: Policy,
    now: float,
    seq: int,
) -> DemandReport:
    """Group burstable pending work of teams allowed to burst by shape, oldest first."""
    groups: dict[tuple[_Key, bool], list[Workload]] = {}
    bursts: dict[str, bool] = {}  # team -> may burst: looked up once per team, not per item
    for item in unplaced:
        if item.reason not in BURSTABLE:
            continue
        workload = pending.get(item.workload_id)
        if workload is None:
            continue
        spec = workload.need
        may_burst = bursts.get(spec.team)
        if may_burst is None:
            may_burst = bursts[spec.team] = policy.team(spec.team).may_burst
        if not may_burst or spec.nodes > 1:
            # A gang must share one spoke, and a burst instance is a spoke of one node.
            continue
        # Work that ran before (preempted) gets items of its own (DemandItem.attained_s).
        ran = workload.attained_gpu_s > 0
        groups.setdefault((_group_key(spec, policy), ran), []).append(workload)
    items = []
    for key, members in groups.items():
        members.sort(key=lambda w: (w.submitted_at, w.id))
        (team, model, gpus, nodes, fraction, regions, spot_ok), _ = key
        width = (fraction or gpus) * nodes
        items.append(
            DemandItem(
                team=team,
                gpu_model=model,
                gpus_per_node=gpus,
                nodes=nodes,
                gpu_fraction=fraction,
                count=len(members),
                oldest_age_s=max(0.0, now - members[0].submitted_at),
                workload_ids=tuple(w.id for w in members[:MAX_WORKLOAD_IDS]),
                regions=regions,
                spot_ok=spot_ok,
                attained_s=min(w.attained_gpu_s for w in members) / width,
            )
        )
    items.sort(key=lambda i: (-i.oldest_age_s, i.team, i.workload_ids))
    return DemandReport(items=tuple(items[:MAX_DEMAND_ITEMS]), sent_at=now, seq=seq)


def _group_key(spec: SpecLike, policy: Policy) -> _Key:
    klass = policy.priority_class(spec.priority_class)
    return (
        spec.team,
        spec.gpu_models[0] if spec.gpu_models else None,
        spec.gpus_per_node,
        spec.nodes,
        spec.gpu_fraction,
        spec.affinity.required_regions,
        klass is None or klass.preemptible,  # work never preempted must not go to spot
    )
