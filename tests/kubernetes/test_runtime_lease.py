"""A fenced Job carries its spoke's lease as its deadline, so it ends with the lease even when
the spoke process stays dead, before the hub runs the work elsewhere (lost_after)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from schemas import EventPhase
from spoke.fencing import Guard
from spoke.runtime.kubernetes import KubernetesRuntime
from tests.kubernetes.conftest import Cluster, EventLog, MakeRuntime
from tests.kubernetes.test_runtime_jobs import launch

NS = "gpufed-ml"
JOB = "wl-train-1-e3"
KEPT_JOB = "wl-kept-1-e1"
LOST_AFTER_S = 11.0
GRACE_S = 2.0
HEARTBEAT_S = 1.0
#: lost_after less the stop grace and three heartbeats (spoke.fencing).
FENCE_AFTER_S = LOST_AFTER_S - GRACE_S - 3 * HEARTBEAT_S


class Lease:
    """The spoke's fence state as its agent writes it when the hub acks a report."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.heard_at = 0.0
        self.lost_after_s = LOST_AFTER_S

    def heard(self, at: float | None = None) -> None:
        self.heard_at = time.time() if at is None else at
        state = {"heard_at": self.heard_at, "lost_after_s": self.lost_after_s, "term": 1}
        self.path.write_text(json.dumps(state))

    @property
    def deadline(self) -> float:
        return self.heard_at + FENCE_AFTER_S


@pytest.fixture
def lease(tmp_path: Path) -> Lease:
    heard = Lease(tmp_path / "fence.json")
    heard.heard()
    return heard


MakeGuarded = Callable[[EventLog], KubernetesRuntime]


@pytest.fixture
def make_guarded(make_runtime: MakeRuntime, lease: Lease) -> MakeGuarded:
    """Runtimes under the spoke's fence rule, its state in `lease`'s file."""
    guard = Guard(lease.path, heartbeat_s=HEARTBEAT_S, stop_grace_s=GRACE_S)
    return lambda sink: make_runtime(sink, guard)


async def start_fenced(runtime: KubernetesRuntime, cluster: Cluster) -> float:
    """Start the fenced workload and give its Job a startTime, as the Job controller does;
    returns that start (unix seconds, whole, as the API has it)."""
    await runtime.adopt()
    await runtime.start(launch(restart_policy="on_failure"))
    started = datetime.now(UTC).replace(microsecond=0)
    await cluster.set_job_status(NS, JOB, {"startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")})
    return started.timestamp()


def deadline_of(cluster: Cluster, name: str = JOB) -> int | None:
    job = cluster.job(NS, name)
    assert job is not None
    seconds = job["spec"].get("activeDeadlineSeconds")
    return None if seconds is None else int(seconds)


