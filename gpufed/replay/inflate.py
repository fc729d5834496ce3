"""Workload inflation on Alibaba's openb trace, as FGD ("Beware of Fragmentation") does.

The openb file is a sample of task shapes, not a load series. FGD measures packing by drawing
tasks at random (with replacement) from it and placing them one by one on an empty cluster
until the first one does not fit, then reporting the share of GPUs allocated at that moment.
Here the tasks are GPU pods (whole GPUs, or a share of one GPU, on the GPU models the pod
names, any model when it names none); CPU and memory are not modelled.

Tasks are handed to the scheduler in batches in draw order (one team, one class: plan()
takes them oldest first); placements after the first failure in a batch are dropped, which is
the same as placing them one at a time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufed.replay.cluster import Cluster
from gpufed.replay.fleet import Fleet
from gpufed.replay.simulator import Scheduler
from gpufed.replay.traces import Pod
from hub.core.model import RunningWorkload, Workload
from schemas import WorkloadSpec

TEAM = "openb"


@dataclass(frozen=True, slots=True)
class Inflation:
    """Where inflation stopped."""

    allocated_gpus: float
    capacity_gpus: int
    placed: int
    first_failure: str  # the shape that did not fit
    by_model: dict[str, float]  # GPUs allocated per model

    @property
    def allocated_share(self) -> float:
        """Allocated GPUs / all GPUs at the first failure."""
        return self.allocated_gpus / self.capacity_gpus if self.capacity_gpus else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form for report.json."""
        return {
            "allocated_share": self.allocated_share,
            "allocated_gpus": self.allocated_gpus,
            "capacity_gpus": self.capacity_gpus,
            "tasks_placed": self.placed,
            "first_failure": self.first_failure,
            "allocated_by_model": dict(sorted(self.by_model.items())),
        }


def inflate(
    pods: Sequence[Pod],
    fleet: Fleet,
    scheduler: Scheduler,
    *,
    seed: int = 0,
    batch: int = 256,
    max_tasks: int = 1_000_000,
) -> Inflation:
    """Draw pods at random and place them until the first one does not fit."""
    if not pods:
        raise ValueError("no GPU tasks to draw from")
    rng = random.Random(seed)
    shapes: dict[tuple[object, ...], WorkloadSpec] = {}
    specs = []
    for pod in pods:
        key = (pod.num_gpu, pod.fraction, pod.models)
        spec = shapes.get(key)
        if spec is None:
            spec = shapes[key] = _spec(pod)
        specs.append(spec)
    cluster = Cluster(fleet)
    running: list[RunningWorkload] = []
    models = {(s.id, n.name): n.gpu_model for s in fleet.spokes for n in s.nodes}
    by_model: dict[str, float] = {}
    allocated = 0.0
    drawn = 0
    while drawn < max_tasks:
        wave = [
            Workload(f"t{drawn + k}", rng.choice(specs), float(drawn + k)) for k in range(batch)
        ]
        drawn += batch
        plan = scheduler(cluster.snapshot(), wave, running, 0.0)
        placed = {p.workload_id: p for p in plan.placements}
        for workload in wave:
            placement = placed.get(workload.id)
            if placement is None:
                return Inflation(
                    allocated, fleet.gpus, len(running), _shape(workload.spec), dict(by_model)
                )
            cluster.take(placement.spoke_id, placement.assignments)
            running.append(
                RunningWorkload(
                    workload.id, workload.spec, placement.spoke_id, placement.assignments, 0.0
                )
            )
            gpus = workload.spec.total_gpus
            allocated += gpus
            model = models[(placement.spoke_id, placement.assignments[0].node)]
            by_model[model] = by_model.get(model, 0.0) + gpus
    raise ValueError(f"{max_tasks} tasks placed without a failure: is the fleet unbounded?")


def _spec(pod: Pod) -> WorkloadSpec:
    return WorkloadSpec(
        name="openb",
        team=TEAM,
        priority_class="batch",
        command=("replay",),
        gpus_per_node=1 if pod.fraction is not None else pod.num_gpu,
        gpu_fraction=pod.fraction,
        gpu_models=pod.models,
    )


def _shape(spec: WorkloadSpec) -> str:
    if spec.gpu_fraction is not None:
        what = f"{spec.gpu_fraction:g} of a GPU"
    else:
        what = f"{spec.gpus_per_node} GPU{'s' if spec.gpus_per_node > 1 else ''}"
    models = "/".join(spec.gpu_models) or "any model"
    return f"{what} ({models})"
