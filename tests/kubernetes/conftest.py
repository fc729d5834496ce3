"""Fixtures for the Kubernetes inventory and runtime: kmock's Kubernetes API emulator.

The emulator is a real HTTP server on a free 127.0.0.1 port, keeping objects in memory and
serving lists and watches; the official `kubernetes` client talks to it like to a cluster.
It runs in the test's event loop, so everything that calls the blocking client must go through
a worker thread (as the code under test does).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import aiohttp.web
import attrs
import kmock
import pytest
from kubernetes import client as k8s

from schemas import EventPhase
from spoke.fencing import Guard
from spoke.kube import (
    ANNOTATION_WORKLOAD,
    LABEL_EPOCH,
    LABEL_SPOKE,
    LABEL_WORKLOAD,
)
from spoke.ports import RuntimeEvent
from spoke.runtime.kubernetes import KubernetesRuntime
from tests.support.wait import wait_until

SPOKE_ID = "eu-k8s-1"
JOBS = "batch/v1/jobs"
PODS = "v1/pods"
NODES = "v1/nodes"


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator, plus namespace creation.

    kmock 0.8 parses the path /api/v1/namespaces as "a namespace segment without a name" and
    answers 500 before any reaction can match, so namespace creation is served here.
    """

    namespaces: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    refuse_namespaces: int | None = None  # answer this status to namespace creation

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw.method == "POST" and raw.path.rstrip("/") == "/api/v1/namespaces":
            body = await raw.json()
            name = body["metadata"]["name"]
            if self.refuse_namespaces is not None:
                return _status(self.refuse_namespaces, "refused by the test")
            if name in self.namespaces:
                return _status(409, f'namespaces "{name}" already exists')
            self.namespaces[name] = body
            return aiohttp.web.json_response(body, status=201)
        return await super().__call__(raw)


def _status(code: int, message: str) -> aiohttp.web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return aiohttp.web.json_response(body | {"message": message}, status=code)


class Cluster:
    """What a test does to the emulated cluster, and what it looks at."""

    def __init__(self, emulator: Emulator, url: str) -> None:
        self.emulator = emulator
        self.url = url

    # -- setting up -------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        product: str = "NVIDIA-H100-80GB-HBM3",
        extra_resources: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        ready: bool = True,
        unschedulable: bool = False,
        taints: list[dict[str, str]] | None = None,
    ) -> None:
        allocatable = {"cpu": "64", "memory": "512Gi"}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        allocatable |= extra_resources or {}
        node_labels = {"kubernetes.io/hostname": name}
        if product:
            node_labels["nvidia.com/gpu.product"] = product
        node_labels |= labels or {}
        spec: dict[str, Any] = {"unschedulable": True} if unschedulable else {}
        if taints:
            spec["taints"] = taints
        self.emulator.objects[NODES, None, name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": node_labels},
            "spec": spec,
            "status": {
                "allocatable": allocatable,
                "capacity": allocatable,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }

    async def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str | None,
        gpus: int = 0,
        resource: str = "nvidia.com/gpu",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        phase: str = "Running",
    ) -> None:
        """Create a pod through the API (so watches see it)."""
        container: dict[str, Any] = {"name": "workload", "image": "busybox"}
        if gpus:
            container["resources"] = {"limits": {resource: str(gpus)}}
        spec: dict[str, Any] = {"containers": [container]}
        if node:
            spec["nodeName"] = node
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels or {},
                "annotations": annotations or {},
            },
            "spec": spec,
            "status": {"phase": phase},
        }
        await self._send("post", f"/api/v1/namespaces/{namespace}/pods", body)

    async def add_job_pod(
        self, job: dict[str, Any], name: str, node: str, phase: str = "Pending"
    ) -> None:
        """The pod the Job controller would create for `job` (kmock runs no controllers)."""
        template = job["spec"]["template"]
        await self.add_pod(
            job["metadata"]["namespace"],
            name,
            node=node,
            labels=dict(template["metadata"]["labels"]),
            annotations=dict(template["metadata"]["annotations"]),
            phase=phase,
        )

    async def set_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._send(
            "patch", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status}
        )

    async def set_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._send(
            "patch", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status", {"status": status}
        )

    async def delete_job(self, namespace: str, name: str) -> None:
        await self._send("delete", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}", None)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None) -> None:
        async with self.emulator.request(method, path, json=body) as response:
            text = await response.text()
            assert response.status < 300, f"{method} {path}: {response.status} {text}"

    # -- looking ----------------------------------------------------------------------------

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored Job, or None when it does not exist (never created, or deleted)."""
        if (kmock.resource(JOBS), namespace, name) not in self.emulator.objects:
            return None
        stored = self.emulator.objects[JOBS, namespace, name]
        return None if stored.deleted else json.loads(json.dumps(stored.raw))

    def jobs(self) -> list[dict[str, Any]]:
        return [
            json.loads(json.dumps(obj.raw))
            for (resource, _, _), obj in self.emulator.objects.items()
            if resource == JOBS and not obj.deleted
        ]

    def pod_exists(self, namespace: str, name: str) -> bool:
        key = (kmock.resource(PODS), namespace, name)
        return key in self.emulator.objects and not self.emulator.objects[key].deleted

    async def eventually(self, predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
        """Wait until `predicate()` holds; fail the test after `limit_s` seconds."""
        await wait_until(predicate, limit_s)

    def requests(self, method: str, path_part: str) -> list[kmock.Request]:
        return [
            request
            for request in self.emulator
            if request.method.value == method.upper() and path_part in str(request.url.path)
        ]

    def put_job(self, job: dict[str, Any]) -> None:
        """Store a Job directly (as if made before the spoke started)."""
        meta = job["metadata"]
        self.emulator.objects[JOBS, meta["namespace"], meta["name"]] = job


class EventLog:
    """The runtime's EventSink: keeps every event, lets a test wait for some."""

    def __init__(self) -> None:
        self.events: list[RuntimeEvent] = []

    async def __call__(self, event: RuntimeEvent) -> None:
        self.events.append(event)

    def phases(self, workload_id: str | None = None) -> list[tuple[str, int, EventPhase]]:
        return [
            (e.workload_id, e.epoch, e.phase)
            for e in self.events
            if workload_id is None or e.workload_id == workload_id
        ]

    def terminal(self, workload_id: str) -> list[RuntimeEvent]:
        return [
            e
            for e in self.events
            if e.workload_id == workload_id and e.phase is not EventPhase.RUNNING
        ]

    async def wait_for(
        self, count: int, workload_id: str | None = None, limit_s: float = 5.0
    ) -> None:
        """Wait until at least `count` events (of `workload_id`) arrived."""
        await wait_until(lambda: len(self.phases(workload_id)) >= count, limit_s)


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator() as emu, kmock.Server(emu, host="127.0.0.1"):
        # Declared so that lists and watches of a resource with no objects yet answer empty.
        emu.resources[JOBS] = kmock.ResourceInfo(namespaced=True, kind="Job")
        emu.resources[PODS] = kmock.ResourceInfo(namespaced=True, kind="Pod")
        emu.resources[NODES] = kmock.ResourceInfo(namespaced=False, kind="Node")
        yield emu


