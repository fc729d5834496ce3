"""Bringing work that runs on cloud spokes back on-prem once on-prem GPUs are free.

A job that went to a cloud instance for lack of on-prem room stays there to its end, and on a
trace with heavy-tailed run times the long ones are most of the cloud bill. Once on-prem GPUs
free up, and nothing pending wants them, such a job is stopped gracefully (it checkpoints, as
for any preemption) and queued again; placement ranks on-prem before cloud, so it resumes
on-prem, and burst releases the emptied instance after its idle_ttl (Karpenter calls this
consolidation).

The rule (`Policy.consolidation`) runs at the end of `plan()`, on what the plan left free:

- pending work comes first: the devices the plan placed work on, and those it holds for work
  waiting on preemptions or for a wide gang, are not offered;
- only jobs (never sessions or services) of a preemptible priority class (never production),
  not already stopping, that have run at least `after_s` on the cloud spoke since they last
  started: a job moved back and forth is stopped at most once per `after_s`;
- the longest-running first (with heavy-tailed run times, the likeliest to run longest still),
  at most `max_per_cycle` per plan, each only where its whole shape fits on-prem; the devices
  are booked for it for the rest of the plan, so two moves never count on the same ones.

The preemption's reason starts with `CONSOLIDATE` and names no workload it is for. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hub.core.capacity import Capacity
from hub.core.fit import Fit, Sig, find, model_rank, take
from hub.core.model import Preemption, RunningWorkload, SpecLike
from hub.core.policy import Policy
from schemas import SpokeKind, WorkloadKind

#: How every consolidation preemption's reason starts (machines may match on it).
CONSOLIDATE = "consolidate"

#: The on-prem pools a spec may use (its signature without cloud spokes).
OnPrem = Callable[[SpecLike], Sig]


def consolidate(
    capacity: Capacity,
    running: Sequence[RunningWorkload],
    policy: Policy,
    now: float,
    onprem: OnPrem,
    taken: frozenset[str] = frozenset(),
) -> list[Preemption]:
    """Cloud work to stop so that it resumes on-prem, booking its devices on `capacity`.

    `capacity`: what the plan left free. `taken`: workloads the plan preempts already.
    """
    rule = policy.consolidation
    if not rule.enabled or rule.max_per_cycle <= 0 or not running:
        return []
    cloud = {s.id for s in capacity.snapshot.spokes if s.kind == SpokeKind.CLOUD}
    if not cloud or not capacity.pools:
        return []
    candidates = [
        r
        for r in running
        if r.spoke_id in cloud
        and not r.preempting
        and r.assignments
        and r.id not in taken
        and now - r.started_at >= rule.after_s
        and _movable(r.need, policy)
    ]
    candidates.sort(key=lambda r: (r.started_at, r.id))
    out: list[Preemption] = []
    for r in candidates:
        if len(out) >= rule.max_per_cycle:
            break
        fit = _onprem_fit(onprem(r.need), r.need)
        if fit is None:
            continue
        take(fit)
        hours = (now - r.started_at) / 3600.0
        out.append(
            Preemption(
                r.id,
                r.spoke_id,
                f"{CONSOLIDATE}: on-prem GPUs are free; moving it off cloud spoke {r.spoke_id} "
                f"after {hours:.1f} h there (it resumes from its checkpoint on-prem)",
            )
        )
    return out


def _movable(spec: SpecLike, policy: Policy) -> bool:
    cls = policy.priority_class(spec.priority_class)
    return spec.kind == WorkloadKind.JOB and cls is not None and cls.preemptible


def _onprem_fit(sig: Sig, spec: SpecLike) -> Fit | None:
    best: Fit | None = None
    for model in sig.by_model:
        fit = find(sig, spec, model, model_rank(spec, model))
        if fit is not None and (best is None or fit.rank < best.rank):
            best = fit
    return best
