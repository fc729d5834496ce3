"""Workloads as Kubernetes batch/v1 Jobs, one per (workload, epoch).

The Job lives in the team's namespace (`<prefix><team>`, created on first use), is pinned to the
assigned node(s) by node affinity, requests `nvidia.com/gpu` (or a MIG resource) as a limit and
carries the labels of the contract in spoke.kube. A gang of N nodes is one Indexed Job with
parallelism = completions = N and one pod per node (pod anti-affinity on the host); the pods
start independently, so true all-or-nothing co-scheduling needs Kueue or JobSet on top.

One watch thread per resource (Jobs, Pods; list, then watch from the list's resourceVersion,
relist on 410 Gone) feeds changes back to the event loop, where they become RuntimeEvents:
RUNNING once all pods run, then exactly one terminal event per (workload, epoch).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from schemas import EventPhase, WorkloadSpec
from spoke.errors import PermanentSpokeError, SpokeError
from spoke.kube import (
    ANNOTATION_DECISION,
    ANNOTATION_REPORTED,
    ANNOTATION_WORKLOAD,
    DEFAULT_TIMEOUT_S,
    GPU_RESOURCE,
    LABEL_EPOCH,
    LABEL_GPU_MODEL,
    LABEL_GPU_PRODUCT,
    LABEL_HOSTNAME,
    LABEL_MANAGED_BY,
    LABEL_SPOKE,
    LABEL_TEAM,
    LABEL_WORKLOAD,
    MANAGED_BY,
    MIG_SEPARATOR,
    annotations_of,
    dns_name,
    label_value,
    labels_of,
    meta,
    request_json,
    request_json_unless,
)
from spoke.ports import EventSink, Launch, RuntimeEvent

log = structlog.get_logger(__name__)

DEFAULT_PRIORITY_CLASSES: Mapping[str, str] = {
    "production": "gpufed-production",
    "training": "gpufed-training",
    "dev": "gpufed-dev",
    "batch": "gpufed-batch",
}
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
CONTAINER_NAME = "workload"
LABEL_WORKLOAD_NAME = "gpufed.io/workload-name"
POD_SECURITY_LABEL = "pod-security.kubernetes.io/enforce"
FINISHED_TTL_S = 24 * 3600  # finished Jobs stay a day for `kubectl logs`
FENCE_GRACE_S = 5.0
STOP_WAIT_MARGIN_S = 30.0
WATCH_SERVER_TIMEOUT_S = 300
WATCH_READ_TIMEOUT_S = 330.0
_POLL_S = 0.2
_RETRY_MIN_S = 0.5
_RETRY_MAX_S = 30.0
_MAX_DONE_KEPT = 4096
_JOIN_S = 2.0


@dataclass(frozen=True, slots=True)
class _Outcome:
    phase: EventPhase
    reason: str = ""
    exit_code: int | None = None
    message: str = ""


@dataclass(slots=True)
class _Tracked:
    workload_id: str
    epoch: int
    namespace: str
    job_name: str
    nodes: int
    seen: bool = False  # its Job was seen in the watch (so a relist without it means deleted)
    running_reported: bool = False
    done: bool = False
    stopping: bool = False
    failure: _Outcome | None = None
    running_pods: set[str] = field(default_factory=set)
    succeeded_pods: set[str] = field(default_factory=set)
    ended: anyio.Event = field(default_factory=anyio.Event)


class KubernetesRuntime:
    """Runs each placed workload as a batch/v1 Job and reports what its pods do.

    `priority_class_map` maps gpufed priority classes to Kubernetes PriorityClass names
    (default: "production" -> "gpufed-production" etc., shipped in deploy/base/spoke); a class
    missing from the map runs with the cluster's default priority.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        sink: EventSink,
        spoke_id: str,
        default_image: str = "busybox:1.36",
        namespace_prefix: str = "gpufed-",
        priority_class_map: Mapping[str, str] | None = None,
    ) -> None:
        self._batch = k8s.BatchV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._sink = sink
        self._spoke_id = spoke_id
        self._spoke_label = label_value(spoke_id)
        self._selector = f"{LABEL_SPOKE}={self._spoke_label}"
        self._default_image = default_image
        self._namespace_prefix = namespace_prefix
        self._priority_classes = dict(
            DEFAULT_PRIORITY_CLASSES if priority_class_map is None else priority_class_map
        )
        self._tracked: dict[str, _Tracked] = {}
        self._namespaces: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._responses: dict[str, Any] = {}
        self._responses_lock = threading.Lock()
        self._closing = threading.Event()
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._emit_lock: anyio.Lock | None = None

    # -- the Runtime port -------------------------------------------------------------------

    async def start(self, launch: Launch) -> None:
        """Create the workload's Job; returns once the API server has stored it.

        Idempotent per (workload_id, epoch): a known one, or a Job of that epoch already in the
        cluster, is taken as started. A newer epoch first fences the older one's Job. Raises
        PermanentSpokeError for what Kubernetes cannot run (fractional GPUs, mixed resources)
        and for API refusals; RetryableSpokeError when the API is unavailable.
        """
        self._prepare()
        known = self._tracked.get(launch.workload_id)
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
        manifest = build_job(
            launch,
            namespace=namespace,
            job_name=job_name,
            spoke_label=self._spoke_label,
            image=launch.spec.image or self._default_image,
            priority_class=self._priority_class(launch.spec.priority_class),
        )
        await self._ensure_namespace(namespace, launch.spec.team)
        tracked = _Tracked(
            workload_id=launch.workload_id,
            epoch=launch.epoch,
            namespace=namespace,
            job_name=job_name,
            nodes=launch.spec.nodes,
        )
        # Registered before the create so that no watch event of the new Job goes unheard.
        self._tracked[launch.workload_id] = tracked
        try:
            created = await request_json_unless(
                {409},
                f"create job {namespace}/{job_name}",
                self._batch.create_namespaced_job,
                namespace,
                manifest,
            )
            if created is None:
                await self._take_over_existing(tracked)
        except SpokeError as exc:
            if self._tracked.get(launch.workload_id) is tracked:
                del self._tracked[launch.workload_id]
            cause = exc.__cause__
            if isinstance(cause, ApiException) and cause.status == 404 and "namespace" in str(exc):
                raise PermanentSpokeError(
                    f"{exc}. Namespace {namespace} is missing and the spoke could not create it: "
                    "create it, or allow the spoke to create namespaces (deploy/base/spoke)."
                ) from exc
            raise
        self._ensure_watching()
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
        tracked = self._tracked.get(workload_id)
        if tracked is None or tracked.done:
            return
        if tracked.stopping:
            await self._wait_done(tracked, grace_s + STOP_WAIT_MARGIN_S)
            return
        tracked.stopping = True
        try:
            await self._delete_objects(tracked, grace_s)
            await self._wait_pods_gone(tracked, grace_s + STOP_WAIT_MARGIN_S)
        except SpokeError:
            tracked.stopping = False
            raise
        await self._finish(
            tracked, _Outcome(phase, message=f"Job deleted by the spoke ({phase.value})")
        )

    async def adopt(self) -> dict[str, int]:
        """Take over this spoke's Jobs left by a previous process; start watching.

        Returns workload id -> epoch of the unfinished ones. Finished ones not yet reported are
        reported now (and marked, so a later restart does not report them again); Jobs of an
        older epoch than another Job of the same workload are deleted.
        """
        self._prepare()
        listing = await request_json(
            "list jobs", self._batch.list_job_for_all_namespaces, label_selector=self._selector
        )
        newest: dict[str, tuple[int, Mapping[str, Any]]] = {}
        for job in listing.get("items") or []:
            identity = self._identity(job)
            if identity is None:
                continue
            workload_id, epoch = identity
            previous = newest.get(workload_id)
            if previous is not None and previous[0] > epoch:
                await self._delete_stale(job, workload_id, epoch)
                continue
            if previous is not None:
                await self._delete_stale(previous[1], workload_id, previous[0])
            newest[workload_id] = (epoch, job)
        running: dict[str, int] = {}
        for workload_id, (epoch, job) in newest.items():
            if annotations_of(job).get(ANNOTATION_REPORTED) or meta(job).get("deletionTimestamp"):
                continue
            tracked = self._tracked_from_job(job, workload_id, epoch)
            tracked.seen = True
            self._tracked[workload_id] = tracked
            outcome = job_outcome(job)
            if outcome is None:
                running[workload_id] = epoch
            else:
                await self._finish(tracked, await self._explain_failure(tracked, outcome))
        self._ensure_watching()
        log.info("workloads_adopted", running=len(running), jobs=len(newest))
        return running

    def running(self) -> dict[str, int]:
        """Workloads started and not yet ended: workload id -> epoch."""
        return {t.workload_id: t.epoch for t in self._tracked.values() if not t.done}

    async def close(self) -> None:
        """Stop the watch threads; the Jobs keep running and a new process adopts them."""
        self._closing.set()
        with self._responses_lock:
            responses = list(self._responses.values())
        for response in responses:
            _shutdown(response)
        for thread in self._threads:
            await anyio.to_thread.run_sync(thread.join, _JOIN_S)
            if thread.is_alive():
                # Still waiting for a watch's response headers: it ends at the read timeout (or
                # when the connection drops) and reports nothing after `_closing` is set.
                log.info("kubernetes_watch_detached", thread=thread.name)
        self._threads.clear()

    # -- beyond the port --------------------------------------------------------------------

    async def fence(self, workload_id: str, current_epoch: int) -> int:
        """Delete this spoke's Jobs of `workload_id` with an epoch older than `current_epoch`.

        A tracked older epoch is reported CANCELLED (reason StaleEpoch). Returns how many Jobs
        were deleted; idempotent.
        """
        self._prepare()
        tracked = self._tracked.get(workload_id)
        stale = tracked is not None and tracked.epoch < current_epoch and not tracked.done
        if tracked is not None and stale:
            tracked.stopping = True  # its Job's deletion below is not a failure to report
        try:
            listing = await request_json(
                "list jobs", self._batch.list_job_for_all_namespaces, label_selector=self._selector
            )
            deleted = 0
            for job in listing.get("items") or []:
                identity = self._identity(job)
                if identity and identity[0] == workload_id and identity[1] < current_epoch:
                    await self._delete_stale(job, workload_id, identity[1])
                    deleted += 1
        except SpokeError:
            if tracked is not None and stale:
                tracked.stopping = False
            raise
        if tracked is not None and stale:
            await self._finish(
                tracked,
                _Outcome(
                    EventPhase.CANCELLED,
                    reason="StaleEpoch",
                    message=f"replaced by epoch {current_epoch}",
                ),
            )
        return deleted

    def namespace_for(self, team: str) -> str:
        """The namespace a team's Jobs run in."""
        return dns_name(f"{self._namespace_prefix}{team}", 63)

    # -- start helpers ----------------------------------------------------------------------

    def _prepare(self) -> None:
        if self._emit_lock is None:
            self._emit_lock = anyio.Lock()
        if self._token is None:
            self._token = anyio.lowlevel.current_token()

    def _priority_class(self, name: str) -> str | None:
        mapped = self._priority_classes.get(name)
        if mapped is None:
            log.warning("priority_class_unmapped", priority_class=name)
        return mapped

    async def _ensure_namespace(self, namespace: str, team: str) -> None:
        if namespace in self._namespaces:
            return
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {
                    LABEL_MANAGED_BY: MANAGED_BY,
                    LABEL_TEAM: label_value(team),
                    POD_SECURITY_LABEL: "baseline",
                },
            },
        }
        # 409: it exists. 403: the spoke may not create namespaces; it may have been created
        # for it (the strict RBAC variant) - the Job create says if not.
        created = await request_json_unless(
            {403, 409}, f"create namespace {namespace}", self._core.create_namespace, body
        )
        if created is not None:
            log.info("namespace_created", namespace=namespace, team=team)
        self._namespaces.add(namespace)

    async def _take_over_existing(self, tracked: _Tracked) -> None:
        """The create met a Job of the same name: ours of this epoch, or someone else's."""
        job = await request_json(
            f"read job {tracked.namespace}/{tracked.job_name}",
            self._batch.read_namespaced_job,
            tracked.job_name,
            tracked.namespace,
        )
        if self._identity(job) != (tracked.workload_id, tracked.epoch):
            raise PermanentSpokeError(
                f"a Job {tracked.namespace}/{tracked.job_name} exists that gpufed spoke "
                f"{self._spoke_id} did not create for workload {tracked.workload_id}"
            )
        tracked.seen = True
        log.info("workload_job_exists", workload=tracked.workload_id, epoch=tracked.epoch)
        if annotations_of(job).get(ANNOTATION_REPORTED):
            tracked.done = True  # it ended and was reported by an earlier process
            tracked.ended.set()
            return
        outcome = job_outcome(job)
        if outcome is not None:
            await self._finish(tracked, await self._explain_failure(tracked, outcome))

    # -- reporting --------------------------------------------------------------------------

    async def _report_running(self, tracked: _Tracked) -> None:
        assert self._emit_lock is not None
        async with self._emit_lock:
            if tracked.done or tracked.running_reported:
                return
            tracked.running_reported = True
            await self._send(tracked, _Outcome(EventPhase.RUNNING))

    async def _finish(self, tracked: _Tracked, outcome: _Outcome) -> None:
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
                await self._send(tracked, _Outcome(EventPhase.RUNNING))
            await self._send(tracked, outcome)
            tracked.ended.set()
        if not tracked.stopping and outcome.reason != "JobDeleted":
            await self._mark_reported(tracked, outcome.phase)
        self._forget_done()

    async def _send(self, tracked: _Tracked, outcome: _Outcome) -> None:
        event = RuntimeEvent(
            workload_id=tracked.workload_id,
            epoch=tracked.epoch,
            phase=outcome.phase,
            exit_code=outcome.exit_code,
            reason=outcome.reason,
            message=outcome.message[:4096],
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

    async def _mark_reported(self, tracked: _Tracked, phase: EventPhase) -> None:
        """Annotate the finished Job so a restarted spoke does not report it again."""
        patch = {"metadata": {"annotations": {ANNOTATION_REPORTED: phase.value}}}
        try:
            await request_json_unless(
                {404},
                f"annotate job {tracked.namespace}/{tracked.job_name}",
                self._batch.patch_namespaced_job,
                tracked.job_name,
                tracked.namespace,
                patch,
            )
        except SpokeError as exc:
            log.warning("job_annotate_failed", workload=tracked.workload_id, error=str(exc))

    def _forget_done(self) -> None:
        done = [key for key, t in self._tracked.items() if t.done]
        for key in done[: max(0, len(done) - _MAX_DONE_KEPT)]:
            del self._tracked[key]

    async def _explain_failure(self, tracked: _Tracked, outcome: _Outcome) -> _Outcome:
        """A failed Job says little (BackoffLimitExceeded); its pod says OOMKilled and 137."""
        if outcome.phase is not EventPhase.FAILED or outcome.reason == "DeadlineExceeded":
            return outcome
        if tracked.failure is not None:
            return tracked.failure
        try:
            pods = await self._workload_pods(tracked)
        except SpokeError as exc:
            log.warning("pod_failure_unknown", workload=tracked.workload_id, error=str(exc))
            return outcome
        for pod in pods:
            _, detail = pod_state(pod)
            if detail is not None:
                return detail
        return outcome

    # -- deleting ---------------------------------------------------------------------------

    async def _delete_objects(self, tracked: _Tracked, grace_s: float) -> None:
        """The Job first (so no controller replaces a pod), then its pods with our grace."""
        grace = max(0, math.ceil(grace_s))
        await request_json_unless(
            {404},
            f"delete job {tracked.namespace}/{tracked.job_name}",
            self._batch.delete_namespaced_job,
            tracked.job_name,
            tracked.namespace,
            propagation_policy="Background",
            grace_period_seconds=grace,
        )
        for pod in await self._workload_pods(tracked):
            name = str(meta(pod).get("name"))
            await request_json_unless(
                {404},
                f"delete pod {tracked.namespace}/{name}",
                self._core.delete_namespaced_pod,
                name,
                tracked.namespace,
                grace_period_seconds=grace,
            )
        log.info(
            "workload_job_deleted",
            workload=tracked.workload_id,
            epoch=tracked.epoch,
            job=tracked.job_name,
            grace_s=grace,
        )

    async def _delete_stale(self, job: Mapping[str, Any], workload_id: str, epoch: int) -> None:
        stale = self._tracked_from_job(job, workload_id, epoch)
        await self._delete_objects(stale, FENCE_GRACE_S)
        log.info("stale_epoch_fenced", workload=workload_id, epoch=epoch, job=stale.job_name)

    async def _workload_pods(self, tracked: _Tracked) -> list[Mapping[str, Any]]:
        selector = (
            f"{LABEL_WORKLOAD}={label_value(tracked.workload_id)},{LABEL_EPOCH}={tracked.epoch}"
        )
        listing = await request_json(
            f"list pods of {tracked.namespace}/{tracked.job_name}",
            self._core.list_namespaced_pod,
            tracked.namespace,
            label_selector=selector,
        )
        return [
            pod
            for pod in listing.get("items") or []
            if self._identity(pod) == (tracked.workload_id, tracked.epoch)
        ]

    async def _wait_pods_gone(self, tracked: _Tracked, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s):
            while True:
                if not await self._workload_pods(tracked):
                    return
                await anyio.sleep(_POLL_S)
        log.warning("workload_pods_linger", workload=tracked.workload_id, waited_s=timeout_s)

    async def _wait_done(self, tracked: _Tracked, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s):
            await tracked.ended.wait()

    # -- identity ---------------------------------------------------------------------------

    def _identity(self, obj: Mapping[str, Any]) -> tuple[str, int] | None:
        """(workload id, epoch) of a Job or pod this spoke made, else None."""
        labels = labels_of(obj)
        if labels.get(LABEL_SPOKE) != self._spoke_label:
            return None
        workload_id = annotations_of(obj).get(ANNOTATION_WORKLOAD) or labels.get(LABEL_WORKLOAD)
        try:
            epoch = int(labels.get(LABEL_EPOCH, ""))
        except ValueError:
            return None
        return (workload_id, epoch) if workload_id else None

    def _tracked_from_job(self, job: Mapping[str, Any], workload_id: str, epoch: int) -> _Tracked:
        team = labels_of(job).get(LABEL_TEAM, "")
        namespace = meta(job).get("namespace") or self.namespace_for(team)
        spec = job.get("spec") or {}
        return _Tracked(
            workload_id=workload_id,
            epoch=epoch,
            namespace=str(namespace),
            job_name=str(meta(job).get("name")),
            nodes=int(spec.get("completions") or 1),
        )

    def _lookup(self, obj: Mapping[str, Any]) -> _Tracked | None:
        identity = self._identity(obj)
        if identity is None:
            return None
        tracked = self._tracked.get(identity[0])
        return tracked if tracked is not None and tracked.epoch == identity[1] else None

    # -- the watch (threads) ----------------------------------------------------------------

    def _ensure_watching(self) -> None:
        if self._threads or self._closing.is_set():
            return
        for kind in ("jobs", "pods"):
            thread = threading.Thread(
                target=self._watch_forever, args=(kind,), name=f"gpufed-watch-{kind}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _watch_forever(self, kind: str) -> None:
        """List, then watch from the list's version; relist on 410 Gone; retry with backoff."""
        lister: Callable[..., Any] = (
            self._batch.list_job_for_all_namespaces
            if kind == "jobs"
            else self._core.list_pod_for_all_namespaces
        )
        version: str | None = None
        delay = _RETRY_MIN_S
        while not self._closing.is_set():
            try:
                if version is None:
                    response = lister(
                        label_selector=self._selector,
                        _preload_content=False,
                        _request_timeout=DEFAULT_TIMEOUT_S,
                    )
                    try:
                        listing = json.loads(response.data)
                    finally:
                        response.release_conn()
                    version = str(meta(listing).get("resourceVersion") or "")
                    if not self._deliver(kind, "RELISTED", listing):
                        return
                version = self._stream(kind, lister, version)
                delay = _RETRY_MIN_S
            except Exception as exc:
                if self._closing.is_set():
                    return
                if getattr(exc, "status", None) == 410:
                    version = None
                    continue
                log.warning("kubernetes_watch_failed", kind=kind, error=str(exc)[:300])
                self._closing.wait(delay)
                delay = min(delay * 2, _RETRY_MAX_S)

    def _stream(self, kind: str, lister: Any, version: str) -> str | None:
        """Follow one watch request; returns the last version, or None to ask for a relist."""
        response = lister(
            label_selector=self._selector,
            watch=True,
            resource_version=version or None,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SERVER_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(DEFAULT_TIMEOUT_S, WATCH_READ_TIMEOUT_S),
        )
        with self._responses_lock:
            self._responses[kind] = response
        try:
            # close() sets the flag, then shuts down the responses it finds: checking after
            # registering means one of the two always stops this stream.
            if self._closing.is_set():
                return version
            for line in _lines(response):
                if self._closing.is_set():
                    return version
                event = json.loads(line)
                kind_of_event = event.get("type")
                obj = event.get("object") or {}
                if kind_of_event == "ERROR":
                    if obj.get("code") == 410:
                        log.info("kubernetes_watch_expired", kind=kind)
                        return None
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = str(meta(obj).get("resourceVersion") or version)
                if kind_of_event in ("ADDED", "MODIFIED", "DELETED") and not self._deliver(
                    kind, kind_of_event, obj
                ):
                    return version
            return version
        finally:
            with self._responses_lock:
                self._responses.pop(kind, None)
            response.close()  # closes the socket: the server ends the watch now
            response.release_conn()

    def _deliver(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Hand one change to the event loop and wait until it is handled (back-pressure)."""
        if self._closing.is_set():
            return False
        try:
            anyio.from_thread.run(self._on_change, kind, event_type, obj, token=self._token)
        except Exception as exc:  # the loop is gone: nobody to report to any more
            log.debug("kubernetes_watch_detached", kind=kind, error=str(exc))
            self._closing.set()
            return False
        return True

    # -- the watch (event loop side) --------------------------------------------------------

    async def _on_change(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        try:
            if event_type == "RELISTED":
                items = [item for item in obj.get("items") or [] if self._identity(item)]
                for item in items:
                    await self._on_change(kind, "MODIFIED", item)
                if kind == "jobs":
                    await self._after_job_relist(items)
            elif kind == "jobs":
                await self._on_job(obj, deleted=event_type == "DELETED")
            elif event_type != "DELETED":
                await self._on_pod(obj)
        except Exception:
            log.exception("kubernetes_change_failed", kind=kind, event_type=event_type)

    async def _on_job(self, job: Mapping[str, Any], deleted: bool) -> None:
        tracked = self._lookup(job)
        if tracked is None:
            return
        tracked.seen = True
        if tracked.done or tracked.stopping:
            return
        if deleted:
            await self._finish(
                tracked,
                _Outcome(
                    EventPhase.FAILED,
                    reason="JobDeleted",
                    message="the Job was deleted outside gpufed",
                ),
            )
            return
        outcome = job_outcome(job)
        if outcome is not None:
            await self._finish(tracked, await self._explain_failure(tracked, outcome))

    async def _after_job_relist(self, items: list[Mapping[str, Any]]) -> None:
        """Jobs seen before but missing from a fresh list were deleted while we looked away."""
        present = {self._identity(item) for item in items}
        for tracked in list(self._tracked.values()):
            identity = (tracked.workload_id, tracked.epoch)
            if (
                tracked.seen
                and not tracked.done
                and not tracked.stopping
                and identity not in present
            ):
                await self._finish(
                    tracked,
                    _Outcome(
                        EventPhase.FAILED,
                        reason="JobDeleted",
                        message="the Job was deleted outside gpufed",
                    ),
                )

    async def _on_pod(self, pod: Mapping[str, Any]) -> None:
        tracked = self._lookup(pod)
        if tracked is None or tracked.done or tracked.stopping:
            return
        state, outcome = pod_state(pod)
        name = str(meta(pod).get("name"))
        if outcome is not None:
            tracked.failure = outcome
            fatal = outcome.reason in FATAL_WAITING_REASONS
            # A pod that can never start is deleted below; no need to mark its Job reported.
            tracked.stopping = fatal
            await self._finish(tracked, outcome)
            if fatal:
                await self._delete_objects(tracked, 0)
            return
        if state == "running":
            tracked.running_pods.add(name)
            if len(tracked.running_pods) >= tracked.nodes:
                await self._report_running(tracked)
        elif state == "succeeded":
            tracked.succeeded_pods.add(name)
            if len(tracked.succeeded_pods) >= tracked.nodes:
                await self._finish(tracked, _Outcome(EventPhase.SUCCEEDED, exit_code=0))


# -- pure parts: names, manifest, status ---------------------------------------------------


def job_name_for(workload_id: str, epoch: int) -> str:
    """The Job's name: the workload id made DNS-safe, then the epoch ("train-7-e2")."""
    suffix = f"-e{epoch}"
    return f"{dns_name(workload_id, 63 - len(suffix))}{suffix}"


def build_job(
    launch: Launch,
    *,
    namespace: str,
    job_name: str,
    spoke_label: str,
    image: str,
    priority_class: str | None,
) -> dict[str, Any]:
    """The batch/v1 Job for one launch. Raises PermanentSpokeError for what it cannot express."""
    spec = launch.spec
    hosts, resource = _placement(launch)
    labels = {
        LABEL_WORKLOAD: label_value(launch.workload_id),
        LABEL_EPOCH: str(launch.epoch),
        LABEL_SPOKE: spoke_label,
        LABEL_TEAM: label_value(spec.team),
        LABEL_WORKLOAD_NAME: spec.name,
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    annotations = {ANNOTATION_WORKLOAD: launch.workload_id, ANNOTATION_DECISION: launch.decision_id}
    env = [{"name": key, "value": value} for key, value in spec.env.items()]
    env += [
        {"name": "GPUFED_WORKLOAD_ID", "value": launch.workload_id},
        {"name": "GPUFED_EPOCH", "value": str(launch.epoch)},
        {"name": "GPUFED_NODES", "value": str(spec.nodes)},
    ]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": list(spec.command),
        "env": env,
        "resources": {
            "limits": {resource: str(spec.gpus_per_node)},
            "requests": {resource: str(spec.gpus_per_node)},
        },
    }
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "affinity": _affinity(hosts, spec, labels),
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
    }
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "parallelism": spec.nodes,
        "completions": spec.nodes,
        "ttlSecondsAfterFinished": FINISHED_TTL_S,
        "template": {
            "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
            "spec": pod_spec,
        },
    }
    if spec.nodes > 1:
        job_spec["completionMode"] = "Indexed"  # JOB_COMPLETION_INDEX gives each pod its rank
    if spec.max_runtime_s is not None:
        job_spec["activeDeadlineSeconds"] = spec.max_runtime_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": job_spec,
    }