@pytest.fixture
def cluster(emulator: Emulator) -> Cluster:
    return Cluster(emulator, str(emulator.url).rstrip("/"))


@pytest.fixture
def api_client(cluster: Cluster) -> Iterator[k8s.ApiClient]:
    configuration = k8s.Configuration(host=cluster.url)
    api = k8s.ApiClient(configuration)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def events() -> EventLog:
    return EventLog()


class MakeRuntime(Protocol):
    """Builds a runtime for this spoke around an event log (several per test for restarts),
    with the spoke's fence rule when given one."""

    def __call__(self, sink: EventLog, guard: Guard | None = None) -> KubernetesRuntime: ...


#: Labels and annotations that make a hand-made object one of this spoke's.
Identity = Callable[[str, int], dict[str, Any]]


@pytest.fixture
async def make_runtime(api_client: k8s.ApiClient) -> AsyncIterator[MakeRuntime]:
    """Build runtimes for this spoke (several for restart tests); all closed at the end."""
    made: list[KubernetesRuntime] = []

    def make(sink: EventLog, guard: Guard | None = None) -> KubernetesRuntime:
        runtime = KubernetesRuntime(api_client, sink, SPOKE_ID, guard=guard)
        made.append(runtime)
        return runtime

    try:
        yield make
    finally:
        for runtime in made:
            await runtime.close()


@pytest.fixture
async def runtime(make_runtime: MakeRuntime, events: EventLog) -> KubernetesRuntime:
    """A runtime that has adopted (nothing) and watches."""
    built = make_runtime(events)
    await built.adopt()
    return built


@pytest.fixture
def identity() -> Identity:
    """Labels and annotations that make an object one of this spoke's (for hand-made Jobs)."""

    def make(workload_id: str, epoch: int) -> dict[str, Any]:
        return {
            "labels": {LABEL_WORKLOAD: workload_id, LABEL_EPOCH: str(epoch), LABEL_SPOKE: SPOKE_ID},
            "annotations": {ANNOTATION_WORKLOAD: workload_id},
        }

    return make
