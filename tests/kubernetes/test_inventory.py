"""What the spoke offers the hub, read from the cluster's nodes and pods."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from spoke.errors import PermanentSpokeError, RetryableSpokeError
from spoke.inventory.kubernetes import KubernetesInventory
from spoke.ports import NodeInventory
from tests.kubernetes.conftest import Cluster

GPUFED_POD = {"gpufed.io/workload-id": "wl-1", "gpufed.io/spoke": "eu-k8s-1"}


async def build_fleet(cluster: Cluster) -> None:
    cluster.add_node(
        "gpu-a",
        labels={
            "topology.kubernetes.io/region": "eu-west",
            "topology.kubernetes.io/zone": "eu-west-1a",
        },
    )
    cluster.add_node("gpu-cordoned", unschedulable=True)
    cluster.add_node("gpu-notready", ready=False)
    cluster.add_node(
        "gpu-tainted", taints=[{"key": "maintenance", "value": "disk", "effect": "NoSchedule"}]
    )
    cluster.add_node(
        "gpu-gputaint",
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    )
    cluster.add_node(
        "gpu-mig",
        gpus=2,
        product="NVIDIA-A100-SXM4-80GB",
        extra_resources={"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "0"},
    )
    cluster.add_node("gpu-relabelled", labels={"gpufed.io/gpu-model": "H100"})
    cluster.add_node("cpu-only", gpus=0, product="")
    # Outside use of gpu-a: 2 running + 1 bound but pending; finished and gpufed pods do not count.
    await cluster.add_pod("research", "notebook", node="gpu-a", gpus=2)
    await cluster.add_pod("research", "starting", node="gpu-a", gpus=1, phase="Pending")
    await cluster.add_pod("research", "done", node="gpu-a", gpus=4, phase="Succeeded")
    await cluster.add_pod("research", "unbound", node=None, gpus=4, phase="Pending")
    await cluster.add_pod("gpufed-ml", "ours", node="gpu-a", gpus=4, labels=GPUFED_POD)
    await cluster.add_pod("infra", "web", node="gpu-a")
    await cluster.add_pod(
        "research", "mig-user", node="gpu-mig", gpus=2, resource="nvidia.com/mig-1g.10gb"
    )


async def test_nodes_report_models_labels_schedulability_and_outside_use(
    cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    await build_fleet(cluster)

    nodes = {n.name: n for n in await KubernetesInventory(api_client).nodes()}

    assert set(nodes) == {
        "gpu-a",
        "gpu-cordoned",
        "gpu-notready",
        "gpu-tainted",
        "gpu-gputaint",
        "gpu-mig",
        "gpu-mig/mig-1g.10gb",
        "gpu-relabelled",
    }, "nodes without GPUs and empty MIG profiles are left out"
    a = nodes["gpu-a"]
    assert (a.gpu_model, a.gpu_count, a.schedulable, a.busy_outside) == (
        "H100",
        8,
        True,
        3,
    )
    assert a.labels["topology.kubernetes.io/region"] == "eu-west"
    assert a.labels["topology.kubernetes.io/zone"] == "eu-west-1a"
    assert not nodes["gpu-cordoned"].schedulable
    assert not nodes["gpu-notready"].schedulable
    assert not nodes["gpu-tainted"].schedulable
    assert nodes["gpu-gputaint"].schedulable, "gpufed pods tolerate the nvidia.com/gpu taint"
    assert nodes["gpu-relabelled"].gpu_model == "H100"
    assert nodes["gpu-mig"] == NodeInventory(
        name="gpu-mig",
        gpu_model="A100",
        gpu_count=2,
        labels=nodes["gpu-mig"].labels,
    )
    mig = nodes["gpu-mig/mig-1g.10gb"]
    assert (mig.gpu_model, mig.gpu_count, mig.busy_outside) == (
        "A100-mig-1g.10gb",
        7,
        2,
    )


async def test_node_selector_limits_the_nodes_offered(
    cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    cluster.add_node("shared-1", labels={"gpufed.io/pool": "shared"})
    cluster.add_node("shared-2", labels={"gpufed.io/pool": "shared"})
    cluster.add_node("reserved-1", labels={"gpufed.io/pool": "reserved"})

    inventory = KubernetesInventory(api_client, node_selector="gpufed.io/pool=shared")

    assert sorted(n.name for n in await inventory.nodes()) == ["shared-1", "shared-2"]


async def test_rbac_refusal_says_what_is_missing(
    cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    (
        cluster.emulator["list v1/nodes"]
        << 403
        << {
            "kind": "Status",
            "code": 403,
            "message": 'nodes is forbidden: User "system:serviceaccount:gpufed:gpufed-spoke" '
            'cannot list resource "nodes" at the cluster scope',
        }
    )

    with pytest.raises(PermanentSpokeError) as caught:
        await KubernetesInventory(api_client).nodes()

    assert 'cannot list resource "nodes"' in str(caught.value)
    assert "list nodes" in str(caught.value) and "RBAC" in str(caught.value)


async def test_api_server_trouble_is_retryable(cluster: Cluster, api_client: k8s.ApiClient) -> None:
    cluster.add_node("gpu-a")
    cluster.emulator["list v1/pods"] << 503 << {"kind": "Status", "code": 503, "message": "busy"}

    with pytest.raises(RetryableSpokeError, match="list pods: busy"):
        await KubernetesInventory(api_client).nodes()


async def test_unreachable_api_server_is_retryable() -> None:
    api = k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9"))
    try:
        with pytest.raises(RetryableSpokeError, match="unreachable"):
            await KubernetesInventory(api).nodes()
    finally:
        api.close()
