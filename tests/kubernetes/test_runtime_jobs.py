"""The Job a placement becomes: where it runs, what it asks for, how it is labelled."""

from __future__ import annotations

import json
from typing import Any

import kmock
import pytest
from kubernetes import client as k8s
from pydantic import ValidationError

from schemas import Assignment, EventPhase, WorkloadSpec
from spoke.errors import PermanentSpokeError, RetryableSpokeError
from spoke.ports import Launch
from spoke.runtime.kubernetes import KubernetesRuntime, job_name_for
from tests.kubernetes.conftest import SPOKE_ID, Cluster, EventLog

NETWORK_POLICIES = "networking.k8s.io/v1/networkpolicies"


def launch(
    workload_id: str = "wl-train-1",
    epoch: int = 3,
    nodes: tuple[str, ...] = ("gpu-a",),
    **spec: Any,
) -> Launch:
    fields: dict[str, Any] = {
        "name": "train-llm",
        "team": "ml",
        "priority_class": "training",
        "command": ("python", "train.py", "--epochs", "3"),
        "env": {"WANDB_MODE": "offline"},
        "image": "ghcr.io/acme/train:1.2",
        "gpus_per_node": 4,
        "nodes": len(nodes),
        "gpu_models": ("H100",),
        "max_runtime_s": 7200,
    } | spec
    return Launch(
        workload_id=workload_id,
        epoch=epoch,
        decision_id=f"d-{workload_id}-{epoch}",
        spec=WorkloadSpec(**fields),
        assignments=tuple(Assignment(node=n, devices=(0, 1, 2, 3)) for n in nodes),
    )


async def test_job_lands_in_team_namespace_with_gpus_labels_priority_and_pinning(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch())

    job = cluster.job("gpufed-ml", "wl-train-1-e3")
    assert job is not None, "the Job is in the team's namespace, named after workload and epoch"
    namespace = cluster.emulator.namespaces["gpufed-ml"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    labels = job["metadata"]["labels"]
    assert labels["gpufed.io/workload-id"] == "wl-train-1"
    assert labels["gpufed.io/epoch"] == "3"
    assert labels["gpufed.io/spoke"] == SPOKE_ID
    assert labels["gpufed.io/team"] == "ml"
    assert job["metadata"]["annotations"]["gpufed.io/decision-id"] == "d-wl-train-1-3"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["parallelism"] == spec["completions"] == 1
    assert spec["activeDeadlineSeconds"] == 7200
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"] == labels, "pods carry the same labels"
    assert pod["restartPolicy"] == "Never"
    assert pod["priorityClassName"] == "gpufed-training"
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/acme/train:1.2"
    assert container["command"] == ["python", "train.py", "--epochs", "3"]
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "4",
        "cpu": "16",
        "memory": "128Gi",
    }
    assert container["resources"]["requests"] == container["resources"]["limits"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["WANDB_MODE"] == "offline"
    assert env["GPUFED_WORKLOAD_ID"] == "wl-train-1"
    assert "CUDA_VISIBLE_DEVICES" not in env, "the device plugin chooses the devices"
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # Pinned to the node the hub chose for its GPU model.
    assert term == {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]
    }
    assert runtime.running() == {"wl-train-1": 3}