def _placement(launch: Launch) -> tuple[list[str], str]:
    """Node names and the one GPU resource the launch asks for on each."""
    spec = launch.spec
    if spec.gpu_fraction is not None:
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: fractional GPUs are not supported by the Kubernetes "
            "runtime; ask for a MIG profile (a gpu_model like 'A100-mig-1g.10gb') instead"
        )
    hosts: list[str] = []
    resources: set[str] = set()
    for assignment in launch.assignments:
        host, _, profile = assignment.node.partition(MIG_SEPARATOR)
        hosts.append(host)
        resources.add(f"nvidia.com/{profile}" if profile else GPU_RESOURCE)
    if len(hosts) != spec.nodes or len(set(hosts)) != len(hosts):
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: needs {spec.nodes} distinct node(s), "
            f"was assigned {hosts}"
        )
    if len(resources) != 1:
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: assignments mix GPU resources {sorted(resources)}"
        )
    return hosts, resources.pop()


def _affinity(hosts: list[str], spec: WorkloadSpec, labels: Mapping[str, str]) -> dict[str, Any]:
    # metadata.name, not the kubernetes.io/hostname label: the inventory reports node names, and
    # on some clouds the hostname label differs from the node name.
    pinned = {"key": "metadata.name", "operator": "In", "values": hosts}
    models = _model_label_values(spec.gpu_models)
    if models:
        terms = [
            {
                "matchFields": [pinned],
                "matchExpressions": [{"key": key, "operator": "In", "values": models}],
            }
            for key in (LABEL_GPU_MODEL, LABEL_GPU_PRODUCT)
        ]
    else:
        terms = [{"matchFields": [pinned]}]
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    if spec.nodes > 1:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchLabels": {
                            LABEL_WORKLOAD: labels[LABEL_WORKLOAD],
                            LABEL_EPOCH: labels[LABEL_EPOCH],
                        }
                    },
                    "topologyKey": LABEL_HOSTNAME,
                }
            ]
        }
    return affinity


