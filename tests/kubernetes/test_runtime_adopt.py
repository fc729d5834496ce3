"""A restarted spoke takes its Jobs back; stale epochs are fenced off."""

from __future__ import annotations

import pytest

from schemas import EventPhase
from tests.kubernetes.conftest import Cluster, EventLog, Identity, MakeRuntime
from tests.kubernetes.test_runtime_events import NS, running_status, terminated_status
from tests.kubernetes.test_runtime_jobs import launch


async def test_new_runtime_adopts_running_jobs_and_reports_those_finished_meanwhile(
    make_runtime: MakeRuntime, cluster: Cluster
) -> None:
    first_events = EventLog()
    first = make_runtime(first_events)
    assert await first.adopt() == {}
    await first.start(launch(workload_id="keeps-running", epoch=2))
    await first.start(launch(workload_id="ends-meanwhile", epoch=5))
    await first.close()  # the spoke process goes away; its Jobs do not
    ended = cluster.job(NS, "ends-meanwhile-e5")
    assert ended is not None
    await cluster.add_job_pod(ended, "ends-meanwhile-e5-0-abcde", "gpu-b")
    await cluster.set_pod_status(NS, "ends-meanwhile-e5-0-abcde", terminated_status(0, "Completed"))
    await cluster.set_job_status(
        NS, "ends-meanwhile-e5", {"conditions": [{"type": "Complete", "status": "True"}]}
    )

    second_events = EventLog()
    second = make_runtime(second_events)
    adopted = await second.adopt()

    assert adopted == {"keeps-running": 2}
    assert second.running() == {"keeps-running": 2}
    assert second_events.phases("ends-meanwhile") == [
        ("ends-meanwhile", 5, EventPhase.RUNNING),
        ("ends-meanwhile", 5, EventPhase.SUCCEEDED),
    ]
    # The adopted one is watched again: its pod starting is reported by the new process.
    running = cluster.job(NS, "keeps-running-e2")
    assert running is not None
    await cluster.add_job_pod(running, "keeps-running-e2-0-fghij", "gpu-a")
    await cluster.set_pod_status(NS, "keeps-running-e2-0-fghij", running_status())
    await second_events.wait_for(1, "keeps-running")
    await second.close()

    third_events = EventLog()
    third = make_runtime(third_events)
    assert await third.adopt() == {"keeps-running": 2}
    assert third_events.terminal("ends-meanwhile") == [], "a finished Job is reported once"


async def test_adoption_deletes_an_older_epoch_left_beside_a_newer_one(
    make_runtime: MakeRuntime, cluster: Cluster, identity: Identity
) -> None:
    for epoch in (1, 2):
        cluster.put_job(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"wl-9-e{epoch}", "namespace": NS, **identity("wl-9", epoch)},
                "spec": {"completions": 1},
            }
        )
    events = EventLog()
    runtime = make_runtime(events)

    assert await runtime.adopt() == {"wl-9": 2}
    assert cluster.job(NS, "wl-9-e1") is None
    assert cluster.job(NS, "wl-9-e2") is not None
    assert events.events == []


async def test_fence_deletes_the_stale_epoch_job_and_ends_it_cancelled(
    make_runtime: MakeRuntime, cluster: Cluster
) -> None:
    events = EventLog()
    runtime = make_runtime(events)
    await runtime.adopt()
    await runtime.start(launch(workload_id="moved", epoch=1))
    stale = cluster.job(NS, "moved-e1")
    assert stale is not None
    await cluster.add_job_pod(stale, "moved-e1-0-abcde", "gpu-a", phase="Running")
    await events.wait_for(1)

    deleted = await runtime.fence("moved", 2)

    assert deleted == 1
    assert cluster.job(NS, "moved-e1") is None
    assert not cluster.pod_exists(NS, "moved-e1-0-abcde")
    [cancelled] = events.terminal("moved")
    assert (cancelled.epoch, cancelled.phase, cancelled.reason) == (
        1,
        EventPhase.CANCELLED,
        "StaleEpoch",
    )
    assert await runtime.fence("moved", 2) == 0, "fencing again finds nothing"


async def test_starting_a_newer_epoch_fences_the_older_one(
    make_runtime: MakeRuntime, cluster: Cluster
) -> None:
    events = EventLog()
    runtime = make_runtime(events)
    await runtime.adopt()
    await runtime.start(launch(workload_id="moved", epoch=1))

    await runtime.start(launch(workload_id="moved", epoch=2))

    assert cluster.job(NS, "moved-e1") is None
    assert cluster.job(NS, "moved-e2") is not None
    assert runtime.running() == {"moved": 2}
    assert events.phases("moved") == [("moved", 1, EventPhase.CANCELLED)]


async def test_an_older_epoch_than_the_running_one_is_refused(make_runtime: MakeRuntime) -> None:
    from spoke.errors import PermanentSpokeError

    runtime = make_runtime(EventLog())
    await runtime.adopt()
    await runtime.start(launch(workload_id="moved", epoch=4))

    with pytest.raises(PermanentSpokeError, match="older than the running epoch 4"):
        await runtime.start(launch(workload_id="moved", epoch=3))
