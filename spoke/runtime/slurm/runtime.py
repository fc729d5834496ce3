"""Workloads as Slurm batch jobs, one per (workload, epoch): the runtime itself.

A placed workload becomes one `sbatch` job pinned to the hub's nodes (jobs.py). One poll task
reads this user's queue (`squeue`) every `poll_s` and turns what changed into RuntimeEvents:
RUNNING once the job runs, then exactly one terminal event, with the exit code from
`scontrol show job` or, once the controller has forgotten the job, from the file its batch shell
wrote. A stop signals the job's tasks (SIGTERM), waits out the grace and then kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import structlog

from schemas import EventPhase, RuntimeCapabilities, WorkloadKind
from spoke.errors import PermanentSpokeError, SpokeError
from spoke.fencing import Guard
from spoke.journal import FINISHED_KEPT
from spoke.ports import EventSink, Launch, RuntimeEvent
from spoke.runtime.leftovers import Leftovers, log_name
from spoke.runtime.processes import end_reason
from spoke.runtime.retention import Keep
from spoke.runtime.slurm.jobs import SiteOptions, build_batch_job
from spoke.runtime.slurm.lease import LeaseFile
from spoke.runtime.slurm.record import JobRecord, Submitted
from spoke.runtime.slurm.status import (
    RUNNING_STATES,
    Outcome,
    final_outcome,
    hopeless,
    is_active,
)
from spoke.slurm.commands import SlurmCli
from spoke.slurm.parse import QueuedJob, job_identity

log = structlog.get_logger(__name__)

#: After the kill, how long a stop waits for Slurm to end the job before it returns anyway.
KILL_WAIT_S = 60.0


@dataclass(slots=True, eq=False)
class _Job:
    """One (workload, epoch) and what the polls have seen of its job."""

    workload_id: str
    epoch: int
    job_id: str
    state: str = "PENDING"
    running_reported: bool = False
    done: bool = False
    stop_phase: EventPhase | None = None
    stop_reason: str = ""
    stop_message: str = ""
    forced: Outcome | None = None  # an outcome gpufed decided (a job that can never start)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class SlurmRuntime:
    """Runs each placed workload as a Slurm batch job and reports what Slurm does with it.

    `log_dir` and `run_dir` (default `<log_dir>/../runs`) must be on a filesystem the compute
    nodes share with the spoke's host: the job writes its output and exit status there.
    """

    def __init__(
        self,
        cli: SlurmCli,
        sink: EventSink,
        spoke_id: str,
        log_dir: Path,
        run_dir: Path | None = None,
        site: SiteOptions | None = None,
        poll_s: float = 1.0,
        keep: Keep | None = None,
        guard: Guard | None = None,
    ) -> None:
        self._cli = cli
        self._sink = sink
        self.spoke_id = spoke_id
        self.log_dir = log_dir
        self.run_dir = run_dir or log_dir.parent / "runs"
        self._site = site or SiteOptions()
        self._poll_s = poll_s
        self._jobs: dict[str, _Job] = {}
        self._done: dict[str, None] = {}  # workloads whose last job ended, oldest first
        # An ended job's log is kept by `keep`, then removed (spoke.runtime.retention).
        self.leftovers = Leftovers(keep or Keep(), log_dir, None, None, self.running)
        self._record = JobRecord(self.run_dir / "slurm-jobs.jsonl")
        self._poller: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # Fenced jobs stop themselves once the lease runs out, even with the spoke gone (lease.py).
        self._lease = LeaseFile(guard, self.run_dir) if guard is not None else None

    # -- the Runtime port -------------------------------------------------------------------

    async def start(self, launch: Launch) -> None:
        """Submit the workload's job; returns once Slurm has accepted it (not when it runs).

        Idempotent per (workload_id, epoch). A newer epoch first ends the older epoch's job
        (reported CANCELLED, reason stale_epoch). Raises PermanentSpokeError for what Slurm
        cannot run (fractional GPUs, reserved variables) or refuses (sbatch's message), and
        RetryableSpokeError when the controller cannot be reached.
        """
        known = self._jobs.get(launch.workload_id)
        if known is not None and known.epoch == launch.epoch:
            return
        if known is not None and known.epoch > launch.epoch and not known.done:
            raise PermanentSpokeError(
                f"workload {launch.workload_id}: epoch {launch.epoch} is older than the running "
                f"epoch {known.epoch}"
            )
        if known is not None and not known.done:
            await self._stop(
                known, 0.0, EventPhase.CANCELLED, "stale_epoch", f"replaced by epoch {launch.epoch}"
            )
        exit_path = self._exit_path(launch.workload_id, launch.epoch)
        fenced_path = self._fenced_path(launch.workload_id, launch.epoch)
        lease = None
        if self._lease is not None and launch.spec.fenced:
            lease = self._lease.job(fenced_path)
        job = build_batch_job(
            launch,
            spoke_id=self.spoke_id,
            log_path=self.log_path(launch.workload_id, launch.epoch),
            exit_path=exit_path,
            workdir=self.run_dir,
            site=self._site,
            base_environment=self._cli.environment,
            lease=lease,
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        exit_path.unlink(missing_ok=True)
        fenced_path.unlink(missing_ok=True)
        job_id = await self._cli.submit(job.options, job.script, job.environment)
        self._jobs[launch.workload_id] = _Job(launch.workload_id, launch.epoch, job_id)
        self._done.pop(launch.workload_id, None)
        self.leftovers.started(launch.workload_id)
        self._record.submitted(Submitted(launch.workload_id, launch.epoch, job_id))
        log.info(
            "slurm_job_submitted",
            workload=launch.workload_id,
            epoch=launch.epoch,
            job=job_id,
            nodes=[a.node for a in launch.assignments],
        )
        self._ensure_polling()

    async def stop(self, workload_id: str, grace_s: float, phase: EventPhase) -> None:
        """Send SIGTERM to the job's tasks, kill the job after `grace_s`, report `phase`.

        A job still pending is cancelled at once. Idempotent; an unknown or finished workload
        is a no-op. Returns once Slurm has ended the job (at most grace_s + KILL_WAIT_S); on a
        Slurm error nothing is reported and the error is raised, so the caller can retry.
        """
        tracked = self._jobs.get(workload_id)
        if tracked is None or tracked.done:
            return
        await self._stop(tracked, grace_s, phase, "", f"stopped by gpufed ({phase.value})")

    async def adopt(self) -> dict[str, int]:
        """Find this spoke's jobs by their comment and watch them again.

        Returns workload id -> epoch of those still active. Jobs that ended while the spoke was
        away are reported now (once: the record says which ends were reported); a job of an
        older epoch than another job of the same workload is cancelled.
        """
        submitted = {(s.workload_id, s.epoch): s for s in self._record.replay()}
        found: dict[str, dict[int, QueuedJob]] = {}
        for queued in await self._cli.queue():
            identity = job_identity(queued.comment)
            if identity is not None and identity.spoke_id == self.spoke_id:
                found.setdefault(identity.workload_id, {})[identity.epoch] = queued
        newest: dict[str, int] = {}
        for workload_id, epoch in [
            *submitted,
            *((w, e) for w, rows in found.items() for e in rows),
        ]:
            newest[workload_id] = max(epoch, newest.get(workload_id, epoch))
        running: dict[str, int] = {}
        for workload_id, epoch in newest.items():
            rows = found.get(workload_id, {})
            for old_epoch, old in rows.items():
                if old_epoch < epoch and is_active(old.state):
                    log.warning("slurm_stale_job_cancelled", workload=workload_id, job=old.job_id)
                    await self._cli.cancel(old.job_id)
            for old_workload, old_epoch in list(submitted):
                if old_workload == workload_id and old_epoch < epoch:
                    self._record.ended(workload_id, old_epoch)  # superseded: the hub moved on
            row = rows.get(epoch)
            if row is None:
                # Slurm no longer knows the job (it ended past MinJobAge): its exit file tells.
                tracked = _Job(workload_id, epoch, submitted[workload_id, epoch].job_id, "UNKNOWN")
                self._jobs[workload_id] = tracked
                await self._observe(tracked, None)
                continue
            if not is_active(row.state) and (workload_id, epoch) not in submitted:
                continue  # ended, and its end was reported before
            tracked = _Job(workload_id, epoch, row.job_id, row.state)
            self._jobs[workload_id] = tracked
            if (workload_id, epoch) not in submitted:  # submitted just before a crash
                self._record.submitted(Submitted(workload_id, epoch, row.job_id))
            if is_active(row.state):
                running[workload_id] = epoch
                log.info("slurm_job_adopted", workload=workload_id, epoch=epoch, job=row.job_id)
            else:
                await self._observe(tracked, row)
        self._ensure_polling()
        self.leftovers.watch()
        log.info("slurm_jobs_adopted", running=len(running))
        return running

    def capabilities(self) -> RuntimeCapabilities:
        """Whole GPUs and gangs (one job across its nodes); never fractional GPUs, and only
        jobs: a batch job exposes no port for a session or service."""
        return RuntimeCapabilities(fractions=False, kinds=(WorkloadKind.JOB,))

    def running(self) -> dict[str, int]:
        """Workloads started and not yet ended: workload id -> epoch."""
        return {t.workload_id: t.epoch for t in self._jobs.values() if not t.done}

    async def close(self) -> None:
        """Stop polling; the jobs run on and a restarted spoke adopts them."""
        await self.leftovers.close()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        self._record.close()

    # -- beyond the port --------------------------------------------------------------------

    def log_path(self, workload_id: str, epoch: int) -> Path:
        """Where the job's output (every node's stdout and stderr) goes."""
        return self.log_dir / log_name(workload_id, epoch)

    def job_id(self, workload_id: str) -> str | None:
        """The Slurm job id of a workload's current epoch, if known."""
        tracked = self._jobs.get(workload_id)
        return None if tracked is None else tracked.job_id

    async def poll(self) -> None:
        """Read the queue once and report what changed (the poll task calls it every poll_s)."""
        active = [t for t in self._jobs.values() if not t.done]
        if not active:
            return
        if self._lease is not None:
            self._lease.refresh()
        rows = {row.job_id: row for row in await self._cli.queue()}
        for tracked in active:
            if not tracked.done:
                await self._observe(tracked, rows.get(tracked.job_id))

    # -- helpers ----------------------------------------------------------------------------

    async def _stop(
        self, tracked: _Job, grace_s: float, phase: EventPhase, reason: str, message: str
    ) -> None:
        first = tracked.stop_phase is None
        if first:
            tracked.stop_phase, tracked.stop_reason, tracked.stop_message = phase, reason, message
        try:
            if first and tracked.state == "PENDING":
                # It may have started since the last poll: a running job gets its grace.
                detail = await self._cli.job(tracked.job_id)
                if detail is not None and detail.state != "PENDING":
                    tracked.state = detail.state
            if first and tracked.state != "PENDING" and grace_s > 0:
                await self._cli.cancel(tracked.job_id, signal="TERM")
            elif first:
                await self._kill(tracked)
            self._ensure_polling()
            with anyio.move_on_after(grace_s):
                await tracked.ended.wait()
            if not tracked.done:
                await self._kill(tracked)
                with anyio.move_on_after(KILL_WAIT_S):
                    await tracked.ended.wait()
        except SpokeError:
            if first and not tracked.done:
                tracked.stop_phase = None
            raise
        if not tracked.done:
            log.warning("slurm_job_not_ended", workload=tracked.workload_id, job=tracked.job_id)

    async def _kill(self, tracked: _Job) -> None:
        if tracked.state != "PENDING":
            # SIGKILL to every process of the job, batch shell included, then end the job.
            await self._cli.cancel(tracked.job_id, signal="KILL", full=True)
        await self._cli.cancel(tracked.job_id)
        self._wake.set()

    async def _observe(self, tracked: _Job, row: QueuedJob | None) -> None:
        """Act on what the queue says of a tracked job (None: the queue no longer has it)."""
        if row is not None and is_active(row.state):
            tracked.state = row.state
            if row.state in RUNNING_STATES:
                await self._report_running(tracked)
            elif (
                row.state == "PENDING"
                and hopeless(row.reason)
                and tracked.forced is None
                and tracked.stop_phase is None
            ):
                tracked.forced = Outcome(
                    EventPhase.FAILED,
                    reason="unschedulable",
                    message=f"Slurm cannot start the job: {row.reason}",
                )
                log.warning("slurm_job_unschedulable", job=tracked.job_id, reason=row.reason)
                await self._cli.cancel(tracked.job_id)
            return
        detail = await self._cli.job(tracked.job_id)
        if detail is not None and is_active(detail.state):
            return  # the queue and the controller disagree for a moment; look again later
        state = detail.state if detail is not None else (row.state if row else "UNKNOWN")
        if detail is None:
            exit_code = self._exit_file_code(tracked)
        else:  # a job that never got nodes never ran: its "0:0" is no exit code
            exit_code = detail.exit_code if detail.nodes else None
        slurm_reason = detail.reason if detail is not None else ""
        if tracked.stop_phase is not None:
            outcome = Outcome(
                tracked.stop_phase, tracked.stop_reason, exit_code, tracked.stop_message
            )
        elif tracked.forced is not None:
            outcome = tracked.forced
        elif self._fenced_path(tracked.workload_id, tracked.epoch).exists():
            outcome = Outcome(
                EventPhase.PREEMPTED,
                "fenced",
                exit_code,
                "stopped by its lease: the spoke had not heard the hub for fence_after",
            )
        elif state == "UNKNOWN":
            outcome = Outcome(
                EventPhase.FAILED if exit_code != 0 else EventPhase.SUCCEEDED,
                reason=end_reason(exit_code) if exit_code != 0 else "",
                exit_code=exit_code,
                message="Slurm no longer knows the job; "
                + ("its exit status file says" if exit_code is not None else "no exit status"),
            )
        else:
            outcome = final_outcome(state, exit_code, slurm_reason)
        await self._finish(tracked, outcome)

    def _exit_file_code(self, tracked: _Job) -> int | None:
        try:
            return int(self._exit_path(tracked.workload_id, tracked.epoch).read_text().strip())
        except (OSError, ValueError):
            return None

    async def _report_running(self, tracked: _Job) -> None:
        if tracked.running_reported or tracked.done:
            return
        tracked.running_reported = True
        await self._send(tracked, Outcome(EventPhase.RUNNING))

    async def _finish(self, tracked: _Job, outcome: Outcome) -> None:
        if tracked.done:
            return
        tracked.done = True
        ran = outcome.phase is EventPhase.SUCCEEDED or outcome.exit_code is not None
        if ran and not tracked.running_reported:
            tracked.running_reported = True  # it ran between two polls; say so, in order
            await self._send(tracked, Outcome(EventPhase.RUNNING))
        log_path = self.log_path(tracked.workload_id, tracked.epoch)
        message = f"{outcome.message}; Slurm job {tracked.job_id}; log {log_path}".lstrip("; ")
        await self._send(
            tracked, Outcome(outcome.phase, outcome.reason, outcome.exit_code, message)
        )
        self._record.ended(tracked.workload_id, tracked.epoch)
        self._exit_path(tracked.workload_id, tracked.epoch).unlink(missing_ok=True)
        self._fenced_path(tracked.workload_id, tracked.epoch).unlink(missing_ok=True)
        tracked.ended.set()
        self.leftovers.ended(tracked.workload_id, tracked.epoch)
        self._forget_done(tracked.workload_id)

    def _forget_done(self, workload_id: str) -> None:
        """Keep the last FINISHED_KEPT ended jobs, as the agent keeps their epochs: a spoke
        running jobs for months otherwise held every job it ever submitted."""
        self._done[workload_id] = None
        while len(self._done) > FINISHED_KEPT:
            old = next(iter(self._done))
            del self._done[old]
            tracked = self._jobs.get(old)
            if tracked is not None and tracked.done:
                del self._jobs[old]

    async def _send(self, tracked: _Job, outcome: Outcome) -> None:
        log.info(
            "slurm_job_phase",
            workload=tracked.workload_id,
            epoch=tracked.epoch,
            job=tracked.job_id,
            phase=outcome.phase.value,
            reason=outcome.reason,
            exit_code=outcome.exit_code,
        )
        event = RuntimeEvent(
            tracked.workload_id,
            tracked.epoch,
            outcome.phase,
            exit_code=outcome.exit_code,
            reason=outcome.reason,
            message=outcome.message[:4096],
        )
        try:
            await self._sink(event)
        except Exception:
            log.exception("event_sink_failed", workload=tracked.workload_id)

    def _ensure_polling(self) -> None:
        self._wake.set()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_loop(), name="slurm-poll")

    async def _poll_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.poll()
            except SpokeError as exc:  # the controller is away: the next poll may work
                log.warning("slurm_poll_failed", error=str(exc))
            except Exception:  # a bug must not end the polling of every other job
                log.exception("slurm_poll_crashed")
            with anyio.move_on_after(self._poll_s):
                await self._wake.wait()
            await anyio.sleep(min(0.05, self._poll_s))  # coalesce wake-ups

    def _exit_path(self, workload_id: str, epoch: int) -> Path:
        return self.run_dir / f"{workload_id}-e{epoch}.exit"

    def _fenced_path(self, workload_id: str, epoch: int) -> Path:
        """Where a fenced job's watcher notes that the lease stopped it (lease.py)."""
        return self.run_dir / f"{workload_id}-e{epoch}.fenced"
