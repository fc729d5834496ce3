"""Workloads as Kubernetes batch/v1 Jobs, one per (workload, epoch).

The Job lives in the team's namespace (`<prefix><team>`, created on first use), is pinned to the
assigned node(s) by node affinity, requests `nvidia.com/gpu` (or a MIG resource) as a limit and
carries the labels of the contract in spoke.kube. A gang of N nodes is one Indexed Job with
parallelism = completions = N and one pod per node (pod anti-affinity on the host); the pods
start independently, so true all-or-nothing co-scheduling needs Kueue or JobSet on top.

One watch thread per resource (Jobs, Pods; list, then watch from the list's resourceVersion,
relist on 410 Gone) feeds changes back to the event loop, where they become RuntimeEvents:
RUNNING once all pods run, then exactly one terminal event per (workload, epoch).

Modules: `runtime` (KubernetesRuntime), `manifests` (the Job and namespace objects), `status`
(what a Job's or pod's status means), `tracking` (tracked workloads and the events they report),
`jobs` (the API calls), `watch` (the list/watch threads), `lease` (a fenced Job's deadline: the
spoke's lease, so it ends without its spoke) and `keeper` (which moves those deadlines on).
"""

from spoke.runtime.kubernetes.jobs import FENCE_GRACE_S
from spoke.runtime.kubernetes.manifests import (
    CONTAINER_NAME,
    DEFAULT_PRIORITY_CLASSES,
    FINISHED_TTL_S,
    LABEL_WORKLOAD_NAME,
    POD_SECURITY_LABEL,
    build_job,
    job_name_for,
)
from spoke.runtime.kubernetes.runtime import STOP_WAIT_MARGIN_S, KubernetesRuntime
from spoke.runtime.kubernetes.status import FATAL_WAITING_REASONS, job_outcome, pod_state
from spoke.runtime.kubernetes.watch import WATCH_READ_TIMEOUT_S, WATCH_SERVER_TIMEOUT_S

__all__ = [
    "CONTAINER_NAME",
    "DEFAULT_PRIORITY_CLASSES",
    "FATAL_WAITING_REASONS",
    "FENCE_GRACE_S",
    "FINISHED_TTL_S",
    "LABEL_WORKLOAD_NAME",
    "POD_SECURITY_LABEL",
    "STOP_WAIT_MARGIN_S",
    "WATCH_READ_TIMEOUT_S",
    "WATCH_SERVER_TIMEOUT_S",
    "KubernetesRuntime",
    "build_job",
    "job_name_for",
    "job_outcome",
    "pod_state",
]
