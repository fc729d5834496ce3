"""Workloads as Kubernetes batch/v1 Jobs, one per (workload, epoch): the runtime itself.

The Job lives in the team's namespace (`<prefix><team>`, created on first use), is pinned to the
assigned node(s) by node affinity, requests `nvidia.com/gpu` (or a MIG resource) as a limit and
carries the labels of the contract in spoke.kube (manifests.py). A gang of N nodes is one Indexed
Job whose pods start independently, so true all-or-nothing co-scheduling needs Kueue or JobSet on
top. Watch threads (watch.py) feed Job and pod changes to the Tracker (tracking.py), which turns
them into RuntimeEvents; the API calls live in jobs.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import anyio
import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from schemas import EventPhase, RuntimeCapabilities
from spoke.errors import PermanentSpokeError, SpokeError
from spoke.fencing import Guard
from spoke.kube import ANNOTATION_REPORTED, annotations_of, label_value, meta
from spoke.ports import EventSink, Launch
from spoke.runtime.kubernetes.jobs import SpokeJobs
from spoke.runtime.kubernetes.keeper import DeadlineKeeper
from spoke.runtime.kubernetes.manifests import (
    DEFAULT_PRIORITY_CLASSES,
    build_env_secret,
    build_job,
    build_service,
    endpoint_for,
    job_name_for,
)
from spoke.runtime.kubernetes.status import Outcome, job_outcome
from spoke.runtime.kubernetes.tracking import Tracked, Tracker
from spoke.runtime.kubernetes.watch import Watcher

log = structlog.get_logger(__name__)

STOP_WAIT_MARGIN_S = 30.0


class KubernetesRuntime:
    """Runs each placed workload as a batch/v1 Job and reports what its pods do.

    `priority_class_map` maps gpufed priority classes to Kubernetes PriorityClass names
    (default: "production" -> "gpufed-production" etc., shipped in deploy/base/spoke); a class
    missing from the map runs with the cluster's default priority. With `guard` (the spoke's
    fence rule), fenced Jobs carry the spoke's lease as their deadline (lease.py).
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        sink: EventSink,
        spoke_id: str,
        default_image: str = "busybox:1.36",
        namespace_prefix: str = "gpufed-",
        priority_class_map: Mapping[str, str] | None = None,
        guard: Guard | None = None,
    ) -> None:
        batch = k8s.BatchV1Api(api_client)
        core = k8s.CoreV1Api(api_client)
        self._spoke_id = spoke_id
        self._spoke_label = label_value(spoke_id)
        self._default_image = default_image
        self._priority_classes = dict(
            DEFAULT_PRIORITY_CLASSES if priority_class_map is None else priority_class_map
        )
        networking = k8s.NetworkingV1Api(api_client)
        self._jobs = SpokeJobs(batch, core, self._spoke_label, namespace_prefix, networking)
        self._tracker = Tracker(self._jobs, sink)
        self._watcher = Watcher(batch, core, self._jobs.selector, self._tracker.on_change)
        self._keeper = (
            None
            if guard is None
            else DeadlineKeeper(guard, self._jobs, lambda: self._tracker.workloads.values())
        )
        self._lease_keeper: asyncio.Task[None] | None = None

    # -- the Runtime port -------------------------------------------------------------------

    async def start(self, launch: Launch) -> None:
        """Create the workload's Job; returns once the API server has stored it.

        Idempotent per (workload_id, epoch): a known one, or a Job of that epoch already in the
        cluster, is taken as started. A newer epoch first fences the older one's Job. Raises
        PermanentSpokeError for what Kubernetes cannot run (fractional GPUs, mixed resources)
        and for API refusals; RetryableSpokeError when the API is unavailable.
        """
        self._prepare()
        known = self._tracker.workloads.get(launch.workload_id)
        if known is not None and known.epoch == launch.epoch:
            return
        if known is not None and known.epoch > launch.epoch and not known.done:
            raise PermanentSpokeError(
                f"workload {launch.workload_id}: epoch {launch.epoch} is older than the running "
                f"epoch {known.epoch}"
            )
        if known is not None and not known.done:
            await self.fence(launch.workload_id, launch.epoch)
        namespace = self.namespace_for(launch.spec.team)
        job_name = job_name_for(launch.workload_id, launch.epoch)
        created_at = time.time()
        lease = None if self._keeper is None else self._keeper.job_lease(launch, created_at)
        manifest = build_job(
            launch,
            namespace=namespace,
            job_name=job_name,
            spoke_label=self._spoke_label,
            image=launch.spec.image or self._default_image,
            priority_class=self._priority_class(launch.spec.priority_class),
            lease=lease,
        )
        secret = build_env_secret(launch, namespace=namespace, job_name=job_name)
        await self._jobs.ensure_namespace(namespace, launch.spec.team)
        tracked = Tracked(
            workload_id=launch.workload_id,
            epoch=launch.epoch,
            namespace=namespace,
            job_name=job_name,
            nodes=launch.spec.nodes,
            endpoint=(
                endpoint_for(namespace, job_name, launch.spec.nodes)
                if launch.spec.kind.exposes_port
                else ""
            ),
            fenced=lease is not None,
            max_runtime_s=launch.spec.max_runtime_s,
            started_at=created_at,  # a moment before its startTime, until the watch sees that
            deadline_s=manifest["spec"].get("activeDeadlineSeconds"),
            has_secret=secret is not None,
        )
        # Registered before the create so that no watch event of the new Job goes unheard.
        self._tracker.workloads[launch.workload_id] = tracked
        try:
            if secret is not None:  # first: a pod started without it could not start
                await self._jobs.create_secret(namespace, secret)
            try:
                created = await self._jobs.create_job(namespace, job_name, manifest)
            except SpokeError:
                if secret is not None:
                    await self._jobs.delete_secret(namespace, job_name)
                raise
            uid = meta(created).get("uid") if created is not None else None
            if secret is not None and uid:
                await self._jobs.own_secret(namespace, job_name, uid)
            if created is None:
                await self._take_over_existing(tracked)
            if tracked.has_service:
                service = build_service(launch, namespace=namespace, job_name=job_name, job_uid=uid)
                await self._jobs.create_service(namespace, service)
        except SpokeError as exc:
            if self._tracker.workloads.get(launch.workload_id) is tracked:
                del self._tracker.workloads[launch.workload_id]
            cause = exc.__cause__
            if isinstance(cause, ApiException) and cause.status == 404 and "namespace" in str(exc):
                raise PermanentSpokeError(
                    f"{exc}. Namespace {namespace} is missing and the spoke could not create it: "
                    "create it, or allow the spoke to create namespaces (deploy/base/spoke)."
                ) from exc
            raise
        self._watcher.ensure_running()
        log.info(
            "workload_job_created",
            workload=launch.workload_id,
            epoch=launch.epoch,
            namespace=namespace,
            job=job_name,
            nodes=[a.node for a in launch.assignments],
        )

    async def stop(self, workload_id: str, grace_s: float, phase: EventPhase) -> None:
        """Delete the workload's Job and pods (pods get `grace_s` to exit), wait until the pods
        are gone (at most grace_s + 30 s), then report `phase`.

        Idempotent; an unknown or finished workload is a no-op. On an API error nothing is
        reported and the error is raised, so the caller can retry.
        """
        self._prepare()
        tracked = self._tracker.workloads.get(workload_id)
        if tracked is None or tracked.done:
            return
        if tracked.stopping:
            await self._wait_done(tracked, grace_s + STOP_WAIT_MARGIN_S)
            return
        tracked.stopping = True
        try:
            await self._jobs.delete_objects(tracked, grace_s)
            await self._jobs.wait_pods_gone(tracked, grace_s + STOP_WAIT_MARGIN_S)
        except SpokeError:
            tracked.stopping = False
            raise
        await self._tracker.finish(
            tracked, Outcome(phase, message=f"Job deleted by the spoke ({phase.value})")
        )

    async def adopt(self) -> dict[str, int]:
        """Take over this spoke's Jobs left by a previous process; start watching.

        Returns workload id -> epoch of the unfinished ones. Finished ones not yet reported are
        reported now (and marked, so a later restart does not report them again); Jobs of an
        older epoch than another Job of the same workload are deleted.
        """
        self._prepare()
        newest: dict[str, tuple[int, Mapping[str, Any]]] = {}
        for job in await self._jobs.list_jobs():
            identity = self._jobs.identity(job)
            if identity is None:
                continue
            workload_id, epoch = identity
            previous = newest.get(workload_id)
            if previous is not None and previous[0] > epoch:
                await self._jobs.delete_stale(job, workload_id, epoch)
                continue
            if previous is not None:
                await self._jobs.delete_stale(previous[1], workload_id, previous[0])
            newest[workload_id] = (epoch, job)
        running: dict[str, int] = {}
        for workload_id, (epoch, job) in newest.items():
            if annotations_of(job).get(ANNOTATION_REPORTED) or meta(job).get("deletionTimestamp"):
                continue
            tracked = self._jobs.tracked_from_job(job, workload_id, epoch)
            tracked.seen = True
            self._tracker.workloads[workload_id] = tracked
            outcome = job_outcome(job)
            if outcome is None:
                running[workload_id] = epoch
            else:
                await self._tracker.finish(
                    tracked, await self._tracker.explain_failure(tracked, outcome)
                )
        self._watcher.ensure_running()
        log.info("workloads_adopted", running=len(running), jobs=len(newest))
        return running

    def capabilities(self) -> RuntimeCapabilities:
        """Whole GPUs, gangs (one pod per node) and MIG slices; never fractional GPUs."""
        return RuntimeCapabilities(fractions=False)

    def running(self) -> dict[str, int]:
        """Workloads started and not yet ended: workload id -> epoch."""
        return {t.workload_id: t.epoch for t in self._tracker.workloads.values() if not t.done}

    async def close(self) -> None:
        """Stop the watch threads and the deadlines' keeper; the Jobs keep running (until
        their deadlines, the fenced ones) and a new process adopts them."""
        if self._lease_keeper is not None:
            self._lease_keeper.cancel()
            await asyncio.gather(self._lease_keeper, return_exceptions=True)
            self._lease_keeper = None
        await self._watcher.close()

    # -- beyond the port --------------------------------------------------------------------

    async def fence(self, workload_id: str, current_epoch: int) -> int:
        """Delete this spoke's Jobs of `workload_id` with an epoch older than `current_epoch`.

        A tracked older epoch is reported CANCELLED (reason StaleEpoch). Returns how many Jobs
        were deleted; idempotent.
        """
        self._prepare()
        tracked = self._tracker.workloads.get(workload_id)
        stale = tracked is not None and tracked.epoch < current_epoch and not tracked.done
        if tracked is not None and stale:
            tracked.stopping = True  # its Job's deletion below is not a failure to report
        try:
            deleted = 0
            for job in await self._jobs.list_jobs():
                identity = self._jobs.identity(job)
                if identity and identity[0] == workload_id and identity[1] < current_epoch:
                    await self._jobs.delete_stale(job, workload_id, identity[1])
                    deleted += 1
        except SpokeError:
            if tracked is not None and stale:
                tracked.stopping = False
            raise
        if tracked is not None and stale:
            await self._tracker.finish(
                tracked,
                Outcome(
                    EventPhase.CANCELLED,
                    reason="StaleEpoch",
                    message=f"replaced by epoch {current_epoch}",
                ),
            )
        return deleted

    def namespace_for(self, team: str) -> str:
        """The namespace a team's Jobs run in."""
        return self._jobs.namespace_for(team)

    # -- helpers ----------------------------------------------------------------------------

    def _prepare(self) -> None:
        self._tracker.prepare()
        self._watcher.prepare()
        if self._keeper is not None and self._lease_keeper is None:
            self._lease_keeper = asyncio.create_task(self._keeper.run(), name="k8s-leases")

    def _priority_class(self, name: str) -> str | None:
        mapped = self._priority_classes.get(name)
        if mapped is None:
            log.warning("priority_class_unmapped", priority_class=name)
        return mapped

    async def _take_over_existing(self, tracked: Tracked) -> None:
        """The create met a Job of the same name: ours of this epoch, or someone else's."""
        job = await self._jobs.read_job(tracked)
        if self._jobs.identity(job) != (tracked.workload_id, tracked.epoch):
            raise PermanentSpokeError(
                f"a Job {tracked.namespace}/{tracked.job_name} exists that gpufed spoke "
                f"{self._spoke_id} did not create for workload {tracked.workload_id}"
            )
        tracked.seen = True
        # Its deadline is the one to move on (an earlier process set it), from its own start.
        found = self._jobs.tracked_from_job(job, tracked.workload_id, tracked.epoch)
        tracked.deadline_s = found.deadline_s
        tracked.started_at = found.started_at or tracked.started_at
        log.info("workload_job_exists", workload=tracked.workload_id, epoch=tracked.epoch)
        if annotations_of(job).get(ANNOTATION_REPORTED):
            tracked.done = True  # it ended and was reported by an earlier process
            tracked.ended.set()
            return
        outcome = job_outcome(job)
        if outcome is not None:
            await self._tracker.finish(
                tracked, await self._tracker.explain_failure(tracked, outcome)
            )

    async def _wait_done(self, tracked: Tracked, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s):
            await tracked.ended.wait()
