"""What a Job's or pod's status means for the workload: a phase, a reason, an exit code.

Pure functions of the JSON the API server returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas import EventPhase
from spoke.kube import meta
from spoke.runtime.kubernetes.lease import FENCED_MESSAGE, fenced_by_lease
from spoke.runtime.kubernetes.manifests import CONTAINER_NAME

#: Container states that never heal on their own: the workload fails at once and its Job is
#: deleted, so a pod stuck pulling an image does not hold a GPU.
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A phase to report for a workload, with why."""

    phase: EventPhase
    reason: str = ""
    exit_code: int | None = None
    message: str = ""


def job_outcome(job: Mapping[str, Any]) -> Outcome | None:
    """The terminal outcome a Job's conditions state, or None while it runs; a fenced Job its
    lease stopped (lease.py) was preempted, reason `fenced`."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind == "Complete":
            return Outcome(EventPhase.SUCCEEDED, exit_code=0)
        if kind in ("Failed", "FailureTarget"):
            if condition.get("reason") == "DeadlineExceeded" and fenced_by_lease(job):
                # Not the workload's failure: it runs again elsewhere, no restart counted.
                return Outcome(EventPhase.PREEMPTED, reason="fenced", message=FENCED_MESSAGE)
            return Outcome(
                EventPhase.FAILED,
                reason=str(condition.get("reason") or "JobFailed"),
                message=str(condition.get("message") or ""),
            )
    return None


def pod_state(pod: Mapping[str, Any]) -> tuple[str, Outcome | None]:
    """What a pod's status means: ("pending"|"running"|"succeeded"|"killed"|"failed", outcome).

    The outcome is set for "failed": a container that exited non-zero (OOMKilled, 137), a
    container that can never start (ImagePullBackOff), or a pod evicted by the cluster
    (PREEMPTED). A pod that ends while being deleted was "killed": the Job, or whoever deleted
    it, says why.
    """
    status = pod.get("status") or {}
    phase = status.get("phase")
    deleting = bool(meta(pod).get("deletionTimestamp"))
    for condition in status.get("conditions") or []:
        disrupted = (
            condition.get("type") == "DisruptionTarget" and condition.get("status") == "True"
        )
        if disrupted and (phase == "Failed" or deleting):
            return "failed", Outcome(
                EventPhase.PREEMPTED,
                reason=str(condition.get("reason") or "DisruptionTarget"),
                message=str(condition.get("message") or ""),
            )
    containers = _our_containers(status)
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING_REASONS:
            return "failed", Outcome(
                EventPhase.FAILED,
                reason=str(waiting["reason"]),
                message=str(waiting.get("message") or ""),
            )
    if phase == "Succeeded":
        return "succeeded", None
    if phase == "Failed":
        if deleting:
            return "killed", None
        for container in containers:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated and terminated.get("exitCode", 0) != 0:
                return "failed", Outcome(
                    EventPhase.FAILED,
                    reason=str(terminated.get("reason") or "Error"),
                    exit_code=int(terminated["exitCode"]),
                    message=str(terminated.get("message") or ""),
                )
        return "failed", Outcome(
            EventPhase.FAILED,
            reason=str(status.get("reason") or "PodFailed"),
            message=str(status.get("message") or ""),
        )
    if phase == "Running" and not deleting:
        return "running", None
    return "pending", None


def _our_containers(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    statuses = list(status.get("containerStatuses") or [])
    ours = [s for s in statuses if s.get("name") == CONTAINER_NAME]
    return ours or statuses
