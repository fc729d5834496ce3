"""Job and pod status changes become RuntimeEvents: in order, one terminal each."""

from __future__ import annotations

from typing import Any

from schemas import EventPhase
from spoke.runtime.kubernetes import KubernetesRuntime
from tests.kubernetes.conftest import Cluster, EventLog, MakeRuntime
from tests.kubernetes.test_runtime_jobs import launch

NS = "gpufed-ml"
JOB = "wl-train-1-e3"
RUNNING = EventPhase.RUNNING


def running_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "containerStatuses": [{"name": "workload", "state": {"running": {"startedAt": "now"}}}],
    }


def terminated_status(exit_code: int, reason: str) -> dict[str, Any]:
    state = {"terminated": {"exitCode": exit_code, "reason": reason, "message": "bye"}}
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [{"name": "workload", "state": state}],
    }


async def started(runtime: KubernetesRuntime, cluster: Cluster, **spec: Any) -> dict[str, Any]:
    await runtime.start(launch(**spec))
    job = cluster.job(NS, JOB)
    assert job is not None
    return job


async def settle(runtime: KubernetesRuntime, cluster: Cluster, events: EventLog) -> None:
    """Let every change made so far reach the runtime: a sentinel workload's pod must run."""
    before = len(events.events)
    await runtime.start(launch(workload_id="sentinel", epoch=1))
    sentinel = cluster.job(NS, "sentinel-e1")
    assert sentinel is not None
    await cluster.add_job_pod(sentinel, "sentinel-pod", "gpu-z", phase="Running")
    await events.wait_for(1, "sentinel")
    assert len(events.events) >= before + 1


async def test_pod_running_then_job_complete_reports_running_then_succeeded_once(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster)
    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a")
    await cluster.set_pod_status(NS, "wl-train-1-e3-0-abcde", running_status())
    await events.wait_for(1)

    await cluster.set_pod_status(NS, "wl-train-1-e3-0-abcde", terminated_status(0, "Completed"))
    await cluster.set_job_status(
        NS, JOB, {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    )
    await events.wait_for(2)
    await settle(runtime, cluster, events)

    assert events.phases("wl-train-1") == [
        ("wl-train-1", 3, RUNNING),
        ("wl-train-1", 3, EventPhase.SUCCEEDED),
    ]
    assert events.terminal("wl-train-1")[0].exit_code == 0
    assert "wl-train-1" not in runtime.running()
    finished = cluster.job(NS, JOB)
    assert finished is not None
    assert finished["metadata"]["annotations"]["gpufed.io/reported"] == "succeeded"


async def test_oom_killed_pod_reports_failed_with_reason_and_exit_code(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster)
    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a", phase="Running")
    await events.wait_for(1)

    await cluster.set_pod_status(NS, "wl-train-1-e3-0-abcde", terminated_status(137, "OOMKilled"))
    await cluster.set_job_status(
        NS,
        JOB,
        {
            "failed": 1,
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
        },
    )
    await events.wait_for(2)
    await settle(runtime, cluster, events)

    assert events.phases("wl-train-1") == [
        ("wl-train-1", 3, RUNNING),
        ("wl-train-1", 3, EventPhase.FAILED),
    ]
    [failed] = events.terminal("wl-train-1")
    assert (failed.reason, failed.exit_code) == ("OOMKilled", 137)


async def test_failed_job_seen_first_still_reports_the_pods_reason(
    make_runtime: MakeRuntime, cluster: Cluster, events: EventLog
) -> None:
    runtime = make_runtime(events)
    await runtime.adopt()
    job = await started(runtime, cluster)
    await runtime.close()  # the watch is away while both change
    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a")
    await cluster.set_pod_status(NS, "wl-train-1-e3-0-abcde", terminated_status(137, "OOMKilled"))
    await cluster.set_job_status(
        NS,
        JOB,
        {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]},
    )

    later = make_runtime(events)
    assert await later.adopt() == {}

    [failed] = events.terminal("wl-train-1")
    assert (failed.phase, failed.reason, failed.exit_code) == (EventPhase.FAILED, "OOMKilled", 137)


async def test_image_pull_backoff_fails_the_workload_and_frees_the_gpu(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster, image="ghcr.io/acme/typo:1")
    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a")
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "manifest unknown"}}
    await cluster.set_pod_status(
        NS,
        "wl-train-1-e3-0-abcde",
        {"phase": "Pending", "containerStatuses": [{"name": "workload", "state": waiting}]},
    )
    await events.wait_for(1)

    [failed] = events.events
    assert (failed.phase, failed.reason, failed.exit_code) == (
        EventPhase.FAILED,
        "ImagePullBackOff",
        None,
    )
    assert "manifest unknown" in failed.message
    await cluster.eventually(lambda: cluster.job(NS, JOB) is None)
    await cluster.eventually(lambda: not cluster.pod_exists(NS, "wl-train-1-e3-0-abcde"))
    await settle(runtime, cluster, events)
    assert len(events.phases("wl-train-1")) == 1, "the Job's deletion is not a second event"


async def test_deadline_exceeded_reports_failed_with_that_reason(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster)
    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a", phase="Running")
    await events.wait_for(1)

    await cluster.set_job_status(
        NS,
        JOB,
        {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]},
    )
    await events.wait_for(2)

    [failed] = events.terminal("wl-train-1")
    assert (failed.phase, failed.reason) == (EventPhase.FAILED, "DeadlineExceeded")


