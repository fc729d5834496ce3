"""What a Slurm job state means for the workload: a phase, a reason, an exit code.

Pure functions of the states `squeue` and `scontrol show job` print.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import EventPhase
from spoke.runtime.processes import end_reason
from spoke.slurm.parse import ACTIVE_STATES

#: States in which the job's processes run.
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})
#: Reasons a pending job waits for that never go away by themselves: the job is cancelled and
#: reported failed, so it does not wait forever for a GPU the hub already counts as used.
FATAL_PENDING_REASONS = frozenset(
    {
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "AccountNotAllowed",
        "QOSNotAllowed",
        "PartitionNodeLimit",
        "DependencyNeverSatisfied",
        # The pinned node is down, drained or reserved: "ReqNodeNotAvail, UnavailableNodes:n2".
        "ReqNodeNotAvail",
    }
)
#: Terminal states other than COMPLETED and what gpufed calls them.
_FAILED_REASONS = {
    "TIMEOUT": "max_runtime_exceeded",
    "OUT_OF_MEMORY": "out_of_memory",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "boot_fail",
    "DEADLINE": "deadline",
    "CANCELLED": "cancelled_outside_gpufed",
    "REVOKED": "revoked",
    "SPECIAL_EXIT": "special_exit",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """A phase to report for a workload, with why."""

    phase: EventPhase
    reason: str = ""
    exit_code: int | None = None
    message: str = ""


def is_active(state: str) -> bool:
    """Does a job in `state` still hold or wait for its nodes?"""
    return state in ACTIVE_STATES


def hopeless(pending_reason: str) -> bool:
    """Will a job pending for this reason never start by itself?"""
    return pending_reason.split(",", 1)[0].strip() in FATAL_PENDING_REASONS


def final_outcome(state: str, exit_code: int | None, slurm_reason: str = "") -> Outcome:
    """The outcome of a job that reached the terminal `state` (not stopped by gpufed)."""
    if state == "COMPLETED" and (exit_code is None or exit_code == 0):
        return Outcome(EventPhase.SUCCEEDED, exit_code=0, message="job completed")
    if state == "PREEMPTED":
        return Outcome(
            EventPhase.PREEMPTED,
            reason="slurm_preempted",
            exit_code=exit_code,
            message="Slurm preempted the job",
        )
    reason = _FAILED_REASONS.get(state) or end_reason(
        exit_code
    )  # named as the local runtime names them
    detail = f"job {state.lower()}"
    if slurm_reason and slurm_reason != "None":
        detail += f" ({slurm_reason})"
    return Outcome(EventPhase.FAILED, reason=reason, exit_code=exit_code, message=detail)