async def test_a_fenced_job_carries_the_spokes_lease_and_a_kept_one_does_not(
    make_guarded: MakeGuarded, cluster: Cluster, events: EventLog, lease: Lease
) -> None:
    runtime = make_guarded(events)
    await runtime.adopt()
    before = time.time()
    await runtime.start(launch(restart_policy="on_failure"))
    await runtime.start(launch(workload_id="wl-kept-1", epoch=1, on_hub_loss="keep"))

    fenced = cluster.job(NS, JOB)
    assert fenced is not None
    seconds = deadline_of(cluster)
    assert seconds is not None
    # Created a moment after `before`: it must end by the spoke's own deadline, not later.
    assert before + seconds <= lease.deadline
    assert seconds >= FENCE_AFTER_S - 2
    assert fenced["metadata"]["annotations"]["gpufed.io/fenced"] == "true"
    assert fenced["metadata"]["annotations"]["gpufed.io/max-runtime-s"] == "7200"
    # Its pods stop within the spoke's stop grace (not the cluster's default 30 s).
    assert fenced["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 2

    kept = cluster.job(NS, KEPT_JOB)
    assert kept is not None
    assert deadline_of(cluster, KEPT_JOB) == 7200  # its max runtime only
    assert "gpufed.io/fenced" not in kept["metadata"]["annotations"]
    assert "terminationGracePeriodSeconds" not in kept["spec"]["template"]["spec"]


async def test_the_deadline_moves_on_while_the_hub_is_heard_and_not_once_the_spoke_is_gone(
    make_guarded: MakeGuarded, cluster: Cluster, events: EventLog, lease: Lease
) -> None:
    runtime = make_guarded(events)
    started = await start_fenced(runtime, cluster)
    first = deadline_of(cluster)
    assert first is not None

    # The hub acks the spoke's reports every heartbeat for a while: the Job's deadline moves
    # on, always ahead of now and never past the spoke's own deadline.
    for _ in range(12):
        lease.heard()
        await anyio.sleep(0.5)
        seconds = deadline_of(cluster)
        assert seconds is not None
        assert time.time() < started + seconds <= lease.deadline
    moved = deadline_of(cluster)
    assert moved is not None and moved > first

    # The spoke process goes (its runtime closes): the acks it would get move nothing, and
    # the Job ends at the latest at that deadline, before the hub's lost_after.
    await runtime.close()
    last_heard = lease.heard_at
    for _ in range(8):
        await anyio.sleep(0.5)
    assert deadline_of(cluster) == moved
    assert started + moved < last_heard + LOST_AFTER_S - GRACE_S

    # A spoke that comes back adopts the Job and moves its deadline on again.
    again = make_guarded(EventLog())
    assert await again.adopt() == {"wl-train-1": 3}
    for _ in range(8):
        lease.heard()
        await anyio.sleep(0.5)
    renewed = deadline_of(cluster)
    assert renewed is not None and renewed > moved
    assert started + renewed <= lease.deadline


async def test_a_lease_that_comes_closer_lowers_the_deadline_at_once(
    make_guarded: MakeGuarded, cluster: Cluster, events: EventLog, lease: Lease
) -> None:
    runtime = make_guarded(events)
    started = await start_fenced(runtime, cluster)
    # As if the last ack were older than the spoke thought (a hub that lowered lost_after
    # gives the same): the deadline comes 3 s closer, and the Job's follows within a check.
    lease.heard(lease.heard_at - 3)
    await cluster.eventually(
        lambda: started + (deadline_of(cluster) or 0) <= lease.deadline, limit_s=3
    )


async def test_a_job_its_lease_stopped_is_preempted_as_fenced_and_one_past_max_runtime_failed(
    make_guarded: MakeGuarded, cluster: Cluster, events: EventLog, lease: Lease
) -> None:
    runtime = make_guarded(events)
    await start_fenced(runtime, cluster)
    await runtime.start(launch(workload_id="wl-kept-1", epoch=1, on_hub_loss="keep"))
    exceeded = {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}

    await cluster.set_job_status(NS, JOB, exceeded)
    await cluster.set_job_status(NS, KEPT_JOB, exceeded)
    await events.wait_for(1, "wl-train-1")
    await events.wait_for(1, "wl-kept-1")

    [fenced] = events.terminal("wl-train-1")
    assert (fenced.phase, fenced.reason) == (EventPhase.PREEMPTED, "fenced")
    assert "fence_after" in fenced.message
    [kept] = events.terminal("wl-kept-1")
    assert (kept.phase, kept.reason) == (EventPhase.FAILED, "DeadlineExceeded")


async def test_a_lease_too_short_for_whole_seconds_is_left_to_the_living_spoke(
    make_guarded: MakeGuarded, cluster: Cluster, events: EventLog, lease: Lease
) -> None:
    # lost_after 4 s: fence_after 1 s, which a Job's deadline (whole seconds, looked at every
    # second) cannot follow without ending it while the hub is heard.
    lease.lost_after_s = 4.0
    lease.heard()
    runtime = make_guarded(events)
    await runtime.adopt()
    await runtime.start(launch(restart_policy="on_failure"))
    for _ in range(6):
        lease.heard()
        await anyio.sleep(0.5)
    assert deadline_of(cluster) == 7200  # its max runtime only


async def test_a_job_taken_over_at_start_gets_the_lease_it_should_have(
    make_guarded: MakeGuarded, cluster: Cluster, events: EventLog, lease: Lease, identity: Any
) -> None:
    runtime = make_guarded(events)
    await runtime.adopt()
    # A create that timed out but landed (under a longer lease then): the same Place again
    # finds the Job there.
    meta = {"name": JOB, "namespace": NS, **identity("wl-train-1", 3)}
    meta["annotations"]["gpufed.io/fenced"] = "true"
    started = float(int(time.time()))
    status = {"startTime": datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    spec = {"activeDeadlineSeconds": 9999}
    cluster.put_job({"kind": "Job", "metadata": meta, "spec": spec, "status": status})

    await runtime.start(launch(restart_policy="on_failure"))

    await cluster.eventually(
        lambda: started + (deadline_of(cluster) or 10_000) <= lease.deadline, limit_s=3
    )