async def test_gang_reports_running_only_once_every_pod_runs(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster, nodes=("gpu-a", "gpu-b"))
    await cluster.add_job_pod(job, "wl-train-1-e3-0-aaaaa", "gpu-a", phase="Running")
    await cluster.add_job_pod(job, "wl-train-1-e3-1-bbbbb", "gpu-b", phase="Pending")
    await settle(runtime, cluster, events)
    assert events.phases("wl-train-1") == [], "half a gang is not running"

    await cluster.set_pod_status(NS, "wl-train-1-e3-1-bbbbb", running_status())
    await events.wait_for(1, "wl-train-1")

    assert events.phases("wl-train-1") == [("wl-train-1", 3, RUNNING)]


async def test_evicted_pod_reports_preempted(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster)
    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a", phase="Running")
    await events.wait_for(1)

    await cluster.set_pod_status(
        NS,
        "wl-train-1-e3-0-abcde",
        {
            "phase": "Failed",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ],
        },
    )
    await events.wait_for(2)

    [preempted] = events.terminal("wl-train-1")
    assert (preempted.phase, preempted.reason) == (EventPhase.PREEMPTED, "PreemptionByScheduler")


async def test_cancel_deletes_job_and_pods_with_grace_and_reports_once(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster)
    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a", phase="Running")
    await events.wait_for(1)

    await runtime.stop("wl-train-1", 12.0, EventPhase.CANCELLED)
    await runtime.stop("wl-train-1", 12.0, EventPhase.CANCELLED)

    assert cluster.job(NS, JOB) is None
    assert not cluster.pod_exists(NS, "wl-train-1-e3-0-abcde")
    [pod_delete] = cluster.requests("delete", "/pods/wl-train-1-e3-0-abcde")
    assert pod_delete.params.get("gracePeriodSeconds") == "12"
    [job_delete] = cluster.requests("delete", f"/jobs/{JOB}")
    assert job_delete.params.get("propagationPolicy") == "Background"
    await settle(runtime, cluster, events)
    assert events.phases("wl-train-1") == [
        ("wl-train-1", 3, RUNNING),
        ("wl-train-1", 3, EventPhase.CANCELLED),
    ]
    assert runtime.running() == {"sentinel": 1}


async def test_stopping_an_unknown_workload_is_a_no_op(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    await runtime.stop("never-started", 5.0, EventPhase.PREEMPTED)

    assert events.events == []
    assert cluster.requests("delete", "/") == []


async def test_job_deleted_outside_gpufed_reports_failed(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    await started(runtime, cluster)
    await runtime.start(launch(workload_id="sentinel", epoch=1))  # so the Job has been seen
    sentinel = cluster.job(NS, "sentinel-e1")
    assert sentinel is not None
    await cluster.add_job_pod(sentinel, "sentinel-pod", "gpu-z", phase="Running")
    await events.wait_for(1, "sentinel")

    await cluster.delete_job(NS, JOB)
    await events.wait_for(1, "wl-train-1")

    [failed] = events.terminal("wl-train-1")
    assert (failed.phase, failed.reason) == (EventPhase.FAILED, "JobDeleted")


async def test_watch_relists_after_410_gone_and_keeps_reporting(
    make_runtime: MakeRuntime, cluster: Cluster, events: EventLog
) -> None:
    gone: list[object] = []

    def expire_first_watch(request: object) -> object:
        if gone:
            return NotImplemented  # later watches reach the emulator
        gone.append(request)
        status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
        return ({"type": "ERROR", "object": status},)

    cluster.emulator["watch batch/v1/jobs"] << expire_first_watch
    runtime = make_runtime(events)
    await runtime.adopt()
    await started(runtime, cluster)

    await cluster.set_job_status(NS, JOB, {"conditions": [{"type": "Complete", "status": "True"}]})
    await events.wait_for(2)

    assert gone, "the first watch expired"
    job_lists = [
        r for r in cluster.requests("get", "/apis/batch/v1/jobs") if "watch" not in r.params
    ]
    assert len(job_lists) >= 3, "adopt's list, the first list, and a relist after 410"
    assert events.phases("wl-train-1")[-1] == ("wl-train-1", 3, EventPhase.SUCCEEDED)


async def test_a_session_gets_a_service_whose_url_comes_with_running_and_goes_with_it(
    runtime: KubernetesRuntime, cluster: Cluster, events: EventLog
) -> None:
    job = await started(runtime, cluster, kind="session")
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert (env["GPUFED_HOST"], env["GPUFED_PORT"]) == ("0.0.0.0", "8000")
    [created] = cluster.requests("post", f"/namespaces/{NS}/services")
    service = created.data
    assert service["metadata"]["name"] == JOB
    assert service["spec"]["selector"] == {
        "gpufed.io/workload-id": "wl-train-1",
        "gpufed.io/epoch": "3",
    }

    await cluster.add_job_pod(job, "wl-train-1-e3-0-abcde", "gpu-a", phase="Running")
    await events.wait_for(1)
    [running] = events.events
    assert running.endpoint == f"http://{JOB}.{NS}.svc.cluster.local:8000"

    await runtime.stop("wl-train-1", 1.0, EventPhase.CANCELLED)
    assert cluster.requests("delete", f"/services/{JOB}")