@pytest.mark.security
async def test_jobs_run_restricted_in_an_isolated_namespace(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch())

    job = cluster.job("gpufed-ml", "wl-train-1-e3")
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    resources = container["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys() <= resources["limits"].keys()
    labels = cluster.emulator.namespaces["gpufed-ml"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    policies = {
        name: json.loads(json.dumps(obj.raw))
        for (resource, namespace, name), obj in cluster.emulator.objects.items()
        if resource == kmock.resource(NETWORK_POLICIES) and namespace == "gpufed-ml"
    }
    deny = policies["gpufed-default-deny"]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    allow = policies["gpufed-allow-same-namespace"]["spec"]
    assert allow["ingress"] == [{"from": [{"podSelector": {}}]}]


@pytest.mark.security
async def test_a_workload_cannot_set_its_own_gpus_through_env() -> None:
    with pytest.raises(ValidationError, match="NVIDIA_VISIBLE_DEVICES"):
        launch(env={"NVIDIA_VISIBLE_DEVICES": "all"})


async def test_job_deserialises_into_the_client_model(
    runtime: KubernetesRuntime, cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    await runtime.start(launch(image=None, max_runtime_s=None, gpu_models=()))
    job = cluster.job("gpufed-ml", "wl-train-1-e3")
    assert job is not None

    model = api_client._ApiClient__deserialize(job, "V1Job")  # type: ignore[attr-defined]

    assert model.spec.template.spec.containers[0].image == "busybox:1.36", "the default image"
    assert model.spec.active_deadline_seconds is None
    terms = model.spec.template.spec.affinity.node_affinity
    assert len(terms.required_during_scheduling_ignored_during_execution.node_selector_terms) == 1


async def test_gang_is_an_indexed_job_with_one_pod_per_assigned_node(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch(nodes=("gpu-a", "gpu-b", "gpu-c")))

    job = cluster.job("gpufed-ml", "wl-train-1-e3")
    assert job is not None
    spec = job["spec"]
    assert spec["parallelism"] == spec["completions"] == 3
    assert spec["completionMode"] == "Indexed"
    affinity = spec["template"]["spec"]["affinity"]
    pinned = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchFields"][0]
    assert pinned["values"] == ["gpu-a", "gpu-b", "gpu-c"]
    [spread] = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == {
        "gpufed.io/workload-id": "wl-train-1",
        "gpufed.io/epoch": "3",
    }
    # The ranks find rank 0 by name: a headless Service names each pod <job>-<rank>.<job>,
    # and every rank is told where rank 0 is and its own rank, as on the other runtimes.
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "wl-train-1-e3"
    [container] = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["GPUFED_NUM_NODES"] == "3"
    assert env["GPUFED_NODE_RANK"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    assert env["GPUFED_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    master = "wl-train-1-e3-0.wl-train-1-e3.gpufed-ml.svc"
    assert (env["GPUFED_MASTER_ADDR"], env["GPUFED_MASTER_PORT"]) == (master, "29500")
    [created] = cluster.requests("post", "/namespaces/gpufed-ml/services")
    service = created.data
    assert service["metadata"]["name"] == "wl-train-1-e3"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["selector"] == spread["labelSelector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "rendezvous", "port": 29500, "targetPort": 29500}]
    await runtime.stop("wl-train-1", 1.0, EventPhase.CANCELLED)
    assert cluster.requests("delete", "/services/wl-train-1-e3")


async def test_a_single_node_job_is_rank_0_of_1_and_gets_no_service(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch())
    job = cluster.job("gpufed-ml", "wl-train-1-e3")
    assert job is not None
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert (env["GPUFED_NODE_RANK"], env["GPUFED_NUM_NODES"]) == ("0", "1")
    assert "GPUFED_MASTER_ADDR" not in env and "subdomain" not in job["spec"]["template"]["spec"]
    assert not cluster.requests("post", "/services")


async def test_mig_pool_assignment_requests_the_mig_resource_on_its_host(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(
        launch(nodes=("gpu-m/mig-1g.10gb",), gpus_per_node=1, gpu_models=("A100-mig-1g.10gb",))
    )

    job = cluster.job("gpufed-ml", "wl-train-1-e3")
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "1" and "nvidia.com/gpu" not in limits
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchFields"][0]["values"] == ["gpu-m"]


async def test_start_is_idempotent_per_workload_and_epoch(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch())
    await runtime.start(launch())

    assert len(cluster.requests("post", "/jobs")) == 1
    assert len(cluster.jobs()) == 1


async def test_unusual_workload_ids_make_valid_distinct_job_names() -> None:
    plain = job_name_for("wl-1", 2)
    upper = job_name_for("WL_1", 2)
    long = job_name_for("a" * 63, 12)

    assert plain == "wl-1-e2"
    assert upper != plain and upper.endswith("-e2") and upper == upper.lower()
    assert len(long) <= 63 and long.endswith("-e12")


async def test_unmapped_priority_class_runs_without_one(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch(priority_class="research"))

    job = cluster.job("gpufed-ml", "wl-train-1-e3")
    assert job is not None
    assert "priorityClassName" not in job["spec"]["template"]["spec"]


async def test_fractional_gpu_is_refused_with_a_reason(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    with pytest.raises(PermanentSpokeError, match="fractional GPUs"):
        await runtime.start(launch(gpus_per_node=1, gpu_fraction=0.5))

    assert cluster.jobs() == []
    assert runtime.running() == {}


async def test_assignment_count_must_match_the_gang(runtime: KubernetesRuntime) -> None:
    bad = launch(nodes=("gpu-a", "gpu-a"))

    with pytest.raises(PermanentSpokeError, match="distinct node"):
        await runtime.start(bad)


async def test_forbidden_job_create_is_a_permanent_error_naming_rbac(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    (
        cluster.emulator["post /apis/batch/v1/namespaces/gpufed-ml/jobs"]
        << 403
        << {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": 403,
            "reason": "Forbidden",
            "message": 'jobs.batch is forbidden: User "system:serviceaccount:gpufed:gpufed-spoke" '
            'cannot create resource "jobs"',
        }
    )

    with pytest.raises(PermanentSpokeError) as caught:
        await runtime.start(launch())

    text = str(caught.value)
    assert "create job gpufed-ml/wl-train-1-e3" in text
    assert "cannot create resource" in text and "HTTP 403" in text and "RBAC" in text
    assert runtime.running() == {}


async def test_server_error_is_retryable(runtime: KubernetesRuntime, cluster: Cluster) -> None:
    (
        cluster.emulator["post /apis/batch/v1/namespaces/gpufed-ml/jobs"]
        << 500
        << {
            "kind": "Status",
            "code": 500,
            "message": "etcdserver: request timed out",
        }
    )

    with pytest.raises(RetryableSpokeError, match="etcdserver: request timed out"):
        await runtime.start(launch())


async def test_forbidden_namespace_creation_still_uses_an_existing_namespace(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    cluster.emulator.refuse_namespaces = 403  # the strict RBAC variant: namespaces pre-made

    await runtime.start(launch())

    assert cluster.job("gpufed-ml", "wl-train-1-e3") is not None


async def test_unreachable_api_server_is_retryable(events: EventLog) -> None:
    api = k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9"))  # discard port: closed
    runtime = KubernetesRuntime(api, events, SPOKE_ID)
    try:
        with pytest.raises(RetryableSpokeError, match="Kubernetes API unreachable"):
            await runtime.start(launch())
    finally:
        await runtime.close()
        api.close()


async def test_a_job_of_the_same_epoch_already_there_is_taken_as_started(
    runtime: KubernetesRuntime, cluster: Cluster, identity: Any
) -> None:
    # E.g. the previous process created it and died before the command was acknowledged.
    meta = {"name": "wl-train-1-e3", "namespace": "gpufed-ml", **identity("wl-train-1", 3)}
    cluster.put_job({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {}})

    await runtime.start(launch())

    assert runtime.running() == {"wl-train-1": 3}
    assert len(cluster.jobs()) == 1


async def test_a_foreign_job_with_the_same_name_is_not_taken_over(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    meta = {"name": "wl-train-1-e3", "namespace": "gpufed-ml", "labels": {"app": "other"}}
    cluster.put_job({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {}})

    with pytest.raises(PermanentSpokeError, match="did not create"):
        await runtime.start(launch())

    assert runtime.running() == {}
