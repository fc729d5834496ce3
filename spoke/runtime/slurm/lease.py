"""A fenced Slurm job stops itself once its spoke's lease runs out, spoke or no spoke.

A spoke stops its movable work once it has not heard the hub for fence_after (`spoke.fencing`),
before the hub, after lost_after, runs that work elsewhere. A spoke process that stays dead
(stopped for good, crashed and not brought back, failing at every start) stops nothing, and
Slurm runs its jobs on beside the hub's copies. So the Slurm runtime keeps the lease's deadline
(heard_at + fence_after, whole unix seconds) in `runs/lease-deadline`, on the filesystem the
compute nodes share, written again whenever it moves (at every poll while jobs run). Each
fenced job's batch script runs a watcher beside its `srun` that reads it every CHECK_S: once the
node's clock is past the deadline, it notes `<workload>-e<epoch>.fenced`, sends SIGTERM to the
`srun` (which passes it to every task) and, after the stop grace, ends the whole job. A spoke that
comes back reports the job preempted, reason `fenced` (no restart counted). While the spoke
lives it stops the job by the same rule at the same moment. The nodes' clocks must agree with
the spoke host's (NTP) to well within the margin between fence_after and lost_after (the stop
grace and three heartbeats).
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import structlog

from spoke.fencing import STOPPED_WITHOUT_SPOKE, Guard

log = structlog.get_logger(__name__)

#: The deadline's file in the runtime's run folder.
DEADLINE_FILE = "lease-deadline"
#: How often a fenced job's watcher reads the deadline, in seconds.
CHECK_S = 1


@dataclass(frozen=True, slots=True)
class JobLease:
    """What a fenced job's watcher needs: the deadline's file, the file it notes a fence in,
    and the stop grace."""

    deadline_path: Path
    fenced_path: Path
    grace_s: float

    def watcher(self) -> list[str]:
        """Lines of the batch script, after `srun ... &` (its pid in $task): a watcher in
        the background (its pid in $watcher) that applies the lease to the job."""
        deadline, fenced = shlex.quote(str(self.deadline_path)), shlex.quote(str(self.fenced_path))
        grace = max(1, math.ceil(self.grace_s))
        return [
            "task=$!",
            "# fenced: stopped once the spoke's lease runs out (spoke.runtime.slurm.lease)",
            "(",
            '  while kill -0 "$task" 2>/dev/null; do',
            f"    sleep {CHECK_S}",
            f"    deadline=$(cat {deadline} 2>/dev/null)",
            "    case \"$deadline\" in ''|*[!0-9]*) continue ;; esac",
            '    [ "$(date +%s)" -gt "$deadline" ] || continue',
            f"    date +%s > {fenced}",
            f'    echo "{STOPPED_WITHOUT_SPOKE}" >&2',
            '    kill -TERM "$task" 2>/dev/null',
            f'    waited=0; while kill -0 "$task" 2>/dev/null && [ "$waited" -lt {grace} ]; do',
            "      sleep 1; waited=$((waited + 1))",
            "    done",
            '    kill -0 "$task" 2>/dev/null || exit 0',
            '    scancel --signal=KILL --full "$SLURM_JOB_ID" 2>/dev/null || kill -KILL "$task"',
            "    exit 0",
            "  done",
            ") &",
            "watcher=$!",
            'wait "$task"',
            "code=$?",
            'kill "$watcher" 2>/dev/null',
        ]


class LeaseFile:
    """The runtime's side: the deadline's file, written from the spoke's fence state."""

    def __init__(self, guard: Guard, run_dir: Path) -> None:
        self.guard = guard
        self.path = run_dir / DEADLINE_FILE
        self._written: int | None = None

    def job(self, fenced_path: Path) -> JobLease:
        """The lease of a job about to start, with the deadline written first."""
        self.refresh()
        return JobLease(self.path, fenced_path, self.guard.stop_grace_s)

    def refresh(self) -> None:
        """Write the deadline if it moved (the spoke heard the hub since, or its lost_after
        changed); none while the hub was never heard (nothing to fence yet)."""
        deadline = self.guard.read().deadline()
        if deadline is None:
            return
        whole = math.floor(deadline)  # a second early at most: the safe side
        if whole == self._written:
            return
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(f"{whole}\n")
            os.replace(tmp, self.path)
        except OSError as exc:  # the jobs keep the deadline before: they stop early, not late
            log.warning("lease_deadline_not_written", path=str(self.path), error=str(exc))
            return
        self._written = whole
