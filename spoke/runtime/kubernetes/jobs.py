"""The API calls the Kubernetes runtime makes on one spoke's Jobs, their pods and namespaces.

Every call runs off the event loop (spoke.kube.request_json) and raises SpokeErrors. Objects
belong to this spoke when they carry its spoke label; the workload id and epoch come from the
workload annotation (exact) or label, and the epoch label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import structlog
from kubernetes import client as k8s

from schemas import EventPhase
from spoke.errors import SpokeError
from spoke.kube import (
    ANNOTATION_REPORTED,
    ANNOTATION_WORKLOAD,
    LABEL_EPOCH,
    LABEL_SPOKE,
    LABEL_TEAM,
    LABEL_WORKLOAD,
    annotations_of,
    dns_name,
    label_value,
    labels_of,
    meta,
    request_json,
    request_json_unless,
)
from spoke.runtime.kubernetes.lease import ANNOTATION_FENCED, max_runtime_of, start_time_of
from spoke.runtime.kubernetes.manifests import (
    ANNOTATION_ENDPOINT,
    namespace_manifest,
    network_policies,
    owned_by_job,
)
from spoke.runtime.kubernetes.tracking import Tracked

log = structlog.get_logger(__name__)

FENCE_GRACE_S = 5.0
_POLL_S = 0.2


class SpokeJobs:
    """This spoke's Jobs (those labelled with `spoke_label`) in the cluster behind the APIs."""

    def __init__(
        self,
        batch: k8s.BatchV1Api,
        core: k8s.CoreV1Api,
        spoke_label: str,
        namespace_prefix: str,
        networking: k8s.NetworkingV1Api | None = None,
    ) -> None:
        self._batch = batch
        self._core = core
        self._networking = networking
        self._spoke_label = spoke_label
        self._namespace_prefix = namespace_prefix
        self._namespaces: set[str] = set()
        #: The label selector of this spoke's Jobs and pods.
        self.selector = f"{LABEL_SPOKE}={spoke_label}"

    def namespace_for(self, team: str) -> str:
        """The namespace a team's Jobs run in."""
        return dns_name(f"{self._namespace_prefix}{team}", 63)

    def identity(self, obj: Mapping[str, Any]) -> tuple[str, int] | None:
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

    def tracked_from_job(self, job: Mapping[str, Any], workload_id: str, epoch: int) -> Tracked:
        """A Tracked for a Job found in the cluster (not seen by the watch yet)."""
        team = labels_of(job).get(LABEL_TEAM, "")
        namespace = meta(job).get("namespace") or self.namespace_for(team)
        spec = job.get("spec") or {}
        annotations = annotations_of(job)
        deadline = spec.get("activeDeadlineSeconds")
        return Tracked(
            workload_id=workload_id,
            epoch=epoch,
            namespace=str(namespace),
            job_name=str(meta(job).get("name")),
            nodes=int(spec.get("completions") or 1),
            endpoint=annotations.get(ANNOTATION_ENDPOINT, ""),
            fenced=annotations.get(ANNOTATION_FENCED) == "true",
            max_runtime_s=max_runtime_of(annotations),
            started_at=start_time_of(job),
            deadline_s=deadline if isinstance(deadline, int) else None,
            has_secret=_reads_its_secret(job),
        )

    async def list_jobs(self) -> list[Mapping[str, Any]]:
        """This spoke's Jobs in all namespaces."""
        listing = await request_json(
            "list jobs", self._batch.list_job_for_all_namespaces, label_selector=self.selector
        )
        return list(listing.get("items") or [])

    async def create_job(
        self, namespace: str, job_name: str, manifest: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Create a Job; None if one of that name exists (409)."""
        return await request_json_unless(
            {409},
            f"create job {namespace}/{job_name}",
            self._batch.create_namespaced_job,
            namespace,
            manifest,
        )

    async def create_service(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        """Create a session's or service's Service (one of that name exists: kept)."""
        await self._create_kept(
            "service", self._core.create_namespaced_service, namespace, manifest
        )

    async def create_secret(self, namespace: str, manifest: Mapping[str, Any]) -> None:
        """Create a Job's Secret of secret env values before the Job (one of that name exists:
        an earlier try of the same epoch made it, with the same values, and it is kept)."""
        await self._create_kept("secret", self._core.create_namespaced_secret, namespace, manifest)

    @staticmethod
    async def _create_kept(
        kind: str, create: Callable[..., Any], namespace: str, manifest: Mapping[str, Any]
    ) -> None:
        """Create `manifest` in `namespace`; one of its name already there is kept (409)."""
        name = manifest["metadata"]["name"]
        await request_json_unless(
            {409}, f"create {kind} {namespace}/{name}", create, namespace, manifest
        )

    async def own_secret(self, namespace: str, name: str, job_uid: str) -> None:
        """Make the Job named `name` the owner of its Secret, so that it goes with the Job; a
        failure is logged (the Job runs; its Secret stays until deleted by hand)."""
        patch = {"metadata": {"ownerReferences": [owned_by_job(name, job_uid)]}}
        try:
            await request_json_unless(
                {404},
                f"give secret {namespace}/{name} to its job",
                self._core.patch_namespaced_secret,
                name,
                namespace,
                patch,
            )
        except SpokeError as exc:
            log.warning("secret_not_owned", namespace=namespace, secret=name, error=str(exc))

    async def delete_secret(self, namespace: str, name: str) -> None:
        """Delete a Job's Secret (already gone: a no-op); a failure is logged, not raised."""
        try:
            await request_json_unless(
                {404},
                f"delete secret {namespace}/{name}",
                self._core.delete_namespaced_secret,
                name,
                namespace,
            )
        except SpokeError as exc:
            log.warning("secret_not_deleted", namespace=namespace, secret=name, error=str(exc))

    async def read_job(self, tracked: Tracked) -> dict[str, Any]:
        """The tracked workload's Job as it is now."""
        return await request_json(
            f"read job {tracked.namespace}/{tracked.job_name}",
            self._batch.read_namespaced_job,
            tracked.job_name,
            tracked.namespace,
        )

    async def ensure_namespace(self, namespace: str, team: str) -> None:
        """Create the team's namespace unless it exists (or the spoke may not create it)."""
        if namespace in self._namespaces:
            return
        body = namespace_manifest(namespace, team)
        # 409: it exists. 403: the spoke may not create namespaces; it may have been created
        # for it (the strict RBAC variant) - the Job create says if not.
        created = await request_json_unless(
            {403, 409}, f"create namespace {namespace}", self._core.create_namespace, body
        )
        if created is not None:
            log.info("namespace_created", namespace=namespace, team=team)
            await self._isolate(namespace)
        self._namespaces.add(namespace)

    async def _isolate(self, namespace: str) -> None:
        """Default-deny NetworkPolicies in a namespace the spoke just created (409: there)."""
        if self._networking is None:
            return
        for policy in network_policies(namespace):
            await request_json_unless(
                {409},
                f"create network policy {namespace}/{policy['metadata']['name']}",
                self._networking.create_namespaced_network_policy,
                namespace,
                policy,
            )

    async def set_deadline(self, tracked: Tracked, seconds: int | None) -> None:
        """Set the Job's activeDeadlineSeconds (lease.py; None: none); a Job gone meanwhile
        is left."""
        patch = {"spec": {"activeDeadlineSeconds": seconds}}
        await request_json_unless(
            {404},
            f"set the deadline of job {tracked.namespace}/{tracked.job_name}",
            self._batch.patch_namespaced_job,
            tracked.job_name,
            tracked.namespace,
            patch,
        )

    async def mark_reported(self, tracked: Tracked, phase: EventPhase) -> None:
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

    async def delete_objects(self, tracked: Tracked, grace_s: float) -> None:
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
        if tracked.has_service:  # named as its Job
            await request_json_unless(
                {404},
                f"delete service {tracked.namespace}/{tracked.job_name}",
                self._core.delete_namespaced_service,
                tracked.job_name,
                tracked.namespace,
            )
        for pod in await self.workload_pods(tracked):
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

    async def delete_stale(self, job: Mapping[str, Any], workload_id: str, epoch: int) -> None:
        """Delete a Job of an epoch that was replaced, and its pods (short grace)."""
        stale = self.tracked_from_job(job, workload_id, epoch)
        await self.delete_objects(stale, FENCE_GRACE_S)
        log.info("stale_epoch_fenced", workload=workload_id, epoch=epoch, job=stale.job_name)

    async def workload_pods(self, tracked: Tracked) -> list[Mapping[str, Any]]:
        """The pods of the tracked workload's epoch."""
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
            if self.identity(pod) == (tracked.workload_id, tracked.epoch)
        ]

    async def wait_pods_gone(self, tracked: Tracked, timeout_s: float) -> None:
        """Poll until the workload's pods are gone; after `timeout_s`, log and return."""
        with anyio.move_on_after(timeout_s):
            while True:
                if not await self.workload_pods(tracked):
                    return
                await anyio.sleep(_POLL_S)
        log.warning("workload_pods_linger", workload=tracked.workload_id, waited_s=timeout_s)


def _reads_its_secret(job: Mapping[str, Any]) -> bool:
    """Whether a Job's containers read a Secret named as the Job (its secret env values)."""
    name = meta(job).get("name")
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return any(
        ((entry.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name") == name
        for container in template.get("containers") or []
        for entry in container.get("env") or []
    )
