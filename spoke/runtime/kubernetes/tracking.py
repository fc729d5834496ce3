"""The workloads a KubernetesRuntime tracks, and what a change to their Jobs and pods means.

Changes become RuntimeEvents: RUNNING once all pods run, then exactly one terminal event per
(workload, epoch). A finished Job is annotated as reported, so a restarted spoke does not report
it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import structlog

from schemas import EventPhase
from spoke.errors import SpokeError
from spoke.kube import meta
from spoke.ports import EventSink, RuntimeEvent
from spoke.runtime.kubernetes.lease import start_time_of
from spoke.runtime.kubernetes.status import FATAL_WAITING_REASONS, Outcome, job_outcome, pod_state

log = structlog.get_logger(__name__)

_MAX_DONE_KEPT = 4096


@dataclass(slots=True)
class Tracked:
    """One (workload, epoch) and what the watch has seen of its Job and pods."""

    workload_id: str
    epoch: int
    namespace: str
    job_name: str
    nodes: int
    endpoint: str = ""  # a session's or service's URL (its Service), reported with RUNNING
    # Under the spoke's lease (lease.py): its Job's deadline moves on as the hub is heard.
    fenced: bool = False
    max_runtime_s: int | None = None
    started_at: float | None = None  # its Job's status.startTime, else when it was created
    deadline_s: int | None = None  # its Job's activeDeadlineSeconds as last set
    has_secret: bool = False  # a Secret of its secret env values, named as its Job
    seen: bool = False  # its Job was seen in the watch (so a relist without it means deleted)
    running_reported: bool = False
    done: bool = False
    stopping: bool = False
    failure: Outcome | None = None
    running_pods: set[str] = field(default_factory=set)
    succeeded_pods: set[str] = field(default_factory=set)
    ended: anyio.Event = field(default_factory=anyio.Event)

    @property
    def has_service(self) -> bool:
        """A session or service (its URL) and a gang (its ranks' names) have a Service."""
        return bool(self.endpoint) or self.nodes > 1


class TrackedJobs(Protocol):
    """What the Tracker asks of the cluster (`jobs.SpokeJobs` is the one used)."""

    def identity(self, obj: Mapping[str, Any]) -> tuple[str, int] | None:
        """(workload id, epoch) of one of our Jobs or pods; None for anything else."""
        ...

    async def mark_reported(self, tracked: Tracked, phase: EventPhase) -> None:
        """Annotate the finished Job as reported (idempotent); a failure is logged, not raised."""
        ...

    async def workload_pods(self, tracked: Tracked) -> list[Mapping[str, Any]]:
        """The pods of this (workload, epoch); empty when there are none."""
        ...

    async def delete_objects(self, tracked: Tracked, grace_s: float) -> None:
        """Delete its Job and pods (already gone: a no-op); returns before they are gone."""
        ...

    async def delete_secret(self, namespace: str, name: str) -> None:
        """Delete a Job's Secret (gone: a no-op); a failure is logged, not raised."""
        ...


class Tracker:
    """The tracked workloads (workload id -> its current epoch) and the events they report."""

    def __init__(self, jobs: TrackedJobs, sink: EventSink) -> None:
        self.workloads: dict[str, Tracked] = {}
        self._jobs = jobs
        self._sink = sink
        self._emit_lock: anyio.Lock | None = None

    def prepare(self) -> None:
        """Create what needs the running event loop; call it from there before anything else."""
        if self._emit_lock is None:
            self._emit_lock = anyio.Lock()

    def lookup(self, obj: Mapping[str, Any]) -> Tracked | None:
        """The tracked workload a Job or pod belongs to, if of its current epoch."""
        identity = self._jobs.identity(obj)
        if identity is None:
            return None
        tracked = self.workloads.get(identity[0])
        return tracked if tracked is not None and tracked.epoch == identity[1] else None

    async def report_running(self, tracked: Tracked) -> None:
        """Report RUNNING, once, unless the workload already ended."""
        assert self._emit_lock is not None
        async with self._emit_lock:
            if tracked.done or tracked.running_reported:
                return
            tracked.running_reported = True
            await self._send(tracked, Outcome(EventPhase.RUNNING))

    async def finish(self, tracked: Tracked, outcome: Outcome) -> None:
        """Report the one terminal event of (workload, epoch); later calls are no-ops."""
        assert self._emit_lock is not None
        async with self._emit_lock:
            if tracked.done:
                return
            tracked.done = True
            ran = outcome.phase is EventPhase.SUCCEEDED or outcome.exit_code is not None
            if ran and not tracked.running_reported:
                # It ran too briefly for the watch to see it running; say so, in order.
                tracked.running_reported = True
                await self._send(tracked, Outcome(EventPhase.RUNNING))
            await self._send(tracked, outcome)
            tracked.ended.set()
        if not tracked.stopping and outcome.reason != "JobDeleted":
            await self._jobs.mark_reported(tracked, outcome.phase)
        if tracked.has_secret:
            # No pod of it starts again: its secret values go now, not a day later with it.
            await self._jobs.delete_secret(tracked.namespace, tracked.job_name)
        self._forget_done()

    async def explain_failure(self, tracked: Tracked, outcome: Outcome) -> Outcome:
        """A failed Job says little (BackoffLimitExceeded); its pod says OOMKilled and 137."""
        if outcome.phase is not EventPhase.FAILED or outcome.reason == "DeadlineExceeded":
            return outcome
        if tracked.failure is not None:
            return tracked.failure
        try:
            pods = await self._jobs.workload_pods(tracked)
        except SpokeError as exc:
            log.warning("pod_failure_unknown", workload=tracked.workload_id, error=str(exc))
            return outcome
        for pod in pods:
            _, detail = pod_state(pod)
            if detail is not None:
                return detail
        return outcome

    # -- the watch (event loop side) --------------------------------------------------------

    async def on_change(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """Handle one change from the watch threads (see watch.OnChange); never raises."""
        try:
            if event_type == "RELISTED":
                items = [item for item in obj.get("items") or [] if self._jobs.identity(item)]
                for item in items:
                    await self.on_change(kind, "MODIFIED", item)
                if kind == "jobs":
                    await self._after_job_relist(items)
            elif kind == "jobs":
                await self._on_job(obj, deleted=event_type == "DELETED")
            elif event_type != "DELETED":
                await self._on_pod(obj)
        except Exception:
            log.exception("kubernetes_change_failed", kind=kind, event_type=event_type)

    async def _on_job(self, job: Mapping[str, Any], deleted: bool) -> None:
        tracked = self.lookup(job)
        if tracked is None:
            return
        tracked.seen = True
        if tracked.done or tracked.stopping:
            return
        started = start_time_of(job)
        if started is not None:
            tracked.started_at = started
        if deleted:
            await self.finish(
                tracked,
                Outcome(
                    EventPhase.FAILED,
                    reason="JobDeleted",
                    message="the Job was deleted outside gpufed",
                ),
            )
            return
        outcome = job_outcome(job)
        if outcome is not None:
            await self.finish(tracked, await self.explain_failure(tracked, outcome))

    async def _after_job_relist(self, items: list[Mapping[str, Any]]) -> None:
        """Jobs seen before but missing from a fresh list were deleted while we looked away."""
        present = {self._jobs.identity(item) for item in items}
        for tracked in list(self.workloads.values()):
            identity = (tracked.workload_id, tracked.epoch)
            if (
                tracked.seen
                and not tracked.done
                and not tracked.stopping
                and identity not in present
            ):
                await self.finish(
                    tracked,
                    Outcome(
                        EventPhase.FAILED,
                        reason="JobDeleted",
                        message="the Job was deleted outside gpufed",
                    ),
                )

    async def _on_pod(self, pod: Mapping[str, Any]) -> None:
        tracked = self.lookup(pod)
        if tracked is None or tracked.done or tracked.stopping:
            return
        state, outcome = pod_state(pod)
        name = str(meta(pod).get("name"))
        if outcome is not None:
            tracked.failure = outcome
            fatal = outcome.reason in FATAL_WAITING_REASONS
            # A pod that can never start is deleted below; no need to mark its Job reported.
            tracked.stopping = fatal
            await self.finish(tracked, outcome)
            if fatal:
                await self._jobs.delete_objects(tracked, 0)
            return
        if state == "running":
            tracked.running_pods.add(name)
            if len(tracked.running_pods) >= tracked.nodes:
                await self.report_running(tracked)
        elif state == "succeeded":
            tracked.succeeded_pods.add(name)
            if len(tracked.succeeded_pods) >= tracked.nodes:
                await self.finish(tracked, Outcome(EventPhase.SUCCEEDED, exit_code=0))

    # -- helpers ----------------------------------------------------------------------------

    async def _send(self, tracked: Tracked, outcome: Outcome) -> None:
        event = RuntimeEvent(
            workload_id=tracked.workload_id,
            epoch=tracked.epoch,
            phase=outcome.phase,
            exit_code=outcome.exit_code,
            reason=outcome.reason,
            message=outcome.message[:4096],
            endpoint=tracked.endpoint if outcome.phase is EventPhase.RUNNING else "",
        )
        log.info(
            "workload_phase_observed",
            workload=tracked.workload_id,
            epoch=tracked.epoch,
            phase=outcome.phase.value,
            reason=outcome.reason,
            exit_code=outcome.exit_code,
        )
        try:
            await self._sink(event)
        except Exception:
            log.exception("event_sink_failed", workload=tracked.workload_id, phase=outcome.phase)

    def _forget_done(self) -> None:
        done = [key for key, t in self.workloads.items() if t.done]
        for key in done[: max(0, len(done) - _MAX_DONE_KEPT)]:
            del self.workloads[key]
