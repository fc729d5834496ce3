"""GPU inventory read from a Kubernetes cluster's nodes and pods.

One NodeInventory per GPU node for its whole `nvidia.com/gpu` devices, plus one per MIG profile
the node advertises (`nvidia.com/mig-1g.10gb` etc.): MIG slices are separate schedulable
resources in Kubernetes, so each profile is its own pool. A MIG pool is named
"<node>/mig-<profile>" and its GPU model is "<model>-mig-<profile>" (e.g. "A100-mig-1g.10gb"); a
workload asks for it by that model, and the Kubernetes runtime turns the pool name back into the
host name and the MIG resource. Nodes without GPUs are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from kubernetes import client as k8s

from spoke.inventory.models import short_model
from spoke.kube import (
    GPU_RESOURCE,
    LABEL_GPU_MODEL,
    LABEL_GPU_PRODUCT,
    LABEL_WORKLOAD,
    MIG_RESOURCE_PREFIX,
    MIG_SEPARATOR,
    labels_of,
    matches_selector,
    meta,
    request_json,
)
from spoke.ports import NodeInventory

log = structlog.get_logger(__name__)

#: Taints our pods tolerate (the runtime adds a matching toleration); any other NoSchedule or
#: NoExecute taint makes a node unschedulable for gpufed.
TOLERATED_TAINTS = frozenset({GPU_RESOURCE})
_TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
_MAX_MODEL_LEN = 63


class KubernetesInventory:
    """Inventory from the Kubernetes API: node allocatable GPUs minus what others' pods use.

    `node_selector` (a label selector, e.g. "gpufed.io/pool=shared") limits which nodes this
    spoke offers. `busy_outside` counts GPUs requested by running pods that gpufed did not
    start (no `gpufed.io/workload-id` label); gpufed's own pods are the spoke's to account for.
    """

    def __init__(self, api_client: k8s.ApiClient, node_selector: str | None = None) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._node_selector = node_selector

    async def nodes(self) -> list[NodeInventory]:
        """Current GPU nodes and MIG pools. Raises SpokeError when the API fails."""
        node_list = await request_json(
            "list nodes", self._core.list_node, label_selector=self._node_selector
        )
        # Terminal pods hold nothing; the field selector is a hint, the filter below is the rule.
        pod_list = await request_json(
            "list pods",
            self._core.list_pod_for_all_namespaces,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
        )
        busy = _busy_outside(pod_list.get("items") or [])
        result: list[NodeInventory] = []
        for node in node_list.get("items") or []:
            if matches_selector(labels_of(node), self._node_selector):
                result.extend(_node_inventories(node, busy))
        return result


def _busy_outside(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(node name, resource) -> devices requested by live pods gpufed did not start."""
    busy: dict[tuple[str, str], int] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        node_name = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node_name or phase in _TERMINAL_POD_PHASES or LABEL_WORKLOAD in labels_of(pod):
            continue
        for resource, count in pod_gpu_requests(spec).items():
            busy[(node_name, resource)] = busy.get((node_name, resource), 0) + count
    return busy


def pod_gpu_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """GPU and MIG devices a pod holds, as the scheduler counts them.

    Effective request = max(sum over app containers and sidecars, largest init container).
    """
    total: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for container in pod_spec.get("initContainers") or []:
        requests = _gpu_requests(container)
        if container.get("restartPolicy") == "Always":  # a sidecar runs beside the app
            for resource, count in requests.items():
                total[resource] = total.get(resource, 0) + count
        else:
            for resource, count in requests.items():
                init_max[resource] = max(init_max.get(resource, 0), count)
    for container in pod_spec.get("containers") or []:
        for resource, count in _gpu_requests(container).items():
            total[resource] = total.get(resource, 0) + count
    for resource, count in init_max.items():
        total[resource] = max(total.get(resource, 0), count)
    return {resource: count for resource, count in total.items() if count > 0}


def _gpu_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    # Extended resources: requests equal limits, and limits alone imply the requests.
    merged = dict(resources.get("limits") or {}) | dict(resources.get("requests") or {})
    return {
        name: _quantity(value)
        for name, value in merged.items()
        if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)
    }


def _node_inventories(
    node: Mapping[str, Any], busy: Mapping[tuple[str, str], int]
) -> list[NodeInventory]:
    name = str(meta(node).get("name") or "")
    labels = dict(labels_of(node))
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    schedulable, why = _schedulable(node)
    if not schedulable:
        log.debug("node_unschedulable", node=name, reason=why)
    model = gpu_model(labels)
    result: list[NodeInventory] = []
    whole = _quantity(allocatable.get(GPU_RESOURCE, 0))
    if whole > 0:
        result.append(
            NodeInventory(
                name=name,
                gpu_model=model,
                gpu_count=whole,
                labels=labels,
                schedulable=schedulable,
                busy_outside=min(whole, busy.get((name, GPU_RESOURCE), 0)),
            )
        )
    for resource in sorted(allocatable):
        if not resource.startswith(MIG_RESOURCE_PREFIX):
            continue
        count = _quantity(allocatable[resource])
        if count <= 0:
            continue
        profile = resource.removeprefix("nvidia.com/")  # "mig-1g.10gb"
        result.append(
            NodeInventory(
                name=f"{name}{MIG_SEPARATOR}{profile}",
                gpu_model=_mig_model(model, profile),
                gpu_count=count,
                labels=labels,
                schedulable=schedulable,
                busy_outside=min(count, busy.get((name, resource), 0)),
            )
        )
    return result


def gpu_model(labels: Mapping[str, str]) -> str:
    """A node's GPU model: `gpufed.io/gpu-model` if the platform team set it, else the short
    name of GPU feature discovery's `nvidia.com/gpu.product` ("NVIDIA-H100-80GB-HBM3" -> "H100",
    as users ask for it), else "unknown"."""
    if labels.get(LABEL_GPU_MODEL):
        return labels[LABEL_GPU_MODEL]
    product = labels.get(LABEL_GPU_PRODUCT)
    return short_model(product) if product else "unknown"


def _mig_model(model: str, profile: str) -> str:
    # With the "single" MIG strategy GFD already appends the profile to the product name.
    suffix = profile.removeprefix("mig-")
    if model.lower().endswith(suffix.lower()):
        return model[:_MAX_MODEL_LEN]
    return f"{model[: _MAX_MODEL_LEN - len(profile) - 1]}-{profile}"


def _schedulable(node: Mapping[str, Any]) -> tuple[bool, str]:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False, "cordoned"
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        return False, "not ready"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and (
            taint.get("key") not in TOLERATED_TAINTS
        ):
            return False, f"taint {taint.get('key')}"
    return True, ""


def _quantity(value: Any) -> int:
    """Device counts are plain integers ("8"); anything else counts as none."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        log.warning("gpu_quantity_unparsed", value=str(value))
        return 0
