"""The Kubernetes objects the runtime creates: a workload's batch/v1 Job and its team's namespace.

Pure functions of a Launch: no API calls. A gang of N nodes is one Indexed Job with
parallelism = completions = N and one pod per node (pod anti-affinity on the host); its pods
are named by a headless Service (`<job>-<rank>.<job>`), so every rank reaches rank 0 at
$GPUFED_MASTER_ADDR:$GPUFED_MASTER_PORT, as on the other runtimes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas import WorkloadSpec
from schemas.workloads import RESERVED_ENV
from spoke.errors import PermanentSpokeError
from spoke.kube import (
    ANNOTATION_DECISION,
    ANNOTATION_WORKLOAD,
    GPU_RESOURCE,
    LABEL_EPOCH,
    LABEL_HOSTNAME,
    LABEL_MANAGED_BY,
    LABEL_SPOKE,
    LABEL_TEAM,
    LABEL_WORKLOAD,
    MANAGED_BY,
    MIG_SEPARATOR,
    dns_name,
    label_value,
)
from spoke.ports import Launch
from spoke.runtime.kubernetes.lease import ANNOTATION_FENCED, ANNOTATION_MAX_RUNTIME, JobLease

DEFAULT_PRIORITY_CLASSES: Mapping[str, str] = {
    "production": "gpufed-production",
    "training": "gpufed-training",
    "dev": "gpufed-dev",
    "batch": "gpufed-batch",
}
CONTAINER_NAME = "workload"
LABEL_WORKLOAD_NAME = "gpufed.io/workload-name"
POD_SECURITY_LABEL = "pod-security.kubernetes.io/enforce"
FINISHED_TTL_S = 24 * 3600  # finished Jobs stay a day for `kubectl logs`
#: The Pod Security Standard team namespaces enforce (and the pods below satisfy).
POD_SECURITY_LEVEL = "restricted"
#: The user and group a workload runs as when its image does not say (never root).
DEFAULT_UID = 1000
#: CPU and memory a workload gets per GPU it asks for (requests = limits, so it is never
#: squeezed or OOM-killed by a noisy neighbour it did not choose).
CPU_PER_GPU = 4
MEMORY_GIB_PER_GPU = 32
#: The port a session or service listens on in its pod ($GPUFED_PORT) and its Service serves.
SESSION_PORT = 8000
#: On a session's or service's Job: the URL its Service gives it (read back on adoption).
ANNOTATION_ENDPOINT = "gpufed.io/endpoint"
#: The port a gang's rank 0 may listen on for the others ($GPUFED_MASTER_PORT): a pod has its
#: own network, so one port does for every gang (torchrun's default).
RENDEZVOUS_PORT = 29500
#: An Indexed Job's pod's rank, which the Job controller writes on the pod.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_DENY_POLICY = "gpufed-default-deny"
SAME_NAMESPACE_POLICY = "gpufed-allow-same-namespace"


def job_name_for(workload_id: str, epoch: int) -> str:
    """The Job's name: the workload id made DNS-safe, then the epoch ("train-7-e2")."""
    suffix = f"-e{epoch}"
    return f"{dns_name(workload_id, 63 - len(suffix))}{suffix}"


def endpoint_for(namespace: str, job_name: str, nodes: int = 1) -> str:
    """The cluster DNS URL of a session's or service's Service (named as its Job); a gang's
    is its rank 0's pod."""
    host = rank0_host(namespace, job_name) if nodes > 1 else f"{job_name}.{namespace}.svc"
    return f"http://{host}.cluster.local:{SESSION_PORT}"


def rank0_host(namespace: str, job_name: str) -> str:
    """A gang's rank 0 pod, by the name its headless Service gives it (less `.cluster.local`)."""
    return f"{job_name}-0.{job_name}.{namespace}.svc"