def _model_label_values(models: tuple[str, ...]) -> list[str]:
    """Label values a node of one of `models` carries; a MIG model also matches its base."""
    values: list[str] = []
    for model in models:
        candidates = [model]
        at = model.lower().find("-mig-")
        if at > 0:
            candidates.append(model[:at])
        values.extend(c for c in candidates if c not in values)
    return values


def job_outcome(job: Mapping[str, Any]) -> _Outcome | None:
    """The terminal outcome a Job's conditions state, or None while it runs."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind == "Complete":
            return _Outcome(EventPhase.SUCCEEDED, exit_code=0)
        if kind in ("Failed", "FailureTarget"):
            return _Outcome(
                EventPhase.FAILED,
                reason=str(condition.get("reason") or "JobFailed"),
                message=str(condition.get("message") or ""),
            )
    return None


def pod_state(pod: Mapping[str, Any]) -> tuple[str, _Outcome | None]:
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
            return "failed", _Outcome(
                EventPhase.PREEMPTED,
                reason=str(condition.get("reason") or "DisruptionTarget"),
                message=str(condition.get("message") or ""),
            )
    containers = _our_containers(status)
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING_REASONS:
            return "failed", _Outcome(
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
                return "failed", _Outcome(
                    EventPhase.FAILED,
                    reason=str(terminated.get("reason") or "Error"),
                    exit_code=int(terminated["exitCode"]),
                    message=str(terminated.get("message") or ""),
                )
        return "failed", _Outcome(
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


def _lines(response: Any) -> Iterator[str]:
    """Newline-delimited JSON lines of a streaming response, as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk if isinstance(chunk, bytes) else str(chunk).encode()
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")


def _shutdown(response: Any) -> None:
    """Unblock a thread reading a watch response (urllib3 2.3+; older: the raw socket)."""
    try:
        response.shutdown()
        return
    except Exception:
        pass
    try:
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            import socket

            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
