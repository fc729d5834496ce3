"""A workload's secret env values reach its pods through a Secret, never through its Job."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s

from schemas import EventPhase
from spoke.errors import PermanentSpokeError
from spoke.runtime.kubernetes import KubernetesRuntime
from spoke.runtime.kubernetes.jobs import SpokeJobs
from tests.kubernetes.conftest import SPOKE_ID, Cluster, EventLog, Identity, MakeRuntime
from tests.kubernetes.test_runtime_jobs import launch

NS = "gpufed-ml"
JOB = "wl-train-1-e3"
TOKEN = "hf_s3cr3t_v4lue"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"


def with_a_secret() -> dict[str, object]:
    return {"env": {"WANDB_MODE": "offline", "HF_TOKEN": TOKEN}, "secret_env": ("HF_TOKEN",)}


async def test_secret_env_values_are_in_a_secret_made_before_the_job_not_in_its_spec(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch(**with_a_secret()))

    job = cluster.job(NS, JOB)
    assert job is not None
    assert TOKEN not in json.dumps(job)  # not in `kubectl describe`, not in the audit log
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": JOB, "key": "HF_TOKEN"}}
    assert env["WANDB_MODE"] == "offline"
    [made] = cluster.requests("post", SECRETS)
    assert made.data["metadata"]["name"] == JOB
    assert made.data["stringData"] == {"HF_TOKEN": TOKEN}  # the secret one only
    # Before the Job: a pod that started without it would fail to start.
    posts = [str(r.url.path) for r in cluster.emulator if r.method.value == "POST"]
    assert posts.index(SECRETS) < posts.index(JOBS)


async def test_a_workload_without_secret_env_gets_no_secret(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    await runtime.start(launch())
    assert cluster.requests("post", SECRETS) == []


async def test_a_refused_job_leaves_no_secret_behind(
    runtime: KubernetesRuntime, cluster: Cluster
) -> None:
    cluster.emulator[f"post {JOBS}"] << 403 << {"kind": "Status", "code": 403, "message": "no"}

    with pytest.raises(PermanentSpokeError):
        await runtime.start(launch(**with_a_secret()))

    assert cluster.requests("delete", f"{SECRETS}/{JOB}")


async def test_the_secret_is_given_to_its_job(
    runtime: KubernetesRuntime, cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    await runtime.start(launch(**with_a_secret()))
    # kmock gives what it creates no uid (the API server does), so the runtime's call that
    # follows a Job's creation is made here, with one.
    jobs = SpokeJobs(k8s.BatchV1Api(api_client), k8s.CoreV1Api(api_client), SPOKE_ID, "gpufed-")

    await jobs.own_secret(NS, JOB, "uid-of-the-job")

    [given] = cluster.requests("patch", f"{SECRETS}/{JOB}")
    assert given.data["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": "uid-of-the-job"}
    ]


async def test_the_secret_goes_once_its_workload_ended(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    await runtime.start(launch(**with_a_secret()))
    assert cluster.requests("delete", f"{SECRETS}/{JOB}") == []

    complete = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    await cluster.set_job_status(NS, JOB, complete)
    await events.wait_for(2, "wl-train-1")  # RUNNING (it ran), SUCCEEDED

    await cluster.eventually(lambda: bool(cluster.requests("delete", f"{SECRETS}/{JOB}")))


async def test_a_restarted_spoke_deletes_the_secret_of_a_job_that_ended_meanwhile(
    make_runtime: MakeRuntime, cluster: Cluster, identity: Identity
) -> None:
    reads = {"secretKeyRef": {"name": JOB, "key": "HF_TOKEN"}}
    container = {"name": "workload", "env": [{"name": "HF_TOKEN", "valueFrom": reads}]}
    meta = {"name": JOB, "namespace": NS, **identity("wl-train-1", 3)}
    complete = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    spec = {"template": {"spec": {"containers": [container]}}}
    cluster.put_job({"kind": "Job", "metadata": meta, "spec": spec, "status": complete})

    events = EventLog()
    await make_runtime(events).adopt()

    assert [e.phase for e in events.terminal("wl-train-1")] == [EventPhase.SUCCEEDED]
    assert cluster.requests("delete", f"{SECRETS}/{JOB}")