def build_service(
    launch: Launch, *, namespace: str, job_name: str, job_uid: str | None = None
) -> dict[str, Any]:
    """The v1 Service of this epoch's pods: a ClusterIP in front of a session's or service's
    pod, a headless one (every pod named, ready or not) for a gang.

    Owned by its Job (`job_uid`), so the cluster deletes it with the Job however that ends.
    """
    selector = {LABEL_WORKLOAD: label_value(launch.workload_id), LABEL_EPOCH: str(launch.epoch)}
    metadata: dict[str, Any] = {
        "name": job_name,
        "namespace": namespace,
        "labels": {**selector, LABEL_MANAGED_BY: MANAGED_BY},
        "annotations": {ANNOTATION_WORKLOAD: launch.workload_id},
    }
    if job_uid:
        owner = owned_by_job(job_name, job_uid)
        metadata["ownerReferences"] = [owner]
    ports = []
    if launch.spec.kind.exposes_port:
        ports.append({"name": "http", "port": SESSION_PORT, "targetPort": SESSION_PORT})
    spec: dict[str, Any] = {"type": "ClusterIP", "selector": selector, "ports": ports}
    if launch.spec.nodes > 1:
        rendezvous = {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}
        ports.append(rendezvous)
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": True}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def build_job(
    launch: Launch,
    *,
    namespace: str,
    job_name: str,
    spoke_label: str,
    image: str,
    priority_class: str | None,
    lease: JobLease | None = None,
) -> dict[str, Any]:
    """The batch/v1 Job for one launch; `lease`: a fenced one's (lease.py). Raises
    PermanentSpokeError for what it cannot express."""
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
    secret = set(spec.secret_env)
    env: list[dict[str, Any]] = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": job_name, "key": k}}}
        if k in secret
        else {"name": k, "value": v}
        for k, v in spec.env.items()
    ]
    env += [
        {"name": "GPUFED_WORKLOAD_ID", "value": launch.workload_id},
        {"name": "GPUFED_EPOCH", "value": str(launch.epoch)},
        {"name": "GPUFED_NUM_NODES", "value": str(spec.nodes)},
        {"name": "GPUFED_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    if spec.nodes > 1:
        index = f"metadata.annotations['{COMPLETION_INDEX}']"
        env += [
            {"name": "GPUFED_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
            {"name": "GPUFED_MASTER_ADDR", "value": rank0_host(namespace, job_name)},
            {"name": "GPUFED_MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        ]
    else:
        env.append({"name": "GPUFED_NODE_RANK", "value": "0"})
    if spec.kind.exposes_port:
        env += [
            {"name": "GPUFED_HOST", "value": "0.0.0.0"},  # all of the pod's own addresses
            {"name": "GPUFED_PORT", "value": str(SESSION_PORT)},
        ]
        annotations[ANNOTATION_ENDPOINT] = endpoint_for(namespace, job_name, spec.nodes)
    reserved = RESERVED_ENV & spec.env.keys()
    if reserved:  # the spec was validated; this guards a spec built past validation
        raise PermanentSpokeError(f"env: {', '.join(sorted(reserved))} is set by the cluster")
    compute = {
        "cpu": str(CPU_PER_GPU * spec.gpus_per_node),
        "memory": f"{MEMORY_GIB_PER_GPU * spec.gpus_per_node}Gi",
    }
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": list(spec.command),
        "env": env,
        "resources": {
            "limits": {resource: str(spec.gpus_per_node), **compute},
            "requests": {resource: str(spec.gpus_per_node), **compute},
        },
        # The Pod Security Standard "restricted": no root, no privilege escalation, no
        # capabilities, the runtime's default seccomp profile.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    if spec.kind.exposes_port:
        container["ports"] = [{"name": "http", "containerPort": SESSION_PORT}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "affinity": _affinity(hosts, spec, labels),
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": DEFAULT_UID,
            "runAsGroup": DEFAULT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
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
        pod_spec["subdomain"] = job_name  # with the headless Service: <job>-<rank>.<job>
    if spec.max_runtime_s is not None:
        job_spec["activeDeadlineSeconds"] = spec.max_runtime_s
    if lease is not None:
        annotations[ANNOTATION_FENCED] = "true"
        if spec.max_runtime_s is not None:
            annotations[ANNOTATION_MAX_RUNTIME] = str(spec.max_runtime_s)
        if lease.deadline_s is not None:
            job_spec["activeDeadlineSeconds"] = lease.deadline_s
        pod_spec["terminationGracePeriodSeconds"] = lease.grace_s
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


def build_env_secret(launch: Launch, *, namespace: str, job_name: str) -> dict[str, Any] | None:
    """The v1 Secret of the values of the spec's `secret_env`, named as its Job, whose container
    reads them by reference (`build_job`): they are in no Job or pod spec, so not in `kubectl
    describe` nor in the API server's audit log of them. None for a spec without any."""
    spec = launch.spec
    values = {k: spec.env[k] for k in spec.secret_env if k in spec.env}
    if not values:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": job_name,
            "namespace": namespace,
            "labels": {
                LABEL_WORKLOAD: label_value(launch.workload_id),
                LABEL_EPOCH: str(launch.epoch),
                LABEL_MANAGED_BY: MANAGED_BY,
            },
            "annotations": {ANNOTATION_WORKLOAD: launch.workload_id},
        },
        "type": "Opaque",
        "stringData": values,
    }


def owned_by_job(job_name: str, job_uid: str) -> dict[str, Any]:
    """An ownerReference to a Job: the cluster deletes the object with it, however that ends."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid}


def namespace_manifest(namespace: str, team: str) -> dict[str, Any]:
    """The v1 Namespace a team's Jobs run in (Pod Security Standard: restricted)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_TEAM: label_value(team),
                POD_SECURITY_LABEL: POD_SECURITY_LEVEL,
                "pod-security.kubernetes.io/warn": POD_SECURITY_LEVEL,
                "pod-security.kubernetes.io/audit": POD_SECURITY_LEVEL,
            },
        },
    }


def network_policies(namespace: str) -> list[dict[str, Any]]:
    """A team namespace's NetworkPolicies: deny all traffic in and out, then allow what a gang
    needs (its pods talking to each other inside the namespace) and DNS. Anything more (a data
    store, the internet) is the platform team's own policy to add."""
    meta = {"namespace": namespace, "labels": {LABEL_MANAGED_BY: MANAGED_BY}}
    same_namespace: list[dict[str, Any]] = [{"podSelector": {}}]
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": DEFAULT_DENY_POLICY, **meta},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": SAME_NAMESPACE_POLICY, **meta},
            "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": same_namespace}],
                "egress": [
                    {"to": same_namespace},
                    {
                        "to": [{"namespaceSelector": {}, "podSelector": {
                            "matchLabels": {"k8s-app": "kube-dns"}}}],
                        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                    },
                ],
            },
        },
    ]  # fmt: skip


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
    # on some clouds the hostname label differs from the node name. The hub chose these nodes
    # for their GPU model already; the inventory's short model names ("H100") match no node
    # label value, so pinning the node is the whole constraint.
    pinned = {"key": "metadata.name", "operator": "In", "values": hosts}
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
